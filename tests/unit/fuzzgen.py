"""Frame fuzzing for mrc_rx and mrc_tx: seeds, mutations, and a runner that
holds every BPF_PROG_TEST_RUN verdict against the reference model (rxmodel).

Used by tests/unit/test_fuzz.py (a short run in CI) and scripts/fuzz.py (the
1 000 000-frame run). Deterministic for a given seed.
"""

from __future__ import annotations

import errno
import random
import struct
import time
from collections import Counter
from dataclasses import dataclass, field

import unit_pkt as pkt
from unit_dp import (LOCAL_OVERLAY, LOCAL_OVERLAY6, OUR_MAC, OVL_DMAC, OVL_SMAC, PATHS, PEER, PEER_MAC,
                     PEER_OVERLAY, PEER_OVERLAY6, UDP_PORT)
from mrcctl.datapath import abi as wire
import rxmodel
from rxmodel import RxModel, TxModel, Verdict

R = wire.Reason
MAX_FRAME = 3500        # test_run refuses bigger linear frames (page minus head/tailroom)

# A source accepted on another plane only (spoofed when it arrives on lo) and
# a source of a peer entry with no paths (a peer being removed).
OTHER_PLANE_IFINDEX = 4000
OTHER_PLANE_SRC = "198.51.100.2"
EMPTY_PEER = 7
EMPTY_PEER_SRC = "203.0.113.7"
# A peer with every path id valid, so path_id mutations reach deep.
WIDE_PEER = 9
WIDE_PEER_SRC = "fd00:9::2"
WIDE_PEER_OVERLAY = "10.99.0.9"
ROUTED_PREFIX = "10.77.0.0/16"
ROUTED_PREFIX6 = "fd77::/48"                     # an IPv6 prefix behind the peer
# Probes the agent sent: (path, seq, nonce); a reply echoing one is genuine.
PROBES = [(path, seq, (0x9E3779B97F4A7C15 * (path * 31 + seq + 1)) & 0xFFFFFFFFFFFFFFFF)
          for path in range(4) for seq in (100, 101, 102)]
# Inner addresses: owned by the sending peer (by source), ours, or no one's.
INNER_SRC_OF = {PATHS[0].daddr: PEER_OVERLAY, PATHS[3].daddr: PEER_OVERLAY, PATHS[1].daddr: PEER_OVERLAY,
                WIDE_PEER_SRC: WIDE_PEER_OVERLAY}
INNER_ADDRS = [PEER_OVERLAY, LOCAL_OVERLAY, WIDE_PEER_OVERLAY, "10.77.3.4", "10.99.0.77", "10.99.0.255",
               "0.0.0.0", "255.255.255.255"]
INNER_ADDRS6 = [PEER_OVERLAY6, LOCAL_OVERLAY6, "fd77::1", "fd77:0:1::5", "fd99::77", "::ffff:10.99.0.2",
                "::10.99.0.2", "ff02::1"]
UNKNOWN_SRCS = ["203.0.113.9", "192.0.2.3", "fd00:1::3", "fd00:99::2"]
KNOWN_SRCS = [PATHS[0].daddr, PATHS[0].saddr, PATHS[1].daddr, PATHS[3].daddr, OTHER_PLANE_SRC,
              EMPTY_PEER_SRC, WIDE_PEER_SRC]


