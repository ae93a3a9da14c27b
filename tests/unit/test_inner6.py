"""Any traffic (issue #14.3) on the real programs: inner IPv6 through mrc_tx
then mrc_rx, PSN per wire segment of an inner IPv6 TCP unit, the one-PSN
rule for a non-TCP inner IPv6 unit, retransmission detection for inner
IPv6 TCP, prefixes behind a peer found by longest prefix on transmit, the
owner check of inner IPv6 sources on receive, and the MAC over inner IPv6
addresses. Receive tests run once per hook (the rx_hook fixture)."""

from __future__ import annotations

import struct
import time

import unit_pkt as pkt
from unit_dp import (LOCAL_OVERLAY, LOCAL_OVERLAY6, PATHS, PEER, PEER_OVERLAY, PEER_OVERLAY6,
                     TC_ACT_REDIRECT, TC_ACT_SHOT, UDP_PORT, XDP_DROP, XDP_PASS, drops_delta)
from mrcctl.datapath import abi as wire
from mrcctl.datapath.auth import mac

R = wire.Reason
OTHER = 5                                    # a second peer, for longest-prefix tests


def loopback(dp):
    """What we send comes back to us as from the peer: for rx our overlay
    addresses are the peer's and the peer's are served here (mrc_peer_ip,
    where tx sends, stays as it is)."""
    for ours, theirs in ((LOCAL_OVERLAY, PEER_OVERLAY), (LOCAL_OVERLAY6, PEER_OVERLAY6)):
        dp.set_owner(ours, PEER)
        dp.set_owner(theirs, wire.MRC_OWNER_LOCAL)


def hdr_of(out: bytes) -> wire.MrcHdr:
    return pkt.mrc_hdr_of(out)


def outer_len(out: bytes) -> int:
    return 14 + (40 if out[12:14] == b"\x86\xdd" else 20) + 8 + wire.MRC_HDR_LEN


def skb_ctx(gso_segs: int = 0) -> bytes:
    ctx = bytearray(192)                     # struct __sk_buff: gso_segs at 164
    struct.pack_into("=I", ctx, 164, gso_segs)
    return bytes(ctx)


def tcp6(seq: int, n: int = 700, dst: str = PEER_OVERLAY6) -> bytes:
    return pkt.overlay6(pkt.tcp(40001, 5201, seq, b"z" * n), pkt.IPPROTO_TCP, dst=dst)


def udp6(n: int = 300, dst: str = PEER_OVERLAY6) -> bytes:
    return pkt.overlay6(pkt.udp(40000, 5201, bytes(range(256))[:n] * 2), dst=dst)


# --- tx then rx --------------------------------------------------------------

def test_inner_ipv6_tcp_and_udp_through_tx_then_rx(dp, rx_hook):
    """Both outer families: the output of rx is the original inner IPv6
    packet byte for byte, behind ethertype IPv6; one wire packet counted per
    path on each side; nothing dropped."""
    loopback(dp)
    for path in (0, 1):                      # outer IPv4, outer IPv6
        dp.set_slots([path])
        for inner in (tcp6(7000 + path), udp6()):
            ret, outer = dp.run_tx(inner)
            assert ret == TC_ACT_REDIRECT
            assert hdr_of(outer).segs == 1 and outer[outer_len(outer):] == inner[14:]
            ret, out = dp.run_rx(outer)
            assert ret == XDP_PASS
            assert out[12:14] == b"\x86\xdd" and out[14:] == inner[14:] and out[:12] == outer[:12]
        st = dp.stats(path)
        assert (st.tx_packets, st.rx_packets) == (2, 2)
    assert dp.drops() == {r: 0 for r in wire.Reason}


def test_inner_ipv6_ecn_crosses_the_tunnel(dp, rx_hook):
    """RFC 6040 for inner IPv6: the traffic class's ECN goes out, a fabric's
    CE comes back into bits 4-5 of the second byte (no checksum)."""
    loopback(dp)
    dp.set_slots([0])
    inner = pkt.overlay6(pkt.tcp(1, 2, 3, b"e" * 50), pkt.IPPROTO_TCP, tc=0xB8 | 0x02)   # EF, ECT(0)
    ret, outer = dp.run_tx(inner)
    assert ret == TC_ACT_REDIRECT and outer[15] == 0xB8 | 0x02          # outer IPv4 TOS
    ce = bytearray(outer)
    ce[15] |= 0x03
    ce[24:26] = b"\0\0"
    ce[24:26] = struct.pack("!H", wire.inet_csum(bytes(ce[14:34])))
    ret, out = dp.run_rx(bytes(ce))
    assert ret == XDP_PASS
    assert (out[15] >> 4) & 3 == 3 and out[14:15] == inner[14:15] and out[16:] == inner[16:]


