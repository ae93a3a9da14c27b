"""Receiver reorder/loss accounting (bpf/reorder.h) through BPF_PROG_TEST_RUN:
crafted PSN sequences into mrc_rx give exact counters and histogram buckets."""

from __future__ import annotations

import pytest

import unit_pkt as pkt
from unit_dp import (LOCAL_OVERLAY, PATHS, PEER, PEER_OVERLAY, XDP_PASS)
from mrcctl.datapath import abi as wire

# every test here runs against mrc_rx (XDP) and mrc_rx_tc (tc ingress)
pytestmark = pytest.mark.usefixtures("rx_hook")


def frame(psn: int, path: int = 0, *, segs: int = 1, seg_size: int = 0, seq0: int = 0,
          seq: int = 0) -> bytes:
    """A DATA frame from the peer on the path's plane carrying one TCP segment."""
    inner = pkt.ipv4(PEER_OVERLAY, LOCAL_OVERLAY, pkt.IPPROTO_TCP,
                     pkt.tcp(5201, 40001, seq, b"d" * 100))
    family = PATHS[path].family if path < len(PATHS) else 4
    return pkt.mrc_frame(family, inner=inner, path_id=path, psn=psn, segs=segs, seg_size=seg_size,
                         seq0=seq0)


def feed(dp, psns, path: int = 0):
    for p in psns:
        if isinstance(p, tuple):
            p, path_ = p
        else:
            path_ = path
        ret, _ = dp.run_rx(frame(p, path_))
        assert ret == XDP_PASS


def reorder(dp, peer: int = PEER) -> wire.Reorder:
    return wire.Reorder.sum(dp.maps["mrc_reorder"].lookup_percpu(wire.u32(peer)))


def hist(**buckets) -> list[int]:
    """hist(b0=1, b3=2) -> [1, 0, 0, 2, 0, ...] (16 buckets)."""
    h = [0] * wire.MRC_HIST_BUCKETS
    for k, v in buckets.items():
        h[int(k[1:])] = v
    return h


def test_in_order_counts_nothing(dp):
    feed(dp, range(200))
    r = reorder(dp)
    assert (r.rx_packets, r.ooo, r.dup, r.lost, r.late, r.resync) == (200, 0, 0, 0, 0, 0)
    assert r.hist == hist()
    assert dp.seq().rx_psn_max == 199


def test_first_packet_may_start_anywhere(dp):
    feed(dp, range(1_000_000, 1_000_100))
    r = reorder(dp)
    assert (r.ooo, r.dup, r.lost) == (0, 0, 0)
    assert dp.seq().rx_psn_max == 1_000_099


def test_out_of_order_distances_and_buckets(dp):
    # 3 arrives 2 below the top (5), 4 one below, 7 thirteen below 20, 100
    # three hundred below 400 (bucket 8; the distances are kept per peer)
    feed(dp, [0, 1, 2, 5, (3, 3), (4, 3), 6, 20, 7, 400, (100, 2)])
    r = reorder(dp)
    assert r.ooo == 4 and r.dup == 0 and r.lost == 0
    assert r.hist == hist(b0=1, b1=1, b3=1, b8=1)
    p3 = dp.stats(3)
    assert p3.rx_ooo == 2
    p2 = dp.stats(2)
    assert p2.rx_ooo == 1
    assert dp.stats(0).rx_ooo == 1 and dp.stats(0).rx_packets == 8
    assert dp.seq().rx_psn_max == 400


def test_duplicates(dp):
    feed(dp, [0, 1, 2, (2, 1), (1, 3), 3, (3, 3), 10, (10, 1)])
    r = reorder(dp)
    assert r.dup == 4 and r.ooo == 0 and r.lost == 0
    assert dp.stats(1).rx_dup == 2 and dp.stats(3).rx_dup == 2 and dp.stats(0).rx_dup == 0


def test_late_fill_of_a_gap_is_out_of_order_not_loss(dp):
    feed(dp, [0, 1, 2, 4, 5, 6])
    feed(dp, [3])
    r = reorder(dp)
    assert (r.ooo, r.lost, r.dup) == (1, 0, 0)
    assert r.hist == hist(b1=1)    # 3 arrived 3 below the top 6: bucket 2..3