def configure(dp) -> tuple[RxModel, TxModel]:
    """Configure the unit-test datapath `dp` (already holding the one-peer
    set-up of unit_dp) with the extra sources above; return matching models."""
    dp.add_rx_peer(OTHER_PLANE_SRC, ifindex=OTHER_PLANE_IFINDEX)
    dp.add_rx_peer(EMPTY_PEER_SRC, peer=EMPTY_PEER)
    dp.set_peer(EMPTY_PEER, n_paths=0)
    dp.add_rx_peer(WIDE_PEER_SRC, peer=WIDE_PEER)
    dp.set_peer(WIDE_PEER, n_paths=wire.MRC_MAX_PATHS, overlay=WIDE_PEER_OVERLAY)
    dp.set_owner(WIDE_PEER_OVERLAY, WIDE_PEER)
    dp.set_owner(ROUTED_PREFIX, PEER)                # a prefix routed to the peer (issue #14)
    dp.set_owner(ROUTED_PREFIX6, PEER)
    dp.set_route(ROUTED_PREFIX6, PEER)
    rx = RxModel(udp_port=UDP_PORT)
    for p in PATHS:
        rx.add_source(p.saddr, PEER, plane=p.plane)
        rx.add_source(p.daddr, PEER, plane=p.plane)
    rx.add_source(OTHER_PLANE_SRC, PEER, ifindex=OTHER_PLANE_IFINDEX)
    rx.add_source(EMPTY_PEER_SRC, EMPTY_PEER)
    rx.add_source(WIDE_PEER_SRC, WIDE_PEER)
    rx.n_paths = {PEER: len(PATHS), EMPTY_PEER: 0, WIDE_PEER: wire.MRC_MAX_PATHS}
    rx.path_plane = {(PEER, i): p.plane for i, p in enumerate(PATHS)}   # WIDE_PEER: all plane 0
    rx.pmtu_paths = {(PEER, i): (p.family, p.plane, p.ev, wire.addr_bytes(p.saddr, p.family).ljust(16, b"\0"))
                     for i, p in enumerate(PATHS)}
    rx.psn_next = {PEER: 0}                           # no tx runs in the rx fuzz
    rx.add_owner(PEER_OVERLAY, PEER)
    rx.add_owner(LOCAL_OVERLAY, wire.MRC_OWNER_LOCAL)
    rx.add_owner(WIDE_PEER_OVERLAY, WIDE_PEER)
    rx.add_owner(ROUTED_PREFIX, PEER)
    rx.add_owner(PEER_OVERLAY6, PEER)
    rx.add_owner(LOCAL_OVERLAY6, wire.MRC_OWNER_LOCAL)
    rx.add_owner(ROUTED_PREFIX6, PEER)
    for peer in (PEER, WIDE_PEER):                   # outstanding probes whose replies are genuine
        for path, seq, nonce in PROBES:
            dp.probe_sent(path, seq, peer=peer, nonce=nonce)
            rx.add_probe(peer, path, seq, nonce)
    dp.set_slots([0])                      # path 0: IPv4 underlay
    tx = TxModel()
    tx.add_peer(PEER_OVERLAY, PATHS[0].family)
    tx.add_peer(PEER_OVERLAY6, PATHS[0].family)
    tx.add_prefix(ROUTED_PREFIX6, PATHS[0].family)
    return rx, tx


def reset_evidence(dp) -> None:
    """Forget the evidence the rx frames left (genuine probe replies and
    feedback echoes make some path the freshest, where mrc_tx steers TCP
    retransmissions), and the path MTUs genuine ICMP too-big frames recorded
    (bpf/pmtu.h): the tx model assumes the configured slot table and no
    path MTU."""
    dp.set_seq(PEER)
    for i in range(len(PATHS)):
        dp.set_live(i)
        dp.maps["mrc_path_mtu"].update(wire.DEFAULT_SIZING.path_key(PEER, i), wire.PathMtu().pack())


# ------------------------------------------------------------------ seeds