def test_inner_ipv6_tcp_unit_gets_a_psn_per_segment(dp, rx_hook):
    """A 4-segment inner IPv6 TCP unit: the receiver numbers each segment
    from its TCP sequence number (psn + (seq - seq0) / seg_size); XDP sees
    the segments one by one, tc the whole unit as one GSO skb; both account
    every wire PSN, and the hedged copy's segments are all duplicates."""
    seq0, seg, n, psn = 50_000, 400, 4, 300
    hdr = dict(psn=psn, segs=n, seg_size=seg, seq0=seq0)

    def inner(first: int, count: int) -> bytes:
        return pkt.inner_ip6(seg * count, pkt.IPPROTO_TCP, seq=seq0 + first * seg)

    def unit(**kw):
        if dp.rx_hook == "tc":
            return [(pkt.mrc_frame(inner=inner(0, n), **hdr, **kw), n)]
        return [(pkt.mrc_frame(inner=inner(i, 1), **hdr, **kw), 0) for i in range(n)]

    seen = []
    for frame, segs in unit():
        ret, out = dp.run_rx(frame, gso_segs=segs)
        assert ret == XDP_PASS and out[12:14] == b"\x86\xdd"
        seen.append(dp.seq().rx_psn_max)
    assert seen[-1] == psn + n - 1
    if dp.rx_hook == "xdp":
        assert seen == [psn + i for i in range(n)]
    st = dp.stats(0)
    assert (st.rx_packets, st.rx_ooo, st.rx_dup) == (n, 0, 0)

    hdr.update(psn=psn + n, flags=wire.MRC_F_HEDGE)
    before = dp.drops()
    for frame, segs in unit():
        assert dp.run_rx(frame, gso_segs=segs)[0] == XDP_PASS
    for frame, segs in unit():
        assert dp.run_rx(frame, gso_segs=segs)[0] == XDP_DROP
    assert drops_delta(before, dp.drops()) == {R.RX_DUPLICATE: 1 if dp.rx_hook == "tc" else n}


def test_non_tcp_inner_ipv6_unit_takes_one_psn_and_no_hedge(dp):
    """A non-TCP inner IPv6 unit of several segments (UDP GSO) has nothing
    that tells its segments apart: it goes out as one PSN (header segs 1,
    no MRC_F_IPID) and is never hedged, even in duplicate-send mode; its
    wire packets are still counted. An inner IPv4 one keeps its IPv4 ID
    numbering and is hedged."""
    dp.set_cfg(udp_port=UDP_PORT, flags=wire.MRC_CFG_HEDGE_ALL)
    dp.set_slots([0])
    ret, out = dp.run_tx(udp6(), ctx_in=skb_ctx(gso_segs=5))
    assert ret == TC_ACT_REDIRECT
    h = hdr_of(out)
    assert (h.psn, h.segs, h.flags & (wire.MRC_F_IPID | wire.MRC_F_HEDGE)) == (0, 1, 0)
    assert dp.seq().psn == 1 and dp.stats(0).tx_packets == 5
    v4 = pkt.overlay(pkt.udp(40000, 5201, b"u" * 300), ident=0x1234)
    ret, out = dp.run_tx(v4, ctx_in=skb_ctx(gso_segs=5))
    assert ret == TC_ACT_REDIRECT
    h = hdr_of(out)
    assert (h.psn, h.segs, h.seq0) == (1, 5, 0x1234)
    assert h.flags & wire.MRC_F_IPID and h.flags & wire.MRC_F_HEDGE


