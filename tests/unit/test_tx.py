"""mrc_tx (tc egress encap + spray) through BPF_PROG_TEST_RUN."""

from __future__ import annotations

import socket
import struct
import time
from collections import Counter

import pytest

import unit_pkt as pkt
from unit_dp import (OVL_DMAC, OVL_SMAC, PATHS, PEER, PEER_OVERLAY, TC_ACT_REDIRECT, TC_ACT_SHOT,
                     UDP_PORT, drops_delta, now_us)
from mrcctl.datapath import abi as wire
from mrcctl.datapath.maps import Datapath, changed
from mrcctl.instance.slots import build_slot_table


def inner_udp(payload_len: int = 100, dst: str = PEER_OVERLAY, tos: int = 0) -> bytes:
    return pkt.overlay(pkt.udp(40000, 5201, bytes(range(256))[:payload_len]), dst=dst, tos=tos,
                       ident=0x1234)


def inner_tcp(seq: int, payload_len: int = 200) -> bytes:
    return pkt.overlay(pkt.tcp(40001, 5201, seq, b"x" * payload_len), pkt.IPPROTO_TCP)


def only_drop(before: dict, after: dict, reason: wire.Reason):
    assert drops_delta(before, after) == {reason: 1}


def mrc_of(out: bytes, family: int) -> wire.MrcHdr:
    assert out[12:14] == struct.pack("!H", pkt.ETH_P_IP if family == 4 else pkt.ETH_P_IPV6)
    return pkt.mrc_hdr_of(out)


def test_objects_share_maps(dp):
    from mrcctl.datapath.libbpf import prog_info
    used = lambda prog: set(prog_info(prog.fd, map_ids=True)["map_ids"])  # noqa: E731
    both = used(dp.tx) & used(dp.rx)
    for name in ("mrc_cfg", "mrc_drops", "mrc_live", "mrc_peers"):
        assert dp.maps[name].id in both, name


def test_encap_ipv4(dp):
    dp.set_slots([0])
    inner = inner_udp(100, tos=0xB9)   # DSCP 46, ECN 01
    t0 = now_us()
    ret, out = dp.run_tx(inner)
    assert ret == TC_ACT_REDIRECT
    p = PATHS[0]
    assert len(out) == len(inner) + wire.MRC_OVERHEAD_V4
    # outer Ethernet
    assert out[0:6] == wire.mac_bytes(p.dmac)
    assert out[6:12] == wire.mac_bytes(p.smac)
    assert out[12:14] == b"\x08\x00"
    # outer IPv4
    ip = out[14:34]
    (vihl, tos, tot_len, ident, frag, ttl, proto, _ck, src, dst) = struct.unpack(
        "!BBHHHBBH4s4s", ip)
    assert vihl == 0x45
    assert tos == 0xB9                 # DSCP and ECN copied (RFC 6040 normal mode)
    assert tot_len == len(out) - 14
    assert ident == 0                  # low 16 bits of PSN 0
    assert frag == 0x4000              # DF, no fragment
    assert ttl == 64 and proto == pkt.IPPROTO_UDP
    assert socket.inet_ntoa(src) == p.saddr and socket.inet_ntoa(dst) == p.daddr
    assert wire.inet_csum(ip) == 0, "outer IPv4 header checksum must verify"
    # UDP
    sport, dport, ulen, uck = struct.unpack("!HHHH", out[34:42])
    assert sport == p.ev and dport == UDP_PORT
    assert ulen == len(out) - 34 and uck == 0
    # MRC header
    h = mrc_of(out, 4)
    assert h.version == wire.MRC_VERSION and h.type == wire.MsgType.DATA
    assert h.flags == 0 and h.path_id == 0 and h.psn == 0
    assert h.segs == 1 and h.seg_size == 0 and h.seq0 == 0
    assert h.fb_path == 0 and h.epoch == 0 and h.fb_ts == 0
    assert (h.tx_ts - t0) & 0xFFFFFFFF < 1_000_000
    # the inner IPv4 packet follows unchanged
    assert out[14 + wire.MRC_OVERHEAD_V4:] == inner[14:]