def _inner(rng: random.Random, src: str = PEER_OVERLAY) -> bytes:
    n = rng.choice([0, 1, 20, 100, 600, 1400])
    dst = LOCAL_OVERLAY
    if rng.random() < 0.08:                          # a spoofed inner source / a foreign destination
        src = rng.choice(INNER_ADDRS + ["10.77.0.1"])
    if rng.random() < 0.05:
        dst = rng.choice(INNER_ADDRS)
    if rng.random() < 0.6:
        body = pkt.tcp(5201, 40001, rng.getrandbits(32), rng.randbytes(n))
        proto = pkt.IPPROTO_TCP
    else:
        body = pkt.udp(5201, 40000, rng.randbytes(n))
        proto = pkt.IPPROTO_UDP
    if rng.random() < 0.35:                          # inner IPv6 (its addresses instead)
        src6 = PEER_OVERLAY6 if src == PEER_OVERLAY else rng.choice(INNER_ADDRS6)
        dst6 = LOCAL_OVERLAY6 if dst == LOCAL_OVERLAY else rng.choice(INNER_ADDRS6)
        if rng.random() < 0.1:
            src6 = "fd77::" + format(rng.getrandbits(16), "x")     # inside the routed prefix
        return pkt.ipv6(src6, dst6, proto if rng.random() < 0.9 else rng.choice([0, 44, 58]), body,
                        tc=_tos(rng))
    return pkt.ipv4(src, dst, proto, body, ident=rng.getrandbits(16), tos=_tos(rng))


def _tos(rng: random.Random) -> int:
    """DSCP and every ECN codepoint (RFC 6040 decapsulation rules)."""
    return rng.choice([0, 0xB8]) | rng.randrange(4)


def _hdr(rng: random.Random, mtype: int) -> bytes:
    segs = rng.choice([1, 1, 2, 4, 44, rng.getrandbits(16)])
    if mtype == wire.MsgType.PROBE_REPLY and rng.random() < 0.6:   # a reply to one of our probes
        path, seq, nonce = rng.choice(PROBES)
        return wire.encode_mrc_hdr(mtype, path_id=path, psn=seq, tx_ts=rng.getrandbits(32),
                                   **wire.probe_nonce_fields(nonce))
    return wire.encode_mrc_hdr(mtype, flags=rng.choice([0, 0, wire.MRC_F_FEEDBACK, rng.getrandbits(8)]),
                               path_id=rng.choice([0, 1, 2, 3, rng.getrandbits(16)]),
                               psn=rng.getrandbits(32), tx_ts=rng.getrandbits(32), segs=segs,
                               seg_size=rng.choice([0, 1000, 1448, rng.getrandbits(16)]),
                               seq0=rng.getrandbits(32), fb_path=rng.choice([0, 1, 3, rng.getrandbits(8)]), path_seq=rng.getrandbits(8),
                               fb_ts=rng.getrandbits(32))


def mrc_seed(rng: random.Random, family: int, mtype: int = wire.MsgType.DATA, reply: bool = False,
             src: str | None = None) -> bytes:
    if family == 4:
        src = src or rng.choice([PATHS[0].daddr, PATHS[3].daddr, OTHER_PLANE_SRC, EMPTY_PEER_SRC])
    else:
        src = src or rng.choice([PATHS[1].daddr, WIDE_PEER_SRC])
    inner = (_inner(rng, INNER_SRC_OF.get(src, PEER_OVERLAY)) if mtype == wire.MsgType.DATA
             else rng.choice([b"", rng.randbytes(32)]))
    sport, dport = rng.randrange(49152, 49170), UDP_PORT
    if reply:
        sport, dport = UDP_PORT, rng.randrange(49152, 49170)
    payload = pkt.udp(sport, dport, _hdr(rng, mtype) + inner)
    if family == 4:
        return pkt.eth(OUR_MAC, PEER_MAC, pkt.ETH_P_IP) + pkt.ipv4(
            src, PATHS[0].saddr, pkt.IPPROTO_UDP, payload, ident=rng.getrandbits(16), tos=_tos(rng))
    return pkt.eth(OUR_MAC, PEER_MAC, pkt.ETH_P_IPV6) + pkt.ipv6(
        src, PATHS[1].saddr, pkt.IPPROTO_UDP, payload, flow=rng.getrandbits(20), tc=_tos(rng))


