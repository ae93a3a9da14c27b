"""A Python reference model of the mrc datapath parsers, independent of the C.

`RxModel.verdict(frame)` says what `mrc_rx` must do with a frame: pass it
untouched, drop it under one reason, turn a probe around (XDP_TX, with the
reply's exact bytes), or decapsulate it (XDP_PASS, with the inner packet's
exact bytes). `TxModel.verdict(frame)` says whether `mrc_tx` encapsulates
(TC_ACT_REDIRECT) or drops (TC_ACT_SHOT) and why. The fuzz and hostile-packet
tests run every frame through both the model and the real program and insist
on the same answer, so the model is written from the documented rules in
bpf/rx.bpf.c and docs/hostile-input.md, not from the code's structure.

What the model deliberately leaves out is state that is not the parser's:
duplicate suppression (issue 3's PSN window) and reordering accounting. The
fuzzer keeps those out of the way by giving every frame the model decapsulates
a fresh, increasing wire PSN (`data_psn_index` tells how the program derives
it).
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass, field

from mrcctl.datapath import abi as wire

XDP_ABORTED, XDP_DROP, XDP_PASS, XDP_TX = 0, 1, 2, 3
TC_ACT_SHOT, TC_ACT_REDIRECT = 2, 7

ETH_HLEN = 14
ETH_P_IP = 0x0800
ETH_P_IPV6 = 0x86DD
ETH_P_8021Q = 0x8100
ETH_P_8021AD = 0x88A8
IPPROTO_TCP = 6
IPPROTO_UDP = 17
IPPROTO_ICMP = 1
IPPROTO_ICMPV6 = 58
IPV6_FRAGMENT = 44
UDP_HLEN = 8
MRC_HDR = wire.MRC_HDR_LEN

R = wire.Reason


@dataclass(frozen=True)
class Verdict:
    action: int                      # XDP_* or TC_ACT_*
    reason: R | None = None          # the mrc_drops counter that moves (at most one)
    out: bytes | None = None         # exact output bytes when the model knows them
    mrc_off: int | None = None       # offset of the MRC header (MRC frames the program judged)
    family: int | None = None        # tx: family of the outer header written

    def __str__(self) -> str:
        return str(self.action) + (f"/{self.reason.label}" if self.reason is not None else "")




def longest_prefix(table: dict, addr: bytes):
    """The value of the longest network in table (either family) holding
    the 4- or 16-byte address, or None: an LPM trie's lookup."""
    a = ipaddress.ip_address(bytes(addr))
    best = None
    for net, value in table.items():
        if net.version == a.version and a in net and (best is None or net.prefixlen > best[0]):
            best = (net.prefixlen, value)
    return best[1] if best else None


def _u16(b: bytes, off: int) -> int:
    return (b[off] << 8) | b[off + 1]


def _u32(b: bytes, off: int) -> int:
    return struct.unpack_from("!I", b, off)[0]


