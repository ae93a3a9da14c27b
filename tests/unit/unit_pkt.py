"""Hand-built frames for the datapath unit tests (no scapy)."""

from __future__ import annotations

import socket
import struct

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