def icmp_seed(rng: random.Random) -> bytes:
    """A router's frag-needed / packet-too-big quoting one of our own DATA
    frames (bpf/pmtu.h), genuine or not: PSNs in and out of the window,
    MTUs around the quoted length, short quotes."""
    pid = rng.choice([0, 1, 2, 3])
    p = PATHS[pid]
    hdr = wire.encode_mrc_hdr(path_id=rng.choice([pid, pid, 2, 3]),
                              psn=rng.choice([0xFFFFFFF0, 0xFFF00000, 0, 5, rng.getrandbits(32)]))
    payload = pkt.udp(rng.choice([p.ev, p.ev, 49160]), rng.choice([UDP_PORT, UDP_PORT, 53]),
                      hdr + rng.randbytes(rng.choice([0, 100, 1400])))
    mtu = rng.choice([0, 576, 1000, 1300, 1500, rng.getrandbits(16)])
    if p.family == 4:
        q = pkt.ipv4(p.saddr, p.daddr, pkt.IPPROTO_UDP, payload)
        q = q[:rng.choice([28, 56, 548, len(q)])]
        body = struct.pack("!BBHHH", 3, rng.choice([4, 4, 3]), 0, 0, mtu) + q
        return pkt.eth(OUR_MAC, PEER_MAC, pkt.ETH_P_IP) + pkt.ipv4("203.0.113.1", p.saddr, 1, body)
    q = pkt.ipv6(p.saddr, p.daddr, pkt.IPPROTO_UDP, payload)[:rng.choice([48, 76, 1232])]
    body = struct.pack("!BBHI", rng.choice([2, 2, 1]), 0, 0, mtu) + q
    return pkt.eth(OUR_MAC, PEER_MAC, pkt.ETH_P_IPV6) + pkt.ipv6("fd00:1::99", p.saddr, 58, body)


def other_seed(rng: random.Random) -> bytes:
    k = rng.randrange(10)
    if k == 9:
        return icmp_seed(rng)
    e4 = pkt.eth(OUR_MAC, PEER_MAC, pkt.ETH_P_IP)
    e6 = pkt.eth(OUR_MAC, PEER_MAC, pkt.ETH_P_IPV6)
    if k == 0:                                       # TCP, sometimes to/from the MRC port
        ports = rng.choice([(UDP_PORT, UDP_PORT), (40000, 22), (rng.getrandbits(16), rng.getrandbits(16))])
        return e4 + pkt.ipv4(PATHS[0].daddr, PATHS[0].saddr, pkt.IPPROTO_TCP,
                             pkt.tcp(*ports, rng.getrandbits(32), rng.randbytes(rng.choice([0, 40, 500]))))
    if k == 1:                                       # UDP
        return e4 + pkt.ipv4(rng.choice(KNOWN_SRCS[:1] + UNKNOWN_SRCS[:1]), PATHS[0].saddr,
                             pkt.IPPROTO_UDP, pkt.udp(rng.getrandbits(16), rng.choice([53, 4789, UDP_PORT + 1]),
                                                      rng.randbytes(rng.choice([0, 12, 300]))))
    if k == 2:                                       # ARP
        return pkt.eth("ff:ff:ff:ff:ff:ff", PEER_MAC, pkt.ETH_P_ARP) + bytes.fromhex(
            "0001080006040001") + rng.randbytes(20)
    if k == 3:                                       # ICMPv6 echo
        return e6 + pkt.ipv6(PATHS[1].daddr, PATHS[1].saddr, 58, bytes([128, 0, 0, 0]) + rng.randbytes(40))
    if k == 4:                                       # IPv6 UDP, not MRC
        return e6 + pkt.ipv6(PATHS[1].daddr, PATHS[1].saddr, pkt.IPPROTO_UDP,
                             pkt.udp(rng.getrandbits(16), 53, rng.randbytes(30)))
    if k == 5:                                       # VLAN- or priority-tagged (VID 0) MRC
        m = mrc_seed(rng, rng.choice([4, 6]))
        vid = rng.choice([0, rng.getrandbits(12)])
        return pkt.vlan(OUR_MAC, PEER_MAC, vid, _u16(m, 12)) + m[14:]
    if k == 6:                                       # IPv4 fragments of MRC
        m = mrc_seed(rng, 4)
        kw = rng.choice([{"df": False, "mf": True}, {"df": False, "frag_off": rng.randrange(1, 200)},
                         {"df": False, "mf": True, "frag_off": 3}])
        return e4 + pkt.ipv4(PATHS[0].daddr, PATHS[0].saddr, pkt.IPPROTO_UDP, m[34:], **kw)
    if k == 7:                                       # IPv6 fragments of MRC
        m = mrc_seed(rng, 6)
        fh = pkt.ip6_frag(pkt.IPPROTO_UDP, offset=rng.choice([0, 0, 5]), more=rng.random() < 0.8)
        return e6 + pkt.ipv6(PATHS[1].daddr, PATHS[1].saddr, pkt.IPV6_FRAGMENT, fh + m[54:])
    m = mrc_seed(rng, 4)                             # IPv4 options
    opts = rng.choice([b"\x01\x01\x01\x00", b"\x94\x04\x00\x00", rng.randbytes(8)])
    return e4 + pkt.ipv4(PATHS[0].daddr, PATHS[0].saddr, pkt.IPPROTO_UDP, m[34:], options=opts)