def test_gap_not_filled_within_the_window_is_loss(dp):
    # PSNs 0..255 except 50 and 51, then the top jumps to 4096 (word 64):
    # word 0 (PSNs 0..63) leaves the 64-word window with two holes.
    feed(dp, [p for p in range(256) if p not in (50, 51)])
    assert reorder(dp).lost == 0
    feed(dp, [4096])
    r = reorder(dp)
    assert r.lost == 2 and r.late == 0 and r.ooo == 0
    # 50 arrives after its word left: late (net loss = lost - late = 1)
    feed(dp, [(50, 1)])
    # 100 is in word 1, still inside the window, and already received
    feed(dp, [(100, 2)])
    # 4000 (word 62) never arrived: out of order by 96 (bucket 6)
    feed(dp, [4000])
    r = reorder(dp)
    assert (r.lost, r.late, r.dup, r.ooo) == (2, 1, 1, 1)
    assert r.hist == hist(b6=1)
    assert dp.stats(1).rx_late == 1 and dp.stats(2).rx_dup == 1


def test_jump_beyond_the_window_counts_whole_words(dp):
    feed(dp, range(64))             # word 0 complete
    feed(dp, [64 * 200])            # words 1..199 never arrived; 65..199 wholly
    r = reorder(dp)
    # left the window: words 1..136 (everything below word 200 - 63)
    assert r.lost == 136 * 64
    assert r.ooo == 0 and r.dup == 0


def test_sender_restart_resynchronises(dp):
    feed(dp, range(100, 200))
    feed(dp, [1 << 30, (1 << 30) + 1])
    r = reorder(dp)
    assert r.resync == 1 and r.lost == 0
    assert dp.seq().rx_psn_max == (1 << 30) + 1


def test_psn_wraps_at_32_bits(dp):
    top = 2**32 - 3
    feed(dp, [top, top + 1, top + 2])
    feed(dp, [(top + 3) & 0xFFFFFFFF, (top + 5) & 0xFFFFFFFF, (top + 4) & 0xFFFFFFFF])
    r = reorder(dp)
    assert (r.ooo, r.dup, r.lost, r.resync) == (1, 0, 0, 0)
    assert r.hist == hist(b0=1)
    assert dp.seq().rx_psn_max == 2


def test_segment_psn_from_tcp_sequence(dp):
    """Segments of one GSO unit (psn 10, 4 segments of 100 bytes from seq0
    5000) numbered by their inner TCP sequence: arriving 2, 0, 1, 3 gives
    PSN 12, 10, 11, 13: two out of order."""
    feed(dp, range(10))
    for i in (2, 0, 1, 3):
        ret, _ = dp.run_rx(frame(10, 0, segs=4, seg_size=100, seq0=5000, seq=5000 + 100 * i))
        assert ret == XDP_PASS
    r = reorder(dp)
    assert r.ooo == 2 and r.dup == 0
    assert r.hist == hist(b0=1, b1=1)
    assert dp.seq().rx_psn_max == 13


def test_psn_seen_while_another_cpu_moves_the_top_is_not_a_loss(dp):
    """A PSN above the top that arrives while another CPU holds the window's
    top is counted (rx_packets, unmarked) but not marked, since its word may
    be cleared under it; the window later counts it lost, and net_lost takes
    it back out."""
    from mrcctl.observe.snapshot import _reorder
    feed(dp, range(64))
    key = wire.u32(PEER)
    win = wire.RxWin.unpack(dp.maps["mrc_rx_win"].lookup(key))
    dp.maps["mrc_rx_win"].update(key, wire.replace(win, advancing=1).pack())   # another CPU's
    feed(dp, [64])
    r = reorder(dp)
    assert (r.rx_packets, r.unmarked, r.lost) == (65, 1, 0)
    win = wire.RxWin.unpack(dp.maps["mrc_rx_win"].lookup(key))
    dp.maps["mrc_rx_win"].update(key, wire.replace(win, advancing=0).pack())
    feed(dp, range(65, 128))
    feed(dp, [127 + 64 * 64])          # word 65: word 1 (PSNs 64..127) leaves the window
    r = reorder(dp)
    assert (r.lost, r.late, r.unmarked) == (1, 0, 1)

    class _Dp:      # what stats._reorder reads
        def map(self, name):
            return dp.maps[name]
    assert _reorder(_Dp(), PEER)["net_lost"] == 0