@dataclass
class RxModel:
    """The receive side's configuration, as the program sees it in its maps.

    rx_peers: (ingress ifindex, family, 16-byte address) -> (peer index,
    plane index); n_paths: peer index -> paths (0 = free entry);
    path_plane: (peer, path id) -> the path's plane (0 for an entry never
    written, as the array map reads); owners: overlay network of either
    family -> peer index or MRC_OWNER_LOCAL, looked up by longest prefix
    within the address's family.
    """
    udp_port: int = wire.MRC_DEFAULT_UDP_PORT
    rx_peers: dict = field(default_factory=dict)
    n_paths: dict = field(default_factory=dict)
    path_plane: dict = field(default_factory=dict)
    owners: dict = field(default_factory=dict)
    probes: dict = field(default_factory=dict)   # (peer, path) -> {ring slot: (seq, nonce)}
    # path MTU (bpf/pmtu.h): (peer, path) -> (family, plane, EV, 16-byte
    # source address); peer -> the next PSN the sender would send
    pmtu_paths: dict = field(default_factory=dict)
    psn_next: dict = field(default_factory=dict)

    def add_probe(self, peer: int, path: int, seq: int, nonce: int) -> None:
        """The agent sent probe `seq` on (peer, path) with `nonce`."""
        self.probes.setdefault((peer, path), {})[seq % wire.MRC_PROBE_RING] = (seq & 0xFFFFFFFF, nonce)

    def probe_genuine(self, peer: int, path: int, f: bytes, moff: int) -> bool:
        seq = _u32(f, moff + 4)
        nonce = _u32(f, moff + 16) << 32 | _u32(f, moff + 24)
        slot = self.probes.get((peer, path), {}).get(seq % wire.MRC_PROBE_RING)
        return nonce != 0 and slot == (seq, nonce)

    def add_source(self, addr: str, peer: int, ifindex: int = 1, plane: int = 0) -> None:
        fam = wire.family_of(addr)
        self.rx_peers[(ifindex, fam, wire.addr_bytes(addr, fam).ljust(16, b"\0"))] = (peer, plane)

    def add_owner(self, prefix: str, owner: int) -> None:
        self.owners[ipaddress.ip_network(prefix, strict=False)] = owner

    def owner(self, addr: bytes) -> int | None:
        """The owner of a 4- or 16-byte address (IPv4, IPv6)."""
        return longest_prefix(self.owners, addr)

    # ------------------------------------------------------------------ rx
    def verdict(self, f: bytes, ingress: int = 1) -> Verdict:
        # An 802.1Q priority tag (VID 0) is the untagged frame (as the
        # kernel treats it): judged without it; a reply keeps it, a
        # decapsulated packet loses it with the outer headers.
        if len(f) >= ETH_HLEN + 4 and _u16(f, 12) == ETH_P_8021Q and not _u16(f, 14) & 0x0FFF:
            v = self._verdict(f[:12] + f[16:], ingress)
            out = v.out
            if v.action == XDP_TX and out is not None:
                out = out[:12] + f[12:16] + out[12:]
            elif v.action == XDP_PASS and (v.mrc_off is None or v.reason is not None):
                out = f                                # untouched
            return Verdict(v.action, v.reason, out,
                           v.mrc_off + 4 if v.mrc_off is not None else None, v.family)
        return self._verdict(f, ingress)

    def _verdict(self, f: bytes, ingress: int = 1) -> Verdict:
        n = len(f)
        PASS = Verdict(XDP_PASS, None, f)
        if n < ETH_HLEN:
            return PASS
        ethertype = _u16(f, 12)
        port = self.udp_port or wire.MRC_DEFAULT_UDP_PORT
        if ethertype == ETH_P_IP:
            if n < ETH_HLEN + 20:
                return PASS
            ver, ihl = f[14] >> 4, f[14] & 0x0F
            if ver == 4 and ihl >= 5 and f[14 + 9] == IPPROTO_ICMP and not _u16(f, 20) & 0x3FFF:
                return self._icmp(f, 4, ETH_HLEN + ihl * 4, ingress, port)
            if ver != 4 or f[14 + 9] != IPPROTO_UDP or ihl < 5:
                return PASS
            frag = _u16(f, 14 + 6)
            if frag & 0x1FFF:                     # non-first fragment: no ports to judge
                return Verdict(XDP_PASS, R.RX_PASS_FRAGMENT, f)
            uoff = ETH_HLEN + ihl * 4
            if uoff + UDP_HLEN > n:
                return PASS
            sport, dport = _u16(f, uoff), _u16(f, uoff + 2)
            reply_only = dport != port
            if reply_only and sport != port:
                return PASS
            if ihl != 5:
                return PASS if reply_only else Verdict(XDP_DROP, R.RX_IP_OPTIONS)
            if frag & 0x2000:
                return PASS if reply_only else Verdict(XDP_DROP, R.RX_FRAGMENT)
            family, src = 4, f[26:30].ljust(16, b"\0")
            l3_len, ip_len = 20, _u16(f, 16)
        elif ethertype == ETH_P_IPV6:
            if n < ETH_HLEN + 40 or f[14] >> 4 != 6:
                return PASS
            nh = f[14 + 6]
            if nh == IPPROTO_ICMPV6:
                return self._icmp(f, 6, 54, ingress, port)
            if nh == IPV6_FRAGMENT:
                if n < 54 + 8:
                    return PASS
                if f[54] != IPPROTO_UDP:
                    return PASS
                if _u16(f, 56) & 0xFFF8:
                    return Verdict(XDP_PASS, R.RX_PASS_FRAGMENT, f)
                if n < 62 + UDP_HLEN or _u16(f, 62 + 2) != port:
                    return PASS
                return Verdict(XDP_DROP, R.RX_FRAGMENT)
            if nh != IPPROTO_UDP:
                return PASS
            uoff = 54
            if uoff + UDP_HLEN > n:
                return PASS
            sport, dport = _u16(f, uoff), _u16(f, uoff + 2)
            reply_only = dport != port
            if reply_only and sport != port:
                return PASS
            family, src = 6, f[22:38]
            l3_len, ip_len = 40, 40 + _u16(f, 18)
        elif ethertype in (ETH_P_8021Q, ETH_P_8021AD):
            return Verdict(XDP_PASS, R.RX_PASS_VLAN, f)
        else:
            return PASS                            # ARP, everything else

        def refuse(reason: R) -> Verdict:
            return PASS if reply_only else Verdict(XDP_DROP, reason)

        peer, plane = self.rx_peers.get((ingress, family, src), (None, None))
        if peer is None or peer >= wire.MRC_DEFAULT_PEERS or not self.n_paths.get(peer, 0):
            return refuse(R.RX_UNKNOWN_PEER)
        n_paths = self.n_paths[peer]

        moff = uoff + UDP_HLEN
        udp_len = _u16(f, uoff + 4)
        if (moff + MRC_HDR > n or ip_len < l3_len + UDP_HLEN + MRC_HDR or n < ETH_HLEN + ip_len
                or udp_len < UDP_HLEN + MRC_HDR or udp_len > ip_len - l3_len):
            return refuse(R.RX_TRUNCATED)
        if f[moff] >> 4 != wire.MRC_VERSION:
            return refuse(R.RX_BAD_VERSION)
        mtype = f[moff] & 0x0F
        if reply_only and mtype != wire.MsgType.PROBE_REPLY:
            return PASS
        if mtype == wire.MsgType.TRACE:             # an EV trace that went too far
            return Verdict(XDP_DROP, R.RX_TRACE, None, moff)
        # auth is off in the model (no mrc_auth keys): a frame carrying a
        # MAC cannot be checked and is refused (bpf/auth.h)
        if f[moff + 1] & wire.MRC_F_AUTH:
            return Verdict(XDP_DROP, R.RX_BAD_MAC, None, moff)
        if mtype == wire.MsgType.PROBE:
            return Verdict(XDP_TX, R.RX_PROBE_REPLIED, self._probe_reply(f, family, uoff, moff), moff)
        if mtype not in (wire.MsgType.DATA, wire.MsgType.PROBE_REPLY, wire.MsgType.FEEDBACK):
            return Verdict(XDP_DROP, R.RX_BAD_TYPE, None, moff)
        path_id = _u16(f, moff + 2)
        if path_id >= n_paths:
            return Verdict(XDP_DROP, R.RX_UNKNOWN_PATH, None, moff)
        if self.path_plane.get((peer, path_id), 0) != plane:
            return Verdict(XDP_DROP, R.RX_WRONG_PLANE, None, moff)
        if mtype == wire.MsgType.PROBE_REPLY:
            if not self.probe_genuine(peer, path_id, f, moff):
                return Verdict(XDP_DROP, R.RX_BAD_NONCE, None, moff)
            return Verdict(XDP_DROP, R.RX_PROBE_REPLY, None, moff)
        if mtype == wire.MsgType.FEEDBACK:          # evidence only, consumed
            return Verdict(XDP_DROP, R.RX_FEEDBACK, None, moff)
        ioff = moff + MRC_HDR
        # The inner packet: IPv6 by its version nibble 6, else IPv4.
        v6 = ioff < n and f[ioff] >> 4 == 6
        if v6:
            if ioff + 40 > n:
                return Verdict(XDP_DROP, R.RX_BAD_INNER, None, moff)
            isrc, idst = f[ioff + 8:ioff + 24], f[ioff + 24:ioff + 40]
        else:
            if ioff + 20 > n or f[ioff] >> 4 != 4 or f[ioff] & 0x0F < 5:
                return Verdict(XDP_DROP, R.RX_BAD_INNER, None, moff)
            isrc, idst = f[ioff + 12:ioff + 16], f[ioff + 16:ioff + 20]
        # Bound to the peer: its own inner source, our inner destination.
        if self.owner(isrc) != peer:
            return Verdict(XDP_DROP, R.RX_INNER_SRC, None, moff)
        if self.owner(idst) != wire.MRC_OWNER_LOCAL:
            return Verdict(XDP_DROP, R.RX_INNER_DST, None, moff)
        # ECN, RFC 6040: CE outside a not-ECT inner packet is dropped; CE,
        # or ECT(1) over ECT(0), is merged into the inner header (IPv4:
        # checksum updated incrementally, as the program does; IPv6: bits
        # 4-5 of its second byte, no checksum).
        outer = (f[15] if family == 4 else f[15] >> 4) & 3
        inner = bytearray(f[ioff:])
        ecn = (inner[1] >> 4) & 3 if v6 else inner[1] & 3
        if outer == 3 and ecn == 0:
            return Verdict(XDP_DROP, R.RX_ECN_NOT_ECT, None, moff)
        new = 3 if outer == 3 else (1 if outer == 1 and ecn == 2 else ecn)
        if new != ecn and v6:
            inner[1] = (inner[1] & 0xCF) | new << 4
        elif new != ecn:
            old = _u16(inner, 0)
            inner[1] = (inner[1] & 0xFC) | new
            s = (~_u16(inner, 10) & 0xFFFF) + (~old & 0xFFFF) + _u16(inner, 0)
            s = (s & 0xFFFF) + (s >> 16)
            s = (s & 0xFFFF) + (s >> 16)
            inner[10:12] = struct.pack("!H", ~s & 0xFFFF)
        # Decapsulated: the outer MACs, the inner family's ethertype, then
        # everything after the MRC header (Ethernet padding included).
        et = b"\x86\xdd" if v6 else b"\x08\x00"
        return Verdict(XDP_PASS, None, f[0:12] + et + bytes(inner), moff)

    def _icmp(self, f: bytes, family: int, off: int, ingress: int, port: int) -> Verdict:
        """An ICMP error on a plane (docs/hostile-input.md, "ICMP too big"):
        a frag-needed / packet-too-big quoting a frame to our port must name
        one of our paths exactly (pmtu_paths, psn_next) and a sane MTU."""
        n, PASS = len(f), Verdict(XDP_PASS, None, f)
        bad = Verdict(XDP_DROP, R.RX_PMTU_BAD)
        if off + 8 > n:
            return PASS
        if family == 4:
            if (f[off], f[off + 1]) != (3, 4):
                return PASS
            mtu, floor = _u16(f, off + 6), 576
        else:
            if (f[off], f[off + 1]) != (2, 0):
                return PASS
            mtu, floor = _u32(f, off + 4), 1280
        q = off + 8
        if family == 4:
            if q + 20 > n or f[q] >> 4 != 4 or f[q] & 0x0F < 5:
                return PASS
            if f[q + 9] != IPPROTO_UDP or _u16(f, q + 6) & 0x3FFF or f[q] & 0x0F != 5:
                return PASS
            qlen, saddr, daddr, u = _u16(f, q + 2), f[q + 12:q + 16], f[q + 16:q + 20], q + 20
        else:
            if q + 40 > n or f[q] >> 4 != 6 or f[q + 6] != IPPROTO_UDP:
                return PASS
            qlen, saddr, daddr, u = 40 + _u16(f, q + 4), f[q + 8:q + 24], f[q + 24:q + 40], q + 40
        if u + UDP_HLEN > n or _u16(f, u + 2) != port:
            return PASS
        m = u + UDP_HLEN
        if m + MRC_HDR > n or f[m] != wire.MRC_VERSION << 4 | wire.MsgType.DATA:
            return bad
        peer, plane = self.rx_peers.get((ingress, family, daddr.ljust(16, b"\0")), (None, None))
        if peer is None or peer >= wire.MRC_DEFAULT_PEERS:
            return bad
        pid = _u16(f, m + 2)
        if pid >= self.n_paths.get(peer, 0):
            return bad
        want = self.pmtu_paths.get((peer, pid))
        if want != (family, plane, _u16(f, u), saddr.ljust(16, b"\0")):
            return bad
        delta = (self.psn_next.get(peer, 0) - _u32(f, m + 4)) & 0xFFFFFFFF
        if delta == 0 or delta > 1 << 20 or mtu == 0 or mtu >= qlen:
            return bad
        return Verdict(XDP_DROP, R.RX_PMTU)

    @staticmethod
    def _probe_reply(f: bytes, family: int, uoff: int, moff: int) -> bytes:
        o = bytearray(f)
        o[0:6], o[6:12] = f[6:12], f[0:6]
        if family == 4:
            o[26:30], o[30:34] = f[30:34], f[26:30]
            o[14 + 8] = 64
            o[24:26] = b"\0\0"
            o[24:26] = struct.pack("!H", wire.inet_csum(bytes(o[14:34])))
        else:
            o[22:38], o[38:54] = f[38:54], f[22:38]
            o[14 + 7] = 64
        o[uoff:uoff + 2], o[uoff + 2:uoff + 4] = f[uoff + 2:uoff + 4], f[uoff:uoff + 2]
        o[uoff + 6:uoff + 8] = b"\0\0"
        o[moff] = (wire.MRC_VERSION << 4) | wire.MsgType.PROBE_REPLY
        return bytes(o)