def rx_seed(rng: random.Random) -> bytes:
    r = rng.random()
    if r < 0.30:
        return mrc_seed(rng, rng.choice([4, 6]))
    if r < 0.42:
        return mrc_seed(rng, rng.choice([4, 6]), wire.MsgType.PROBE)
    if r < 0.52:
        return mrc_seed(rng, rng.choice([4, 6]), wire.MsgType.PROBE_REPLY, reply=rng.random() < 0.7)
    if r < 0.90:
        return other_seed(rng)
    return rng.randbytes(rng.randrange(14, 200))


def tx_seed(rng: random.Random) -> bytes:
    r = rng.random()
    e = pkt.eth(OVL_DMAC, OVL_SMAC, pkt.ETH_P_IP)
    dst = PEER_OVERLAY if r < 0.7 else rng.choice(["10.99.0.9", "10.99.0.77", "8.8.8.8"])
    k = rng.randrange(4)
    if k == 0:
        body, proto = pkt.tcp(40001, 5201, rng.getrandbits(32), rng.randbytes(rng.choice([0, 100, 1400]))), 6
    elif k == 1:
        body, proto = pkt.udp(40000, 5201, rng.randbytes(rng.choice([0, 64, 1200]))), 17
    elif k == 2:
        body, proto = bytes([8, 0, 0, 0]) + rng.randbytes(56), 1
    else:
        return rx_seed(rng)                          # anything may reach mrc0's egress
    if rng.random() < 0.3:                           # inner IPv6: a peer, a prefix behind it, or no one
        dst6 = rng.choice([PEER_OVERLAY6, PEER_OVERLAY6, "fd77::9", "fd99::77", "ff02::1"])
        return pkt.eth(OVL_DMAC, OVL_SMAC, pkt.ETH_P_IPV6) + pkt.ipv6(LOCAL_OVERLAY6, dst6, proto, body)
    opts = b"" if rng.random() < 0.9 else b"\x01" * 4 * rng.randrange(1, 11)
    return e + pkt.ipv4(LOCAL_OVERLAY, dst, proto, body, options=opts, df=rng.random() < 0.5)


# ------------------------------------------------------------------ mutations

def _u16(b: bytes, off: int) -> int:
    return (b[off] << 8) | b[off + 1]


INTERESTING = [0, 1, 2, 5, 0x0F, 0x10, 0x11, 0x12, 0x1F, 0x20, 0x2C, 0x40, 0x45, 0x46, 0x4F, 0x60,
               0x7F, 0x80, 0x81, 0x86, 0xDD, 0xFE, 0xFF]


def _put(f: bytearray, off: int, data: bytes) -> None:
    if off + len(data) <= len(f):
        f[off:off + len(data)] = data