def test_inner_ipv6_tcp_retransmission_takes_the_freshest_path(dp):
    """retx.h for inner IPv6 TCP: a unit that ends at or below its flow's
    highest sequence sent goes out on the path that confirmed delivery most
    recently; the flow is told apart from an IPv4 one with the same ports."""
    dp.set_cfg(udp_port=UDP_PORT, flags=wire.MRC_CFG_LIVENESS, dead_after_us=10**9,
               hedge_after_us=10**9 // 2, recover_probes=3)
    dp.set_slots([0])
    dp.set_seq(ack_max_ns=time.monotonic_ns(), ack_max_path=2)

    def path(frame):
        ret, out = dp.run_tx(frame)
        assert ret == TC_ACT_REDIRECT
        return hdr_of(out).path_id

    assert path(tcp6(5000, 300)) == 0
    assert path(tcp6(5300, 300)) == 0
    assert path(tcp6(5000, 300)) == 2                 # resent: the freshest path
    v4 = pkt.overlay(pkt.tcp(40001, 5201, 5000, b"x" * 300), pkt.IPPROTO_TCP)
    assert path(v4) == 0                              # another flow: new data
    assert dp.stats(2).tx_steered == 1


# --- prefixes behind a peer ----------------------------------------------------

def test_tx_finds_the_peer_of_a_prefix_by_longest_match(dp):
    """mrc_peer_ip is an LPM trie per family-tagged key: an address inside a
    peer's prefix goes to that peer, the longest prefix wins between two
    peers, and an IPv4 prefix never takes an IPv6 destination."""
    dp.set_slots([0])
    dp.set_peer(OTHER, n_paths=1, overlay="10.99.0.5")
    dp.set_paths([PATHS[3]], peer=OTHER)
    dp.set_slots([0], peer=OTHER)
    for prefix, peer in (("10.244.0.0/16", PEER), ("10.244.3.0/24", OTHER),
                         ("fd00:3::/64", OTHER), ("fd00::/16", PEER), ("0.0.0.0/1", OTHER)):
        dp.set_route(prefix, peer)

    def sent_to(frame) -> int | None:
        before = (dp.seq(PEER).psn, dp.seq(OTHER).psn)
        ret, out = dp.run_tx(frame)
        if ret != TC_ACT_REDIRECT:
            return None
        after = (dp.seq(PEER).psn, dp.seq(OTHER).psn)
        return PEER if after[0] > before[0] else OTHER if after[1] > before[1] else -1

    def v4(dst):
        return pkt.overlay(pkt.udp(1, 2, b"4" * 40), dst=dst)

    def v6(dst):
        return pkt.overlay6(pkt.udp(1, 2, b"6" * 40), dst=dst)

    assert sent_to(v4("10.244.7.9")) == PEER
    assert sent_to(v4("10.244.3.9")) == OTHER         # the longer prefix
    assert sent_to(v4("10.99.0.2")) == PEER           # the peer's own address (/32)
    assert sent_to(v4("10.1.2.3")) == OTHER           # 0.0.0.0/1
    assert sent_to(v6("fd00:3::77")) == OTHER
    assert sent_to(v6("fd00:4::77")) == PEER
    assert sent_to(v6(PEER_OVERLAY6)) == PEER
    before = dp.drops()
    for frame in (v6("fe80::1"), v6("::ffff:10.244.3.9"), v4("200.1.1.1")):
        ret, _ = dp.run_tx(frame)
        assert ret == TC_ACT_SHOT
    assert drops_delta(before, dp.drops()) == {R.TX_NO_PEER: 3}


def test_rx_owner_check_of_inner_ipv6_and_prefixes(dp, rx_hook):
    """mrc_rx delivers an inner packet only from a source the sending peer
    owns - its overlay address or a prefix behind it - to a destination
    served here (our address or overlay.prefixes); else RX_INNER_SRC /
    RX_INNER_DST, both families."""
    dp.set_owner("fd00:3::/64", PEER)
    dp.set_owner("10.244.3.0/24", PEER)
    dp.set_owner("fd00:9::/64", OTHER)                # another peer's prefix
    dp.set_owner("fd00:1:5::/48", wire.MRC_OWNER_LOCAL)   # served here (overlay.prefixes)
    cases = [
        (pkt.inner_ip6(src="fd00:3::42"), XDP_PASS, None),
        (pkt.inner_ip6(src="fd00:3::42", dst="fd00:1:5::9"), XDP_PASS, None),
        (pkt.inner_ip6(src="fd00:9::42"), XDP_DROP, R.RX_INNER_SRC),
        (pkt.inner_ip6(src="fd00:4::42"), XDP_DROP, R.RX_INNER_SRC),
        (pkt.inner_ip6(src=LOCAL_OVERLAY6), XDP_DROP, R.RX_INNER_SRC),
        (pkt.inner_ip6(dst="fd00:3::1"), XDP_DROP, R.RX_INNER_DST),
        (pkt.inner_ip6(dst="fd00:2::1"), XDP_DROP, R.RX_INNER_DST),
        (pkt.ipv4("10.244.3.7", LOCAL_OVERLAY, pkt.IPPROTO_UDP, pkt.udp(1, 2, b"x" * 20)), XDP_PASS, None),
        (pkt.ipv4("10.244.4.7", LOCAL_OVERLAY, pkt.IPPROTO_UDP, pkt.udp(1, 2, b"x" * 20)), XDP_DROP,
         R.RX_INNER_SRC),
    ]
    for k, (inner, verdict, reason) in enumerate(cases):
        before = dp.drops()
        ret, out = dp.run_rx(pkt.mrc_frame(inner=inner, psn=1000 + k))
        assert ret == verdict, k
        assert drops_delta(before, dp.drops()) == ({reason: 1} if reason else {}), k
        if verdict == XDP_PASS:
            assert out[14:] == inner


# --- authentication -------------------------------------------------------------

KEY = bytes.fromhex("00112233445566778899aabbccddeeff")


def test_mac_covers_inner_ipv6_addresses(dp, rx_hook):
    """With a key, mrc_tx signs an inner IPv6 unit over the header and all
    44 bytes of the IPv6 block (a 72-byte message, mrcctl/datapath/auth.py);
    mrc_rx delivers it, and refuses the same frame with any bit of either
    inner address changed, even in the 96 bits an IPv4 block would not hold."""
    dp.maps["mrc_auth"].update(wire.u32(PEER), wire.AuthKey.of(KEY).pack())
    loopback(dp)
    dp.set_slots([0])
    inner = tcp6(9000, 200)
    ret, out = dp.run_tx(inner)
    assert ret == TC_ACT_REDIRECT
    h = outer_len(out)
    hdr, got = out[h - wire.MRC_HDR_LEN:h], out[h:h + wire.MRC_AUTH_LEN]
    assert wire.decode_mrc_hdr(hdr).flags & wire.MRC_F_AUTH
    assert got == mac(KEY, hdr, inner[14:])
    assert wire.AuthInner.of_inner(inner[14:]).v6 == 6
    assert len(hdr + wire.AuthInner.of_inner(inner[14:]).block()) == wire.MRC_AUTH_MSG_LEN6
    assert dp.run_rx(out)[0] == XDP_PASS
    ioff = h + wire.MRC_AUTH_LEN
    for at in (ioff + 8, ioff + 19, ioff + 23, ioff + 24, ioff + 39):   # src bits 0, 88, 120; dst 0, 120
        bad = bytearray(out)
        bad[at] ^= 0x01
        before = dp.drops()
        assert dp.run_rx(bytes(bad))[0] == XDP_DROP, at
        assert drops_delta(before, dp.drops()) == {R.RX_BAD_MAC: 1}, at


# --- path MTU ---------------------------------------------------------------------

def test_inner_ipv6_too_big_becomes_icmpv6_to_the_sender(dp):
    """An inner IPv6 unit too big for the MTU an ICMP recorded for its path
    becomes an ICMPv6 "packet too big" (type 2) to the inner sender, from
    the inner destination, naming the overlay MTU of the peer's recorded
    paths, quoting the IPv6 header and 64 bytes behind it, its checksum
    right over the pseudo-header; it goes back up the overlay (tx_too_big).
    IPv6 has no DF: every such unit is answered."""
    import socket
    from test_pmtu import set_mtu
    dp.set_cfg(udp_port=UDP_PORT, overlay_ifindex=7)
    dp.set_slots([0])
    set_mtu(dp, 0, 1400)
    # exactly the path MTU: sent
    ret, out = dp.run_tx(pkt.overlay6(pkt.udp(1, 2, b"f" * (1400 - wire.MRC_OVERHEAD_V4 - 48))))
    assert ret == TC_ACT_REDIRECT and hdr_of(out).path_id == 0
    frame = pkt.overlay6(pkt.udp(40000, 5201, b"b" * (1400 - wire.MRC_OVERHEAD_V4 - 48 + 1)))
    before = dp.drops()
    ret, out = dp.run_tx(frame)
    assert ret == TC_ACT_REDIRECT                                 # into the overlay's ingress
    assert drops_delta(before, dp.drops()) == {R.TX_TOO_BIG: 1}
    assert out[0:6] == frame[6:12] and out[6:12] == frame[0:6] and out[12:14] == b"\x86\xdd"
    ip6 = out[14:54]
    first, plen, nh, hlim = struct.unpack("!IHBB", ip6[:8])
    assert (first >> 28, nh, hlim, plen) == (6, 58, 64, len(out) - 54)
    src, dst = ip6[8:24], ip6[24:40]
    assert (socket.inet_ntop(socket.AF_INET6, src), socket.inet_ntop(socket.AF_INET6, dst)) == \
        (PEER_OVERLAY6, LOCAL_OVERLAY6)
    icmp = out[54:]
    typ, code, _ck, mtu = struct.unpack("!BBHI", icmp[:8])
    assert (typ, code, mtu) == (2, 0, 1400 - wire.MRC_OVERHEAD_V4)
    pseudo = src + dst + struct.pack("!IxxxB", len(icmp), 58)
    assert wire.inet_csum(pseudo + icmp) == 0
    assert icmp[8:] == frame[14:14 + 40 + 64]