def test_encap_ipv6(dp):
    dp.set_slots([1])
    inner = inner_udp(333)
    ret, out = dp.run_tx(inner)
    assert ret == TC_ACT_REDIRECT
    p = PATHS[1]
    assert len(out) == len(inner) + wire.MRC_OVERHEAD_V6
    assert out[0:6] == wire.mac_bytes(p.dmac) and out[6:12] == wire.mac_bytes(p.smac)
    assert out[12:14] == b"\x86\xdd"
    first, plen, nh, hlim = struct.unpack("!IHBB", out[14:22])
    assert first >> 28 == 6
    assert first & 0xFFFFF == p.ev & 0xFFFFF, "flow label carries the EV"
    assert plen == len(out) - 14 - 40
    assert nh == pkt.IPPROTO_UDP and hlim == 64
    assert socket.inet_ntop(socket.AF_INET6, out[22:38]) == p.saddr
    assert socket.inet_ntop(socket.AF_INET6, out[38:54]) == p.daddr
    sport, dport, ulen, uck = struct.unpack("!HHHH", out[54:62])
    assert sport == p.ev and dport == UDP_PORT
    assert ulen == len(out) - 54 and uck == 0
    h = mrc_of(out, 6)
    assert h.version == 1 and h.type == wire.MsgType.DATA and h.path_id == 1
    assert out[14 + wire.MRC_OVERHEAD_V6:] == inner[14:]


def test_psn_increases_per_packet_and_tcp_seq0(dp):
    dp.set_slots([0, 3])
    psns, paths = [], []
    for i in range(6):
        ret, out = dp.run_tx(inner_tcp(1000 + 200 * i))
        assert ret == TC_ACT_REDIRECT
        h = mrc_of(out, 4)
        psns.append(h.psn)
        paths.append(h.path_id)
        assert h.seq0 == 1000 + 200 * i
        assert h.segs == 1 and h.seg_size == 0
        assert struct.unpack("!H", out[18:20])[0] == h.psn & 0xFFFF  # outer IP ID
    assert psns == list(range(6))
    assert paths == [0, 3, 0, 3, 0, 3]
    assert dp.seq().psn == 6 and dp.seq().cursor == 6


def _skb_ctx(gso_segs: int = 0, gso_size: int = 0) -> bytes:
    # struct __sk_buff (192 bytes): gso_segs at 164, gso_size at 176
    ctx = bytearray(192)
    struct.pack_into("=I", ctx, 164, gso_segs)
    struct.pack_into("=I", ctx, 176, gso_size)
    return bytes(ctx)


def test_unit_of_several_segments_reserves_psns(dp):
    """A unit of n wire packets reserves n PSNs and says so in its header.

    test_run cannot make a real GSO skb: gso_type stays 0, and
    bpf_skb_adjust_room refuses an skb with gso_size set but no known GSO
    type (see test_failed_encap_burns_no_psn). gso_segs alone (gso_size 0)
    is accepted, which exercises the PSN reservation."""
    dp.set_slots([0])
    ret, out = dp.run_tx(inner_tcp(7000, 1000), ctx_in=_skb_ctx(gso_segs=5))
    assert ret == TC_ACT_REDIRECT
    h = mrc_of(out, 4)
    assert (h.psn, h.segs, h.seg_size, h.seq0) == (0, 5, 0, 7000)
    ret, out = dp.run_tx(inner_tcp(12000, 100))
    assert mrc_of(out, 4).psn == 5
    assert dp.stats(0).tx_packets == 6
    assert dp.seq().psn == 6


def test_failed_encap_burns_no_psn(dp):
    dp.set_slots([0])
    before = dp.drops()
    ret, _ = dp.run_tx(inner_tcp(7000, 1000), ctx_in=_skb_ctx(gso_segs=5, gso_size=1000))
    assert ret == TC_ACT_SHOT
    only_drop(before, dp.drops(), wire.Reason.TX_ENCAP_FAIL)
    assert dp.seq().psn == 0
    assert dp.stats(0).tx_packets == 0


def test_tx_stats(dp):
    dp.set_slots([0])
    inner = inner_udp(100)
    for _ in range(3):
        dp.run_tx(inner)
    st = dp.stats(0)
    assert st.tx_packets == 3
    assert st.tx_bytes == 3 * (len(inner) + wire.MRC_OVERHEAD_V4)
    assert dp.stats(1).tx_packets == 0


def test_spray_follows_weights(dp):
    weights = [3, 1, 1, 1]
    table = build_slot_table(weights)
    dp.set_slots(table)
    inner = inner_udp(64)
    n = 10_000
    seen = Counter()
    for _ in range(n):
        ret, out = dp.run_tx(inner)      # a fresh copy of the packet each run
        assert ret == TC_ACT_REDIRECT
        fam = 6 if out[12:14] == b"\x86\xdd" else 4
        seen[mrc_of(out, fam).path_id] += 1
    total_w = sum(weights)
    for path, w in enumerate(weights):
        expect = n * w / total_w
        assert abs(seen[path] - expect) <= 0.05 * expect, (path, seen, expect)
        assert dp.stats(path).tx_packets == seen[path]
    assert dp.seq().psn == n


