"""Hand-built frames for the datapath unit tests (no scapy): the header
builders, and the frames of the one-peer test configuration (unit_dp) that
every test module sends: overlay packets into mrc_tx, MRC frames from the
peer into mrc_rx."""

from __future__ import annotations

import socket
import struct

from unit_dp import (LOCAL_OVERLAY, LOCAL_OVERLAY6, OUR_MAC, OVL_DMAC, OVL_SMAC, PATHS, PEER_MAC,
                     PEER_OVERLAY, PEER_OVERLAY6, UDP_PORT)
from mrcctl.datapath import abi as wire

ETH_P_IP = 0x0800
ETH_P_IPV6 = 0x86DD
ETH_P_ARP = 0x0806
ETH_P_8021Q = 0x8100
IPPROTO_TCP = 6
IPPROTO_UDP = 17
IPPROTO_ICMPV6 = 58
IPV6_FRAGMENT = 44


def eth(dst: str, src: str, ethertype: int) -> bytes:
    return wire.mac_bytes(dst) + wire.mac_bytes(src) + struct.pack("!H", ethertype)


def ipv4(src: str, dst: str, proto: int, payload: bytes, *, ttl: int = 64, ident: int = 0,
         df: bool = True, mf: bool = False, frag_off: int = 0, tos: int = 0,
         options: bytes = b"", tot_len: int | None = None) -> bytes:
    assert len(options) % 4 == 0
    ihl = 5 + len(options) // 4
    flags = (0x4000 if df else 0) | (0x2000 if mf else 0) | (frag_off & 0x1FFF)
    total = tot_len if tot_len is not None else ihl * 4 + len(payload)
    hdr = struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, tos, total, ident, flags, ttl, proto, 0,
                      socket.inet_aton(src), socket.inet_aton(dst)) + options
    c = wire.inet_csum(hdr)
    return hdr[:10] + struct.pack("!H", c) + hdr[12:] + payload


def ipv6(src: str, dst: str, nh: int, payload: bytes, *, hlim: int = 64, flow: int = 0,
         tc: int = 0, plen: int | None = None) -> bytes:
    first = (6 << 28) | (tc << 20) | (flow & 0xFFFFF)
    return struct.pack("!IHBB16s16s", first, len(payload) if plen is None else plen, nh, hlim,
                       socket.inet_pton(socket.AF_INET6, src),
                       socket.inet_pton(socket.AF_INET6, dst)) + payload


def udp(sport: int, dport: int, payload: bytes, *, length: int | None = None,
        check: int = 0) -> bytes:
    return struct.pack("!HHHH", sport, dport, 8 + len(payload) if length is None else length,
                       check) + payload


def tcp(sport: int, dport: int, seq: int, payload: bytes = b"", *, ack: int = 0,
        flags: int = 0x18, window: int = 65535) -> bytes:
    return struct.pack("!HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, ack, 5 << 4, flags,
                       window, 0, 0) + payload


def vlan(dst: str, src: str, vid: int, ethertype: int) -> bytes:
    return (wire.mac_bytes(dst) + wire.mac_bytes(src)
            + struct.pack("!HHH", ETH_P_8021Q, vid & 0xFFF, ethertype))


def ip6_frag(nh: int, offset: int = 0, more: bool = True, ident: int = 1) -> bytes:
    return struct.pack("!BBHI", nh, 0, (offset << 3) | (1 if more else 0), ident)


# --- frames of the one-peer configuration -----------------------------------

def overlay(body: bytes, proto: int = IPPROTO_UDP, *, dst: str = PEER_OVERLAY,
            ethertype: int = ETH_P_IP, tos: int = 0, ident: int = 0) -> bytes:
    """An overlay frame from us (mrc0) to the peer, as mrc_tx sees it."""
    if ethertype != ETH_P_IP:
        return eth(OVL_DMAC, OVL_SMAC, ethertype) + body
    return eth(OVL_DMAC, OVL_SMAC, ETH_P_IP) + ipv4(LOCAL_OVERLAY, dst, proto, body, tos=tos,
                                                     ident=ident)


def overlay6(body: bytes, proto: int = IPPROTO_UDP, *, dst: str = PEER_OVERLAY6, tc: int = 0,
             src: str = LOCAL_OVERLAY6) -> bytes:
    """An inner IPv6 overlay frame from us (mrc0) to the peer, as mrc_tx sees it."""
    return eth(OVL_DMAC, OVL_SMAC, ETH_P_IPV6) + ipv6(src, dst, proto, body, tc=tc)


def inner_ip6(payload_len: int = 100, proto: int = IPPROTO_UDP, seq: int = 0,
              src: str = PEER_OVERLAY6, dst: str = LOCAL_OVERLAY6) -> bytes:
    """An overlay IPv6 packet from the peer to us (what mrc_rx delivers)."""
    if proto == IPPROTO_TCP:
        body = tcp(5201, 40001, seq, b"y" * payload_len)
    else:
        body = udp(5201, 40000, bytes(range(256))[:payload_len])
    return ipv6(src, dst, proto, body)


def inner_ip(payload_len: int = 100, proto: int = IPPROTO_UDP, seq: int = 0) -> bytes:
    """An overlay IPv4 packet from the peer to us (what mrc_rx delivers)."""
    if proto == IPPROTO_TCP:
        body = tcp(5201, 40001, seq, b"y" * payload_len)
    else:
        body = udp(5201, 40000, bytes(range(256))[:payload_len])
    return ipv4(PEER_OVERLAY, LOCAL_OVERLAY, proto, body, ident=77)


def mrc_frame(family: int = 4, *, src: str | None = None, dst: str | None = None,
              inner: bytes | None = None, sport: int = 49152, dport: int = UDP_PORT,
              hdr: bytes | None = None, ip_kw: dict | None = None, udp_len: int | None = None,
              **hdr_kw) -> bytes:
    """An MRC frame as the peer would send it to us on the plane of the
    path it names (path_id, default 0 for IPv4 and 1 for IPv6): plane 0
    (IPv4), plane 1 (IPv6) or plane 2 (IPv4, path 3); a path id of no path
    of that family keeps plane 0 / plane 1. hdr_kw go to
    wire.encode_mrc_hdr unless hdr is given."""
    if inner is None:
        inner = inner_ip()
    if hdr is None:
        hdr_kw.setdefault("path_id", 0 if family == 4 else 1)
        hdr = wire.encode_mrc_hdr(**hdr_kw)
    pid = wire.decode_mrc_hdr(hdr[:wire.MRC_HDR_LEN]).path_id if len(hdr) >= wire.MRC_HDR_LEN else 0
    plane = PATHS[0] if family == 4 else PATHS[1]
    if pid < len(PATHS) and PATHS[pid].family == family:
        plane = PATHS[pid]
    payload = udp(sport, dport, hdr + inner, length=udp_len)
    ip_kw = ip_kw or {}
    if family == 4:
        return eth(OUR_MAC, PEER_MAC, ETH_P_IP) + ipv4(
            src or plane.daddr, dst or plane.saddr, IPPROTO_UDP, payload, **ip_kw)
    return eth(OUR_MAC, PEER_MAC, ETH_P_IPV6) + ipv6(
        src or plane.daddr, dst or plane.saddr, IPPROTO_UDP, payload, **ip_kw)


def mrc_hdr_of(out: bytes) -> wire.MrcHdr:
    """The MRC header of an encapsulated frame mrc_tx produced."""
    off = 14 + (40 if out[12:14] == struct.pack("!H", ETH_P_IPV6) else 20) + 8
    return wire.decode_mrc_hdr(out[off:off + wire.MRC_HDR_LEN])