def data_psn_index(f: bytes, moff: int) -> int:
    """Segment index i the receiver adds to the header's PSN for this DATA
    frame, when the unit has several segments and i < segs (else 0): with
    MRC_F_IPID, inner IPv4 ID - seq0 mod 2^16; otherwise (inner TCP seq -
    seq0) / seg_size when the inner packet (IPv4 or IPv6) is TCP with its
    sequence number present; an inner IPv6 packet has no ID: 0."""
    segs, seg_size = _u16(f, moff + 12), _u16(f, moff + 14)
    ioff = moff + MRC_HDR
    if segs <= 1:
        return 0
    v6 = f[ioff] >> 4 == 6
    if f[moff + 1] & wire.MRC_F_IPID:
        if v6:
            return 0
        i = (_u16(f, ioff + 4) - _u32(f, moff + 16)) & 0xFFFF
        return i if i < segs else 0
    if seg_size == 0 or f[ioff + (6 if v6 else 9)] != IPPROTO_TCP:
        return 0
    toff = ioff + (40 if v6 else (f[ioff] & 0x0F) * 4)
    if toff + 8 > len(f):
        return 0
    i = ((_u32(f, toff + 4) - _u32(f, moff + 16)) & 0xFFFFFFFF) // seg_size
    return i if i < segs else 0