@pytest.mark.parametrize("n_paths", [4])
def test_status_snapshot_shape_of_reorder(n_paths):
    """The per peer struct sums per CPU like the path counters."""
    a = wire.Reorder(rx_packets=1, ooo=2, hist=[1] + [0] * 15).pack()
    b = wire.Reorder(rx_packets=3, lost=4, hist=[0, 2] + [0] * 14).pack()
    s = wire.Reorder.sum([a, b])
    assert (s.rx_packets, s.ooo, s.lost) == (4, 2, 4)
    assert s.hist[:2] == [1, 2]
    assert wire.hist_label(0, 16) == "1" and wire.hist_label(3, 16) == "8-15"
    assert wire.hist_label(15, 16) == "32768+"


# --- sender side: path delay from fresh feedback echoes ----------------------

def feedback_frame(fb_path: int, fb_ts: int, psn: int, flags: int = wire.MRC_F_FEEDBACK) -> bytes:
    inner = pkt.ipv4(PEER_OVERLAY, LOCAL_OVERLAY, pkt.IPPROTO_TCP, pkt.tcp(5201, 40001, 0, b"a"))
    return pkt.mrc_frame(inner=inner, path_id=0, psn=psn, flags=flags,
                         fb_path=fb_path, fb_ts=fb_ts)


def delay(dp, path: int) -> wire.PathDelay:
    return wire.PathDelay.unpack(dp.maps["mrc_path_delay"].lookup(wire.DEFAULT_SIZING.path_key(PEER, path)))


def test_path_delay_counts_fresh_echoes_only(dp):
    from unit_dp import now_us
    ts = (now_us() - 3000) & 0xFFFFFFFF           # a packet we sent 3 ms ago
    assert dp.run_rx(feedback_frame(2, ts, 0))[0] == XDP_PASS
    d = delay(dp, 2)
    assert d.samples == 1 and d.last_fb_ts == ts
    assert 3000 <= d.rtt_us < 3000 + 500_000 and d.ewma_us == d.rtt_us
    # the peer echoes the same packet again (nothing newer arrived): no sample
    dp.run_rx(feedback_frame(2, ts, 1))
    assert delay(dp, 2).samples == 1
    # an older echo (reordered feedback): no sample either
    dp.run_rx(feedback_frame(2, (ts - 100) & 0xFFFFFFFF, 2))
    assert delay(dp, 2).samples == 1
    # a newer packet: a sample, folded into the EWMA with gain 1/4
    ts2 = (now_us() - 1000) & 0xFFFFFFFF
    dp.run_rx(feedback_frame(2, ts2, 3))
    d2 = delay(dp, 2)
    assert d2.samples == 2 and d2.last_fb_ts == ts2
    assert d2.ewma_us == d.ewma_us - (d.ewma_us >> 2) + (d2.rtt_us >> 2)
    assert delay(dp, 1).samples == 0


def test_a_held_echo_is_evidence_but_no_delay_sample(dp):
    """The peer held the echo for a reverse packet (MRC_F_EHELD): it counts
    as a fresh echo (held; a repeat of it does not), dates the path's
    evidence by its send time as any echo does, but is no RTT sample: the
    wait would read as the path's delay, on an EV carrying little at most
    of its echoes."""
    from unit_dp import now_us
    ts = (now_us() - 3000) & 0xFFFFFFFF
    dp.run_rx(feedback_frame(2, ts, 0))
    d, before = delay(dp, 2), dp.live(2).last_ack_ns
    ts2 = (now_us() - 1000) & 0xFFFFFFFF
    held = feedback_frame(2, ts2, 1, flags=wire.MRC_F_FEEDBACK | wire.MRC_F_EHELD)
    assert dp.run_rx(held)[0] == XDP_PASS
    d2 = delay(dp, 2)
    assert (d2.samples, d2.held, d2.rtt_us, d2.ewma_us) == (1, 1, d.rtt_us, d.ewma_us)
    assert d2.last_fb_ts == ts2
    # dated by its send time, as the first: the two were sent ts2 - ts apart
    assert abs(dp.live(2).last_ack_ns - before - 1000 * ((ts2 - ts) & 0xFFFFFFFF)) < 10_000
    dp.run_rx(feedback_frame(2, ts2, 2, flags=wire.MRC_F_FEEDBACK | wire.MRC_F_EHELD))
    assert delay(dp, 2).held == 1                                 # a repeat: nothing new