def _field(rng: random.Random, f: bytearray) -> None:
    """Overwrite one header field the parser looks at, with a value likely to
    move the verdict."""
    v6 = len(f) >= 14 and _u16(f, 12) == pkt.ETH_P_IPV6
    uoff = 54 if v6 else 14 + 4 * (f[14] & 0x0F if len(f) > 14 else 5)
    moff = uoff + 8
    k = rng.randrange(13)
    if k == 0:
        _put(f, 12, struct.pack("!H", rng.choice([0x0800, 0x86DD, 0x8100, 0x88A8, 0x0806, 0x05DC,
                                                   rng.getrandbits(16)])))
    elif k == 1:
        _put(f, 14, bytes([rng.choice([0x45, 0x46, 0x44, 0x40, 0x4F, 0x55, 0x60, 0x65, rng.getrandbits(8)])]))
    elif k == 2:
        if v6:
            _put(f, 20, bytes([rng.choice([17, 44, 0, 6, 58, 60, rng.getrandbits(8)])]))
        else:
            _put(f, 23, bytes([rng.choice([17, 6, 1, rng.getrandbits(8)])]))
    elif k == 3:
        if v6:
            _put(f, 18, struct.pack("!H", rng.choice([0, 8, 35, 36, len(f) - 54, len(f) - 53,
                                                      len(f) - 55, rng.getrandbits(16)]) & 0xFFFF))
        else:
            _put(f, 16, struct.pack("!H", rng.choice([0, 20, 55, 56, len(f) - 14, len(f) - 13,
                                                      len(f) - 15, rng.getrandbits(16)]) & 0xFFFF))
    elif k == 4 and not v6:
        _put(f, 20, struct.pack("!H", rng.choice([0x4000, 0x2000, 0x0001, 0x3FFF, 0x6000, 0x1FFF,
                                                   rng.getrandbits(16)])))
    elif k == 5:
        _put(f, uoff + rng.choice([0, 2]), struct.pack("!H", rng.choice([UDP_PORT, UDP_PORT, 49152,
                                                                         rng.getrandbits(16)])))
    elif k == 6:
        ulen = len(f) - uoff
        _put(f, uoff + 4, struct.pack("!H", rng.choice([0, 8, 35, 36, ulen, ulen + 1, ulen - 1,
                                                        rng.getrandbits(16)]) & 0xFFFF))
    elif k == 7:
        _put(f, moff, bytes([rng.choice([0x10, 0x11, 0x12, 0x13, 0x1F, 0x00, 0x20, 0xF1,
                                         rng.getrandbits(8)])]))
    elif k == 8:
        _put(f, moff + 2, struct.pack("!H", rng.choice([0, 3, 4, 5, 255, 256, 0xFFFF, rng.getrandbits(16)])))
    elif k == 9:
        src = rng.choice(KNOWN_SRCS + UNKNOWN_SRCS)
        fam = wire.family_of(src)
        if fam == 6 and v6:
            _put(f, 22, wire.addr_bytes(src, 6))
        elif fam == 4 and not v6:
            _put(f, 26, wire.addr_bytes(src, 4))
    elif k == 10:                                   # inner IPv4 version/ihl
        _put(f, moff + 28, bytes([rng.choice([0x45, 0x44, 0x46, 0x4F, 0x60, 0x00, rng.getrandbits(8)])]))
    elif k == 11:                                   # segs / seg_size / seq0
        _put(f, moff + 12, rng.randbytes(rng.choice([2, 4, 8])))
    else:                                           # inner source or destination
        a = rng.choice(INNER_ADDRS + [f"10.77.{rng.randrange(256)}.{rng.randrange(256)}"])
        _put(f, moff + 28 + rng.choice([12, 16]), wire.ipv4_key(a))


