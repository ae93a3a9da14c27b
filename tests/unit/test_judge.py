"""The sibling-relative judge (bpf/judge.h, bpf/evidence.h, issue #11.3) on
crafted frames through BPF_PROG_TEST_RUN: evidence arrives as the peer's
DATA frames carrying echoes (mrc_rx), verdicts are taken when mrc_tx sends
the next unit. A path is overdue only when units sent later on its
siblings are confirmed and its own evidence is later than it has recently
needed; a delay every path shares moves none."""

from __future__ import annotations

import time

import pytest

import unit_pkt as pkt
from unit_dp import PATHS, PEER, PEER_OVERLAY, TC_ACT_REDIRECT, XDP_PASS, UDP_PORT
from mrcctl.datapath import abi as wire
from test_health import events, health, inner_udp, path_of

DEAD_US = 5000
MS = 1_000_000


@pytest.fixture
def jdp(dp):
    """Liveness on, dead_after 5 ms, hedge_after 2.5 ms."""
    dp.set_cfg(udp_port=UDP_PORT, flags=wire.MRC_CFG_LIVENESS, dead_after_us=DEAD_US,
               hedge_after_us=DEAD_US // 2, recover_probes=3)
    events(dp)
    return dp


def us(ns: int) -> int:
    return (ns // 1000) & 0xFFFFFFFF


def echo(dp, fb_path: int, sent_ns: int, *, on: int = 0, psn: int = 1) -> None:
    """The peer's DATA frame on its path `on`, echoing that our path
    `fb_path` delivered the packet we sent at sent_ns."""
    frame = pkt.mrc_frame(PATHS[on].family, path_id=on, psn=psn, flags=wire.MRC_F_FEEDBACK,
                          fb_path=fb_path, fb_ts=us(sent_ns), tx_ts=us(time.monotonic_ns()))
    assert dp.run_rx(frame)[0] == XDP_PASS


def outstanding(dp, path: int, sent_ns: int, **kw) -> None:
    """Path `path` has had a unit outstanding since sent_ns, covered up to 1 ms before it."""
    dp.set_live(path, unacked_ns=sent_ns, last_ack_ns=sent_ns - MS, ev_ack_ns=sent_ns - MS, **kw)


def send(dp) -> int:
    ret, out = dp.run_tx(inner_udp())
    assert ret == TC_ACT_REDIRECT
    return path_of(out)


def test_late_only_when_later_units_on_siblings_are_confirmed(jdp):
    """30 ms without evidence is not overdue while the siblings have
    confirmed nothing sent more than the threshold later; once a sibling
    confirms a unit sent 10 ms after ours (over the 5 ms threshold), it is."""
    jdp.set_slots([0])
    now = time.monotonic_ns()
    un = now - 30 * MS
    outstanding(jdp, 0, un)
    jdp.set_seq(ack_max_ns=un - 2 * MS)
    echo(jdp, 3, un + 2 * MS, on=3)              # sibling: a unit sent 2 ms later
    assert jdp.seq().ack_max_ns >= un + 2 * MS - 1000
    assert send(jdp) == 0
    live = jdp.live(0)
    assert live.state == wire.PathState.GOOD and live.strike_ns == 0
    echo(jdp, 3, un + 10 * MS, on=3, psn=2)      # sibling: a unit sent 10 ms later
    assert send(jdp) == 0
    live = jdp.live(0)
    assert live.state == wire.PathState.GOOD and live.strike_ns == un      # first strike
    # the struck unit still uncovered when the next is overdue too: dead
    jdp.set_live(0, unacked_ns=un + 1 * MS, last_ack_ns=un - MS, ev_ack_ns=un - MS, strike_ns=un)
    assert send(jdp) != 0                          # retired, the unit moved
    assert jdp.live(0).state == wire.PathState.ASSUMED_BAD
    assert [(e.path, e.reason) for e in events(jdp)] == [(0, wire.EvReason.DEAD)]


def test_common_mode_delay_retires_nothing(jdp):
    """Every path's evidence stops for 100 ms at once (this host's CPU, a
    queue in front of every plane, the peer busy): no path is judged,
    however many units go out. When the evidence then returns in a burst,
    one path at a time, a path whose echo is still queued behind its
    siblings' is at most suspect - its own late echo clears that - and
    nothing is retired."""
    n = len(PATHS)
    jdp.set_peer(PEER, n_paths=n, overlay=PEER_OVERLAY, min_active=0)
    jdp.set_slots([0, 1, 2, 3])
    now = time.monotonic_ns()
    un = now - 100 * MS
    for i in range(n):
        outstanding(jdp, i, un + i * 100_000)
    jdp.set_seq(ack_max_ns=un - MS)               # nothing newer confirmed anywhere
    for _ in range(16):
        send(jdp)
    assert all(jdp.live(i).state == wire.PathState.GOOD and jdp.live(i).strike_ns == 0
               for i in range(n))
    # the burst: path 3's echo (a unit sent 1 ms ago) first, then the others'
    echo(jdp, 3, now - MS, on=3)
    for _ in range(8):
        send(jdp)                                 # paths 0-2 look late now: strikes at most
    for i in (0, 1, 2):
        echo(jdp, i, now - MS, on=3, psn=10 + i)  # their own echoes, just behind
    for _ in range(16):
        send(jdp)
    assert all(jdp.live(i).state == wire.PathState.GOOD for i in range(n))
    assert [e for e in events(jdp) if e.new_state == wire.PathState.ASSUMED_BAD] == []
    assert health(jdp).dead == 0


def test_threshold_follows_measured_coverage_delay(jdp):
    """A path whose evidence has recently taken 20 ms to cover its oldest
    unit (one echo per reverse packet shared by many paths) is given
    2 x that before it is overdue; the measurement comes from the echo
    that covers the outstanding unit."""
    jdp.set_slots([0])
    now = time.monotonic_ns()
    un = now - 20 * MS
    outstanding(jdp, 0, un)
    echo(jdp, 0, un + 100_000)                     # covers it 20 ms after it was sent
    live = jdp.live(0)
    assert 19_000 <= live.ev_cov_max_us <= 25_000 and live.ev_cov_us == live.ev_cov_max_us
    # 15 ms late with siblings far ahead: past dead_after (5 ms) but within
    # 2 x 20 ms capped at 4 x dead_after = 20 ms, kept
    now = time.monotonic_ns()
    outstanding(jdp, 0, now - 15 * MS, ev_cov_us=live.ev_cov_us, ev_cov_max_us=live.ev_cov_max_us)
    jdp.set_seq(ack_max_ns=now - MS)
    assert send(jdp) == 0 and jdp.live(0).strike_ns == 0
    # 60 ms: past it (first strike)
    outstanding(jdp, 0, now - 60 * MS, ev_cov_us=live.ev_cov_us, ev_cov_max_us=live.ev_cov_max_us)
    send(jdp)
    assert jdp.live(0).strike_ns == now - 60 * MS
    # the same path with quick evidence: 25 ms is overdue (dead_after 5 ms)
    outstanding(jdp, 0, now - 25 * MS, ev_cov_us=1000, ev_cov_max_us=1000)
    send(jdp)
    assert jdp.live(0).strike_ns == now - 25 * MS


def test_threshold_is_capped(jdp):
    """However slow a path's evidence was, 4 x dead_after without coverage
    while the siblings confirm is overdue."""
    jdp.set_slots([0])
    now = time.monotonic_ns()
    outstanding(jdp, 0, now - 45 * MS, ev_cov_us=50_000, ev_cov_max_us=50_000)
    jdp.set_seq(ack_max_ns=now - MS)
    send(jdp)
    assert jdp.live(0).strike_ns == now - 45 * MS


def test_a_siblings_recent_peak_stretches_the_threshold(jdp):
    """A busy host delays the evidence of random paths: a coverage of 20 ms
    on path 1 gives path 0, whose own evidence has been quick, the same
    2 x 20 ms (capped at 4 x dead_after = 20 ms) for as long as the peak
    stays in the peer's window (this one and the one before); two windows
    without a sample forget it."""
    jdp.set_slots([0])
    now = time.monotonic_ns()
    outstanding(jdp, 1, now - 20 * MS)
    echo(jdp, 1, now - 20 * MS + 100_000)          # path 1 covered 20 ms after sending
    seq = jdp.seq()
    assert 19_000 <= seq.cov_peak_us <= 25_000 and seq.cov_peak_us == jdp.live(1).ev_cov_max_us
    now = time.monotonic_ns()
    peak = dict(ack_max_ns=now - MS, cov_peak_us=seq.cov_peak_us)
    outstanding(jdp, 0, now - 15 * MS, ev_cov_us=1000, ev_cov_max_us=1000)
    jdp.set_seq(cov_win_ns=seq.cov_win_ns, **peak)
    assert send(jdp) == 0 and jdp.live(0).strike_ns == 0
    # a window later the peak is the previous window's: still held
    jdp.set_seq(cov_win_ns=now - 1_500 * MS, **peak)
    outstanding(jdp, 0, now - 15 * MS, ev_cov_us=1000, ev_cov_max_us=1000)
    assert send(jdp) == 0 and jdp.live(0).strike_ns == 0
    # two windows later it is gone: 15 ms is past dead_after (5 ms)
    jdp.set_seq(cov_win_ns=now - 2_500 * MS, **peak)
    outstanding(jdp, 0, now - 15 * MS, ev_cov_us=1000, ev_cov_max_us=1000)
    send(jdp)
    assert jdp.live(0).strike_ns == now - 15 * MS


def test_peer_window_turns(jdp):
    """The first sample of a new window starts it; the old window's peak
    becomes the previous one, or nothing if it was older than that."""
    jdp.set_slots([0])
    now = time.monotonic_ns()
    jdp.set_seq(cov_peak_us=30_000, cov_prev_us=7_000, cov_win_ns=now - 1_200 * MS)
    outstanding(jdp, 0, now - 2 * MS)
    echo(jdp, 0, now - 2 * MS + 100_000)
    seq = jdp.seq()
    assert seq.cov_prev_us == 30_000 and 1_800 <= seq.cov_peak_us <= 5_000
    assert seq.cov_win_ns > now
    jdp.set_seq(cov_peak_us=30_000, cov_prev_us=7_000, cov_win_ns=now - 2_200 * MS)
    now = time.monotonic_ns()
    outstanding(jdp, 0, now - 2 * MS)
    echo(jdp, 0, now - 2 * MS + 100_000)
    assert jdp.seq().cov_prev_us == 0
    # within the window a smaller sample leaves the peak alone
    jdp.set_seq(cov_peak_us=30_000, cov_win_ns=time.monotonic_ns())
    now = time.monotonic_ns()
    outstanding(jdp, 0, now - 2 * MS)
    echo(jdp, 0, now - 2 * MS + 100_000)
    assert jdp.seq().cov_peak_us == 30_000


def test_peak_decays(jdp):
    """One slow coverage raises the peak at once; quick ones bring it down
    by 1/16 each."""
    jdp.set_slots([0])
    peak = 30_000
    for _ in range(8):
        now = time.monotonic_ns()
        outstanding(jdp, 0, now - 1 * MS, ev_cov_us=peak, ev_cov_max_us=peak)
        echo(jdp, 0, now - 500_000)
        got = jdp.live(0).ev_cov_max_us
        assert got == peak - (peak >> 4)
        peak = got


def test_struck_unit_covered_late_clears_the_strike(jdp):
    """Evidence for the unit a strike found uncovered, arriving after the
    strike, means it was late, not lost: no second strike from it."""
    jdp.set_slots([0])
    now = time.monotonic_ns()
    un = now - 30 * MS
    outstanding(jdp, 0, un)
    jdp.set_seq(ack_max_ns=now - MS)
    send(jdp)
    assert jdp.live(0).strike_ns == un
    echo(jdp, 0, un + 500_000)                     # the struck unit's echo, late
    live = jdp.live(0)
    # what was sent after the strike goes uncovered long enough again:
    # a fresh first strike, not a retirement
    jdp.set_live(0, unacked_ns=now - 20 * MS, last_ack_ns=live.last_ack_ns,
                 ev_ack_ns=live.ev_ack_ns, strike_ns=live.strike_ns)
    send(jdp)
    assert jdp.live(0).state == wire.PathState.GOOD
    assert jdp.live(0).strike_ns == now - 20 * MS
    assert events(jdp) == []


def test_per_direction_evidence(jdp):
    """Our path 0's forward direction is judged by echoes of what we sent
    on it, wherever they arrive, never by what the peer sends us on it:
    the peer's DATA on path 0 (its direction toward us alive) leaves our
    path 0 uncovered and it is retired; an echo for path 0 riding on the
    peer's path 3 covers it."""
    jdp.set_slots([0, 3])
    now = time.monotonic_ns()
    outstanding(jdp, 0, now - 30 * MS)
    outstanding(jdp, 3, now - 30 * MS)
    # the peer's data on its path 0, echoing our path 3: covers 3, not 0
    for psn in range(1, 4):
        echo(jdp, 3, now - MS, on=0, psn=psn)
    assert jdp.live(0).last_ack_ns == now - 31 * MS
    assert jdp.live(3).last_ack_ns >= now - MS - 1000
    jdp.set_live(0, unacked_ns=now - 30 * MS, last_ack_ns=now - 31 * MS, strike_ns=now - 30 * MS)
    send(jdp)
    assert jdp.live(0).state == wire.PathState.ASSUMED_BAD
    assert jdp.live(3).state == wire.PathState.GOOD
    # the other way round: path 2 covered by an echo that came on path 3
    outstanding(jdp, 2, now - 30 * MS)
    echo(jdp, 2, now - MS, on=3, psn=9)
    assert jdp.live(2).last_ack_ns >= now - MS - 1000


def test_two_paths_light_traffic(jdp):
    """Two paths, one unit now and then: the dead path's single outstanding
    unit, with the one sibling confirming a later unit, is struck and then
    retired; the sibling stays."""
    jdp.set_paths(PATHS[:2] + PATHS[2:])
    jdp.set_peer(PEER, n_paths=2, overlay=PEER_OVERLAY, min_active=1)
    jdp.set_slots([0, 1])
    now = time.monotonic_ns()
    un = now - 12 * MS
    outstanding(jdp, 0, un)                      # one unit, 12 ms ago, nothing since
    jdp.set_live(1, unacked_ns=0)
    echo(jdp, 1, now - 2 * MS, on=1)             # the sibling's one unit, sent later, confirmed
    got = {send(jdp) for _ in range(2)}
    assert 0 in got and jdp.live(0).strike_ns == un
    # light traffic: the next unit on path 0 goes out 12 ms later, also unconfirmed
    now = time.monotonic_ns()
    jdp.set_live(0, unacked_ns=now - 12 * MS, last_ack_ns=un - MS, ev_ack_ns=un - MS, strike_ns=un)
    echo(jdp, 1, now - 2 * MS, on=1, psn=5)
    for _ in range(2):
        send(jdp)
    assert jdp.live(0).state == wire.PathState.ASSUMED_BAD
    assert jdp.live(1).state == wire.PathState.GOOD