def with_wire_psn(f: bytes, moff: int, psn: int) -> bytes:
    """The same DATA frame rewritten so that its derived wire PSN is `psn`."""
    o = bytearray(f)
    struct.pack_into("!I", o, moff + 4, (psn - data_psn_index(f, moff)) & 0xFFFFFFFF)
    return bytes(o)


# ---------------------------------------------------------------------- tx

@dataclass
class TxModel:
    """The transmit side: overlay destination (IPv4 or IPv6) -> (peer, family
    of the path its slot table picks first). Every configured peer has a
    usable path."""
    peers: dict = field(default_factory=dict)      # 4- or 16-byte daddr -> outer family

    prefixes: dict = field(default_factory=dict)   # network -> outer family (longest prefix wins)

    def add_peer(self, overlay: str, family: int) -> None:
        self.peers[ipaddress.ip_address(overlay).packed] = family

    def add_prefix(self, prefix: str, family: int) -> None:
        """A prefix behind the peer (mrc_peer_ip, by longest prefix)."""
        self.prefixes[ipaddress.ip_network(prefix)] = family

    def peer_of(self, daddr: bytes) -> int | None:
        if bytes(daddr) in self.peers:
            return self.peers[bytes(daddr)]
        return longest_prefix(self.prefixes, daddr)

    @staticmethod
    def test_run_refuses(f: bytes) -> bool:
        return test_run_refuses(f)

    def verdict(self, f: bytes) -> Verdict:
        n = len(f)
        if n >= ETH_HLEN and _u16(f, 12) in (ETH_P_8021Q, ETH_P_8021AD):
            return Verdict(TC_ACT_SHOT, R.TX_VLAN)     # its tag would be lost
        if n >= ETH_HLEN + 40 and _u16(f, 12) == ETH_P_IPV6 and f[14] >> 4 == 6:
            fam = self.peer_of(f[38:54])
            if fam is None:
                return Verdict(TC_ACT_SHOT, R.TX_NO_PEER)
            return Verdict(TC_ACT_REDIRECT, family=fam)
        if n < ETH_HLEN + 20 or _u16(f, 12) != ETH_P_IP:
            return Verdict(TC_ACT_SHOT, R.TX_NOT_IPV4)
        ver, ihl = f[14] >> 4, f[14] & 0x0F
        if ver != 4 or ihl < 5 or ETH_HLEN + ihl * 4 > n:
            return Verdict(TC_ACT_SHOT, R.TX_NOT_IPV4)
        fam = self.peer_of(f[30:34])
        if fam is None:
            return Verdict(TC_ACT_SHOT, R.TX_NO_PEER)
        return Verdict(TC_ACT_REDIRECT, family=fam)


def overhead(family: int) -> int:
    return wire.MRC_OVERHEAD_V4 if family == 4 else wire.MRC_OVERHEAD_V6


def test_run_refuses(f: bytes) -> bool:
    """BPF_PROG_TEST_RUN for skb programs (mrc_tx, mrc_rx_tc) rejects
    (EINVAL) an IPv4 or IPv6 frame shorter than its fixed IP header, before
    the program runs. mrc_tx never gets one from the stack; at tc ingress
    such a runt fails mrc_rx_tc's first parse and passes untouched, which
    mrc_rx's runs of the same frames check for the shared code."""
    et = _u16(f, 12) if len(f) >= ETH_HLEN else 0
    return (et == ETH_P_IP and len(f) < ETH_HLEN + 20) or (et == ETH_P_IPV6 and len(f) < ETH_HLEN + 40)