def mutate(rng: random.Random, frame: bytes) -> bytes:
    f = bytearray(frame)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        k = rng.random()
        if k < 0.35:
            _field(rng, f)
        elif k < 0.55:                              # flip bits in the headers
            for _ in range(rng.randrange(1, 4)):
                if f:
                    i = rng.randrange(min(len(f), 110))
                    f[i] ^= 1 << rng.randrange(8)
        elif k < 0.65:                              # interesting byte anywhere
            if f:
                f[rng.randrange(len(f))] = rng.choice(INTERESTING)
        elif k < 0.80:                              # truncate
            if len(f) > 14:
                del f[rng.randrange(14, len(f)):]
        elif k < 0.87:                              # grow
            f += rng.randbytes(rng.choice([1, 2, 10, 100, 1500]))
        elif k < 0.94:                              # insert or delete inside the headers
            i = rng.randrange(12, max(13, min(len(f), 100)))
            if rng.random() < 0.5:
                f[i:i] = rng.randbytes(rng.choice([1, 2, 4, 8]))
            else:
                del f[i:i + rng.choice([1, 2, 4, 8])]
        else:                                       # random tail after a random cut
            cut = rng.randrange(14, max(15, len(f)))
            f[cut:] = rng.randbytes(rng.randrange(0, 200))
    if len(f) < 14:
        f += bytes(14 - len(f))
    return bytes(f[:MAX_FRAME])


def rx_frames(rng: random.Random, n: int):
    for _ in range(n):
        f = rx_seed(rng)
        yield f if rng.random() < 0.15 else mutate(rng, f)


def tx_frames(rng: random.Random, n: int):
    for _ in range(n):
        f = tx_seed(rng)
        yield f if rng.random() < 0.2 else mutate(rng, f)


# ------------------------------------------------------------------ the runner

class Mismatch(AssertionError):
    pass


@dataclass
class Result:
    frames: int = 0
    seconds: float = 0.0
    verdicts: Counter = field(default_factory=Counter)    # "rx PASS/untouched" ... -> count

    @property
    def rate(self) -> float:
        return self.frames / self.seconds if self.seconds else 0.0


ACTION_NAMES = {"rx": {0: "ABORTED", 1: "DROP", 2: "PASS", 3: "TX"}, "tx": {2: "SHOT", 7: "REDIRECT"}}


def _label(side: str, v: Verdict | None, frame: bytes) -> str:
    if v is None:
        return f"{side} refused by BPF_PROG_TEST_RUN (runt IP frame)"
    a = ACTION_NAMES[side].get(v.action, str(v.action))
    if v.reason is not None:
        return f"{side} {a} {v.reason.label}"
    if side == "rx" and v.action == 2:
        return "rx PASS " + ("untouched" if v.out == frame else "decapsulated")
    return f"{side} {a}"