def test_unusable_paths_are_skipped(dp):
    dp.set_slots(build_slot_table([1, 1, 1, 1], 8))
    dp.set_live(1, state=wire.PathState.ASSUMED_BAD)
    dp.set_paths([PATHS[0], PATHS[1], wire.replace(PATHS[2], admin=wire.PathState.DENIED),
                  PATHS[3]])
    seen = Counter()
    for _ in range(40):
        ret, out = dp.run_tx(inner_udp(64))
        assert ret == TC_ACT_REDIRECT
        seen[mrc_of(out, 4).path_id] += 1
    assert set(seen) == {0, 3}


def test_no_usable_path_drops(dp):
    # min_active 0: nothing forces a send on a bad path (tests/unit/test_health.py)
    dp.set_peer(PEER, n_paths=len(PATHS), overlay=PEER_OVERLAY, min_active=0)
    dp.set_slots([0, 1, 2, 3])
    for i in range(4):
        dp.set_live(i, state=wire.PathState.ASSUMED_BAD)
    before = dp.drops()
    ret, _ = dp.run_tx(inner_udp(64))
    assert ret == TC_ACT_SHOT
    only_drop(before, dp.drops(), wire.Reason.TX_NO_PATH)


def test_not_ip_dropped(dp):
    arp = pkt.eth("ff:ff:ff:ff:ff:ff", OVL_SMAC, pkt.ETH_P_ARP) + bytes(28)
    # ethertype IPv6, version nibble 5 (test_run refuses a runt IPv6 frame)
    v6_bad = pkt.eth(OVL_DMAC, OVL_SMAC, pkt.ETH_P_IPV6) + b"\x55" + pkt.ipv6(
        "fd99::1", "fd99::2", pkt.IPPROTO_UDP, bytes(8))[1:]
    for frame in (arp, v6_bad):
        before = dp.drops()
        ret, _ = dp.run_tx(frame)
        assert ret == TC_ACT_SHOT
        only_drop(before, dp.drops(), wire.Reason.TX_NOT_IPV4)


def test_neighbour_discovery_never_leaves(dp):
    """IPv6 ND, router solicitations and MLD on the overlay (sent to
    multicast or link-local addresses, owned by no peer) are dropped as
    tx_no_peer: nothing of the overlay's own link protocol is sprayed."""
    for dst, body in (("ff02::1:ff00:2", bytes([135, 0, 0, 0]) + bytes(20)),     # neighbour solicitation
                      ("ff02::2", bytes([133, 0, 0, 0]) + bytes(4)),             # router solicitation
                      ("ff02::16", bytes([143, 0, 0, 0]) + bytes(24)),           # MLDv2 report
                      ("fe80::2", bytes([128, 0, 0, 0]) + bytes(4))):            # link-local echo
        frame = pkt.eth(OVL_DMAC, OVL_SMAC, pkt.ETH_P_IPV6) + pkt.ipv6("fd99::1", dst, pkt.IPPROTO_ICMPV6, body)
        before = dp.drops()
        ret, _ = dp.run_tx(frame)
        assert ret == TC_ACT_SHOT, dst
        only_drop(before, dp.drops(), wire.Reason.TX_NO_PEER)


def test_unknown_destination_dropped(dp):
    before = dp.drops()
    ret, _ = dp.run_tx(inner_udp(64, dst="10.99.0.77"))
    assert ret == TC_ACT_SHOT
    only_drop(before, dp.drops(), wire.Reason.TX_NO_PEER)
    # a peer entry without paths is no peer either
    dp.set_peer(PEER, n_paths=0)
    before = dp.drops()
    ret, _ = dp.run_tx(inner_udp(64))
    assert ret == TC_ACT_SHOT
    only_drop(before, dp.drops(), wire.Reason.TX_NO_PEER)