@pytest.mark.parametrize("idle_min", [40, 60, 71])
def test_path_delay_resumes_after_a_long_idle(dp, idle_min):
    """Issue #13.5: the last sample was taken 36-72 min ago, so its 32-bit
    microsecond timestamp reads as newer than a fresh one; the fresh echo
    must still be a sample."""
    import time
    from unit_dp import now_us
    idle_us = idle_min * 60 * 1_000_000
    old = dict(samples=5, last_fb_ts=(now_us() - idle_us) & 0xFFFFFFFF, rtt_us=200, ewma_us=200,
               last_ns=max(1, time.monotonic_ns() - idle_us * 1000))
    fields = {n for n, _f in wire.PathDelay.LAYOUT}
    dp.maps["mrc_path_delay"].update(wire.DEFAULT_SIZING.path_key(PEER, 2), wire.PathDelay(
        **{k: v for k, v in old.items() if k in fields}).pack())
    ts = (now_us() - 3000) & 0xFFFFFFFF
    assert dp.run_rx(feedback_frame(2, ts, 100))[0] == XDP_PASS
    d = delay(dp, 2)
    assert d.samples == 6, f"a fresh echo after {idle_min} min idle was not taken"
    assert d.last_fb_ts == ts and 3000 <= d.rtt_us < 3000 + 500_000
    # and a repeat of it right after is no sample again
    dp.run_rx(feedback_frame(2, ts, 101))
    assert delay(dp, 2).samples == 6


def unit_segment(unit_psn: int, j: int, segs: int, tx_ts: int, fb_ts: int) -> bytes:
    """Segment j of a unit of `segs` 100-byte TCP segments, echoing our path 2."""
    inner = pkt.ipv4(PEER_OVERLAY, LOCAL_OVERLAY, pkt.IPPROTO_TCP,
                     pkt.tcp(5201, 40001, 1000 + 100 * j, b"u" * 100))
    return pkt.mrc_frame(inner=inner, path_id=0, psn=unit_psn, tx_ts=tx_ts, segs=segs,
                         seg_size=100, seq0=1000, flags=wire.MRC_F_FEEDBACK, fb_path=2, fb_ts=fb_ts)


def test_a_unit_is_one_receipt_whichever_segment_arrives_first(dp):
    """The segments of a unit share its header: the first of them to arrive
    (here the third) dates the receipt and applies the echo; the others are
    still counted per wire packet but neither re-date it nor re-apply the echo."""
    from unit_dp import now_us
    fb = (now_us() - 2000) & 0xFFFFFFFF
    feed(dp, [39])                                        # the stream so far
    for j in (2, 0, 1, 3):
        assert dp.run_rx(unit_segment(40, j, 4, tx_ts=777, fb_ts=fb))[0] == XDP_PASS
        if j == 2:
            first = dp.live(0)
    after = dp.live(0)
    assert first.last_rx_ts == 777 and first.last_rx_unit == 40 and first.last_rx_ns
    assert after.last_rx_ns == first.last_rx_ns            # dated by the first segment only
    assert delay(dp, 2).samples == 1                       # one echo, applied once
    r = reorder(dp)
    # still accounted per wire packet: PSNs 42, 40, 41, 43 after 39
    assert (r.rx_packets, r.ooo, r.dup, r.lost) == (5, 2, 0, 0)
    # the next unit on the path, even within the same microsecond, is a new receipt
    fb2 = (now_us() - 1000) & 0xFFFFFFFF
    dp.run_rx(unit_segment(44, 0, 4, tx_ts=777, fb_ts=fb2))
    assert dp.live(0).last_rx_unit == 44 and dp.live(0).last_rx_ns > first.last_rx_ns
    assert delay(dp, 2).samples == 2