class Runner:
    """Runs frames through the loaded programs and the models.

    Per frame: the return code and, where the model knows them, the output
    bytes must match. Per batch: every mrc_drops counter must have moved by
    exactly what the model predicted (one map read per batch, not per frame;
    on a mismatch the batch is replayed frame by frame to name the culprit).
    """

    def __init__(self, dp, rx: RxModel, tx: TxModel, batch: int = 2000):
        self.dp, self.rxm, self.txm, self.batch = dp, rx, tx, batch
        self.next_psn = 1
        self.probes = 0

    def _refill_probe_budget(self):
        """Probe replies are rate-limited per (peer, plane) (bpf/probe.h),
        state the model leaves out: refill every bucket well before a
        burst's worth of probes has been answered."""
        m = self.dp.maps.get("mrc_probe_rl")
        if m is None:
            return
        for peer in self.rxm.n_paths:
            for plane in range(wire.MRC_MAX_PLANES):
                m.update(wire.u32(peer * wire.MRC_MAX_PLANES + plane), wire.u64(0))

    def _drops(self) -> Counter:
        return Counter({r: v for r, v in self.dp.drops().items() if v})

    def _rx_one(self, f: bytes) -> tuple[bytes, Verdict]:
        v = self.rxm.verdict(f)
        if v.mrc_off is not None and (v.action == rxmodel.XDP_PASS or v.reason == R.RX_ECN_NOT_ECT):
            # DATA that reaches the PSN accounting (decapsulated, or dropped
            # for ECN after it): a fresh wire PSN, so duplicate suppression
            # and its look-ahead bound (not the parser's business) never fire.
            f = rxmodel.with_wire_psn(f, v.mrc_off, self.next_psn)
            self.next_psn += 1
            v = self.rxm.verdict(f)
        if self.dp.rx_hook == "tc" and rxmodel.test_run_refuses(f):
            return f, self._refused(self.dp.run_rx, f, "rx")
        if self.dp.rx_hook == "tc" and len(f) >= 14 and f[12:14] in (b"\x81\x00", b"\x88\xa8"):
            # the kernel takes a VLAN tag out of the frame (skb_vlan_untag)
            # before tc ingress: mrc_rx_tc never sees one in the frame, and
            # decapsulating behind one is XDP's case (mrc_rx runs these)
            return f, rxmodel.Verdict(v.action)
        if v.reason == R.RX_PROBE_REPLIED:
            self.probes += 1
            if self.probes % 256 == 0:
                self._refill_probe_budget()
        ret, out = self.dp.run_rx(f)
        if ret != v.action or (v.out is not None and out != v.out) or (v.action == rxmodel.XDP_DROP and out != f):
            raise Mismatch(f"rx: program said {ret} ({len(out)} bytes out), model {v} "
                           f"({len(v.out) if v.out is not None else '-'} bytes); frame {f.hex()}")
        return f, v

    @staticmethod
    def _refused(run, f: bytes, side: str) -> None:
        """A runt IP frame an skb program's test_run refuses: the refusal
        is what is checked (no verdict, no counter)."""
        try:
            run(f)
        except OSError as e:
            if e.errno == errno.EINVAL:
                return None
            raise
        raise Mismatch(f"{side}: test_run accepted a runt IP frame {f.hex()}")

    def _tx_one(self, f: bytes) -> tuple[bytes, Verdict | None]:
        if self.txm.test_run_refuses(f):
            return f, self._refused(self.dp.run_tx, f, "tx")
        v = self.txm.verdict(f)
        ret, out = self.dp.run_tx(f)
        if ret != v.action:
            raise Mismatch(f"tx: program said {ret}, model {v}; frame {f.hex()}")
        if ret == rxmodel.TC_ACT_REDIRECT:
            oh = rxmodel.overhead(v.family)
            if len(out) != len(f) + oh or out[14 + oh:] != f[14:] or \
                    _u16(out, 12) != (pkt.ETH_P_IP if v.family == 4 else pkt.ETH_P_IPV6):
                raise Mismatch(f"tx: encapsulation of {f.hex()} gave {out.hex()}")
        return f, v

    def run(self, side: str, frames, result: Result | None = None) -> Result:
        result = result or Result()
        one = self._rx_one if side == "rx" else self._tx_one
        t0 = time.monotonic()
        batch: list[bytes] = []
        expect: Counter = Counter()
        before = self._drops()
        for f in frames:
            f, v = one(f)
            batch.append(f)
            result.verdicts[_label(side, v, f)] += 1
            if v is not None and v.reason is not None:
                expect[v.reason] += 1
            if len(batch) >= self.batch:
                before = self._check_counters(side, before, expect, batch)
                batch, expect = [], Counter()
        if batch:
            self._check_counters(side, before, expect, batch)
        result.seconds += time.monotonic() - t0
        result.frames = sum(result.verdicts.values())
        return result

    def _check_counters(self, side, before: Counter, expect: Counter, batch) -> Counter:
        after = self._drops()
        got = Counter({r: after[r] - before[r] for r in after if after[r] != before[r]})
        if got != expect:
            self._blame(side, batch)
            raise Mismatch(f"{side}: counters moved by {dict(got)}, model expected {dict(expect)} "
                           f"over {len(batch)} frames")
        return after

    def _blame(self, side: str, batch) -> None:
        one = self._rx_one if side == "rx" else self._tx_one
        for f in batch:
            before = self._drops()
            f2, v = one(f)
            after = self._drops()
            got = {r: after[r] - before[r] for r in after if after[r] != before[r]}
            want = {v.reason: 1} if v is not None and v.reason is not None else {}
            if got != want:
                raise Mismatch(f"{side}: counters moved by {got}, model expected {want}; frame {f2.hex()}")