def test_feedback_echo(dp):
    dp.set_slots([0])
    # the peer's path 2 delivered to us recently: echo it
    dp.set_seq(fb_cursor=2)
    dp.set_live(2, last_rx_ns=time.monotonic_ns(), last_rx_ts=0xABCDEF01)
    _, out = dp.run_tx(inner_udp(64))
    h = mrc_of(out, 4)
    assert h.flags & wire.MRC_F_FEEDBACK
    assert h.fb_path == 2 and h.fb_ts == 0xABCDEF01
    # fb_cursor moved on to path 3, which received nothing: no echo
    _, out = dp.run_tx(inner_udp(64))
    assert not mrc_of(out, 4).flags & wire.MRC_F_FEEDBACK
    # stale receive timestamps (older than 1 s) are not echoed
    dp.set_seq(fb_cursor=2, psn=2)
    dp.set_live(2, last_rx_ns=time.monotonic_ns() - 2_000_000_000, last_rx_ts=5)
    _, out = dp.run_tx(inner_udp(64))
    assert not mrc_of(out, 4).flags & wire.MRC_F_FEEDBACK


def test_an_echo_says_held_when_its_receipt_waited(dp):
    """The echo of a receipt that waited FEEDBACK_HELD_NS (200 us) or more
    for a reverse packet says so (MRC_F_EHELD): its age includes the wait.
    One that leaves right after its receipt does not."""
    dp.set_slots([0])
    dp.set_seq(fb_cursor=2)
    dp.set_live(2, last_rx_ns=time.monotonic_ns(), last_rx_ts=0x100)
    h = mrc_of(dp.run_tx(inner_udp(64))[1], 4)
    assert h.fb_path == 2 and h.flags & wire.MRC_F_FEEDBACK and not h.flags & wire.MRC_F_EHELD
    dp.set_seq(fb_cursor=2, psn=2)
    dp.set_live(2, last_rx_ns=time.monotonic_ns() - 2_000_000, last_rx_ts=0x200)
    h = mrc_of(dp.run_tx(inner_udp(64))[1], 4)
    assert (h.fb_path, h.fb_ts) == (2, 0x200) and h.flags & wire.MRC_F_EHELD


def test_table_flip(dp):
    """The control plane fills the idle table and flips mrc_peer.table."""
    dp.set_slots([0], which=0)
    dp.set_slots([3], which=1)
    _, out = dp.run_tx(inner_udp(64))
    assert mrc_of(out, 4).path_id == 0
    dp.set_peer(PEER, n_paths=len(PATHS), table=1, overlay=PEER_OVERLAY)
    _, out = dp.run_tx(inner_udp(64))
    assert mrc_of(out, 4).path_id == 3


def test_zero_dmac_uses_neighbour_redirect(dp):
    dp.set_paths([wire.replace(PATHS[0], dmac="00:00:00:00:00:00")])
    dp.set_slots([0])
    ret, out = dp.run_tx(inner_udp(64))
    assert ret == TC_ACT_REDIRECT
    assert out[0:6] == bytes(6)


@pytest.mark.parametrize("size", [60, 1500, 3000])
def test_sizes(dp, size):
    dp.set_slots([0])
    inner = inner_udp(size - 14 - 28)
    ret, out = dp.run_tx(inner)
    assert ret == TC_ACT_REDIRECT and len(out) == len(inner) + wire.MRC_OVERHEAD_V4


def test_tx_psns_are_read_from_the_maps_memory(dp):
    """The agent's look at every peer's tx PSN (Datapath.tx_psns, an mmap of
    mrc_peer_seq): what mrc_tx reserved, live, with no second read."""

    class Record:
        overlay = "test"

        def read(self):
            return {"map_ids": {name: m.id for name, m in dp.maps.items()}}

    live = Datapath(Record())
    dp.set_slots([0])
    before = live.tx_psns(PEER + 2)
    assert before == [0] * (PEER + 2)
    dp.run_tx(inner_tcp(7000, 1000), ctx_in=_skb_ctx(gso_segs=5))
    dp.run_tx(inner_tcp(12000, 100))
    after = live.tx_psns(PEER + 2)
    assert after[PEER] == dp.seq().psn == 6
    assert changed(after, before) == [PEER] and changed(after, after) == [] \
        and changed(after, None) == list(range(PEER + 2))
    # the peer's newest covered send time, where the agent's probe policy reads it
    seq = dp.seq()
    seq.ack_max_ns = 123_456_789
    dp.maps["mrc_peer_seq"].update(wire.u32(PEER), seq.pack())
    assert live.ack_max_ns(PEER) == 123_456_789 and live.tx_psns(PEER + 1)[PEER] == 6
    with pytest.raises(ValueError, match="not an mmapable array"):
        live.map("mrc_cfg").mapped()
    live.map("mrc_peer_seq").close()
