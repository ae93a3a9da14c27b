"""Path health in the datapath (bpf/judge.h, bpf/evidence.h, bpf/hedge.h, bpf/dedup.h) through BPF_PROG_TEST_RUN:
the tx liveness decision, ev_min_active, the duplicate filter for hedged
units, probe-driven recovery with hysteresis, hedged sending and the EV
events in the ring buffer."""

from __future__ import annotations

import time

import pytest

import unit_pkt as pkt
from unit_dp import (PATHS, PEER, PEER_OVERLAY, TC_ACT_REDIRECT, TC_ACT_SHOT, UDP_PORT, XDP_DROP,
                     XDP_PASS, now_us)
from mrcctl.datapath import abi as wire
from mrcctl.datapath.libbpf import RingBuffer

DEAD_US = 5000
MS = 1_000_000


inner_ip, mrc_frame, hdr_of = pkt.inner_ip, pkt.mrc_frame, pkt.mrc_hdr_of


def inner_udp() -> bytes:
    return pkt.overlay(pkt.udp(40000, 5201, b"h" * 64))


def path_of(out: bytes) -> int:
    return pkt.mrc_hdr_of(out).path_id


def events(dp) -> list[wire.Event]:
    got = []
    with RingBuffer(dp.maps["mrc_events"], lambda b: got.append(wire.Event.unpack(b))) as rb:
        rb.consume()
    return got


def health(dp) -> wire.HealthStats:
    return wire.HealthStats.sum(dp.maps["mrc_hstats"].lookup_percpu(wire.u32(0)))


@pytest.fixture
def hdp(dp):
    """Liveness on, dead_after 5 ms, every path GOOD with nothing outstanding."""
    dp.set_cfg(udp_port=UDP_PORT, flags=wire.MRC_CFG_LIVENESS, dead_after_us=DEAD_US,
               hedge_after_us=DEAD_US // 2, recover_probes=3)
    events(dp)   # drain anything a previous test left (maps are fresh, but be sure)
    return dp


def overdue(dp, path: int, now: int, *, peer_fresh: bool = True, first: bool = False, **kw):
    """Path `path` has had a unit outstanding for 50 ms with no evidence,
    and (unless first) already got its first strike 45 ms ago."""
    kw.setdefault("strike_ns", 0 if first else now - 45 * MS)
    dp.set_live(path, unacked_ns=now - 50 * MS, last_ack_ns=now - 60 * MS, **kw)
    if peer_fresh:
        dp.set_seq(ack_max_ns=now - 1 * MS)


def test_idle_path_is_not_judged(hdp):
    """Nothing outstanding: the unit goes out and becomes the oldest outstanding one."""
    hdp.set_slots([0])
    t0 = time.monotonic_ns()
    ret, out = hdp.run_tx(inner_udp())
    assert ret == TC_ACT_REDIRECT and path_of(out) == 0
    live = hdp.live(0)
    assert live.state == wire.PathState.GOOD
    assert t0 <= live.unacked_ns <= time.monotonic_ns()
    assert events(hdp) == []


def test_overdue_path_is_retired_and_unit_moves(hdp):
    hdp.set_slots([0, 2])
    now = time.monotonic_ns()
    overdue(hdp, 0, now)
    ret, out = hdp.run_tx(inner_udp())
    assert ret == TC_ACT_REDIRECT
    assert path_of(out) == 2                          # the next slot took it
    assert hdp.live(0).state == wire.PathState.ASSUMED_BAD
    assert hdp.live(0).bad_ns >= now
    evs = events(hdp)
    assert len(evs) == 1
    e = evs[0]
    assert (e.peer, e.path, e.old_state, e.new_state, e.reason) == (
        PEER, 0, wire.PathState.GOOD, wire.PathState.ASSUMED_BAD, wire.EvReason.DEAD)
    assert 50_000 <= e.age_us < 5_000_000 and e.ts_ns >= now
    assert health(hdp).dead == 1
    # retired once: the next unit neither judges it again nor emits again
    ret, out = hdp.run_tx(inner_udp())
    assert path_of(out) == 2 and events(hdp) == []


def test_two_strikes(hdp):
    """One overdue verdict only restarts the observation (a congestion drop
    must not retire a path); a second one, with no evidence in between, does."""
    hdp.set_slots([0])
    now = time.monotonic_ns()
    overdue(hdp, 0, now, first=True)
    ret, out = hdp.run_tx(inner_udp())
    assert path_of(out) == 0
    live = hdp.live(0)
    # the strike remembers the unit it found uncovered; observation restarts
    assert live.state == wire.PathState.GOOD and live.strike_ns == now - 50 * MS
    assert live.unacked_ns >= now
    assert events(hdp) == []
    # evidence arrives for what was sent after the strike: strike cleared
    hdp.set_live(0, unacked_ns=live.unacked_ns, last_ack_ns=live.unacked_ns + 1, strike_ns=live.strike_ns)
    hdp.run_tx(inner_udp())
    assert hdp.live(0).strike_ns == 0
    # the new unit goes unconfirmed too: second strike
    t = time.monotonic_ns()
    overdue(hdp, 0, t, strike_ns=t - 45 * MS)
    hdp.run_tx(inner_udp())
    assert hdp.live(0).state == wire.PathState.ASSUMED_BAD


def test_silent_peer_retires_nothing(hdp):
    """No path of the peer confirmed anything newer: nothing to prefer, keep it."""
    hdp.set_slots([0])
    now = time.monotonic_ns()
    overdue(hdp, 0, now, peer_fresh=False)
    hdp.set_seq(ack_max_ns=now - 70 * MS)
    ret, out = hdp.run_tx(inner_udp())
    assert ret == TC_ACT_REDIRECT and path_of(out) == 0
    assert hdp.live(0).state == wire.PathState.GOOD
    assert events(hdp) == []


def test_evidence_delay_widens_the_threshold(hdp):
    """A path whose own send-to-evidence delay explains the wait is kept."""
    hdp.set_slots([0])
    now = time.monotonic_ns()
    overdue(hdp, 0, now, ev_rtt_us=48_000)      # 48 of 50 ms explained
    ret, out = hdp.run_tx(inner_udp())
    assert path_of(out) == 0 and hdp.live(0).state == wire.PathState.GOOD
    overdue(hdp, 0, now, ev_rtt_us=20_000)      # 30 ms late
    hdp.run_tx(inner_udp())
    assert hdp.live(0).state == wire.PathState.ASSUMED_BAD


def test_liveness_off_never_retires(hdp):
    hdp.set_cfg(udp_port=UDP_PORT, flags=0, dead_after_us=DEAD_US)
    hdp.set_slots([0])
    overdue(hdp, 0, time.monotonic_ns())
    ret, out = hdp.run_tx(inner_udp())
    assert path_of(out) == 0 and hdp.live(0).state == wire.PathState.GOOD


def all_overdue_then_send(dp, min_active: int, units: int):
    """Every path overdue (with its first strike), min_active as given, then
    `units` units sent, each of them redirected."""
    dp.set_peer(PEER, n_paths=len(PATHS), overlay=PEER_OVERLAY, min_active=min_active)
    dp.set_slots([0, 1, 2, 3])
    now = time.monotonic_ns()
    for i in range(len(PATHS)):
        overdue(dp, i, now)
    for _ in range(units):
        ret, _out = dp.run_tx(inner_udp())
        assert ret == TC_ACT_REDIRECT


def test_min_active_keeps_paths(hdp):
    """With min_active = number of paths, no path may be retired."""
    all_overdue_then_send(hdp, len(PATHS), 8)
    assert all(hdp.live(i).state == wire.PathState.GOOD for i in range(len(PATHS)))
    assert health(hdp).min_active_held >= 4
    assert events(hdp) == []


def test_min_active_one_leaves_one(hdp):
    all_overdue_then_send(hdp, 1, 12)
    states = [hdp.live(i).state for i in range(len(PATHS))]
    assert states.count(wire.PathState.GOOD) == 1
    assert len(events(hdp)) == 3


def test_all_bad_min_active_still_sends(hdp):
    """Every path ASSUMED_BAD (e.g. all links down): with min_active > 0 the
    unit still goes out on the first path not denied; with 0 it is dropped."""
    hdp.set_slots([0, 1, 2, 3])
    for i in range(len(PATHS)):
        hdp.set_live(i, state=wire.PathState.ASSUMED_BAD)
    hdp.set_paths([wire.replace(PATHS[0], admin=wire.PathState.DENIED), *PATHS[1:]])
    hdp.set_peer(PEER, n_paths=len(PATHS), overlay=PEER_OVERLAY, min_active=1)
    ret, out = hdp.run_tx(inner_udp())
    assert ret == TC_ACT_REDIRECT and path_of(out) != 0     # never a denied path
    assert health(hdp).fallback == 1
    hdp.set_peer(PEER, n_paths=len(PATHS), overlay=PEER_OVERLAY, min_active=0)
    ret, _ = hdp.run_tx(inner_udp())
    assert ret == TC_ACT_SHOT


def test_fallback_finds_good_path_beyond_retry_window(hdp):
    """A slot table still full of dead paths (agent not yet rebuilt it)."""
    hdp.set_slots([0] * 20 + [3])
    hdp.set_live(0, state=wire.PathState.ASSUMED_BAD)
    for i in (1, 2):
        hdp.set_live(i, state=wire.PathState.ASSUMED_BAD)
    ret, out = hdp.run_tx(inner_udp())
    assert ret == TC_ACT_REDIRECT and path_of(out) == 3
    assert health(hdp).fallback == 0      # it was GOOD: no forced send


# --------------------------------------------------------------- recovery

def reply(dp, path: int, seq: int, rtt_us: int = 100) -> bytes:
    """The reply to probe `seq` of `path`, which the agent sent (its nonce
    recorded, echoed here)."""
    return mrc_frame(PATHS[path].family, type=wire.MsgType.PROBE_REPLY, path_id=path,
                     tx_ts=now_us() - rtt_us, inner=b"", sport=UDP_PORT, dport=PATHS[path].ev,
                     **dp.probe_sent(path, seq))


def test_recovery_needs_consecutive_probes(hdp):
    now = time.monotonic_ns()
    hdp.set_live(2, state=wire.PathState.ASSUMED_BAD, bad_ns=now - 10 * MS, probe_seq=10)
    for seq in (11, 13, 14):          # probe 12 lost: the count restarts at 13
        assert hdp.run_rx(reply(hdp, 2, seq))[0] == XDP_DROP
    assert hdp.live(2).state == wire.PathState.ASSUMED_BAD
    assert hdp.live(2).probe_ok == 2
    hdp.run_rx(reply(hdp, 2, 15))
    live = hdp.live(2)
    assert live.state == wire.PathState.GOOD and live.unacked_ns == 0 and live.good_ns >= now
    evs = events(hdp)
    assert [(e.path, e.old_state, e.new_state, e.reason) for e in evs] == [
        (2, wire.PathState.ASSUMED_BAD, wire.PathState.GOOD, wire.EvReason.RECOVERED)]
    assert health(hdp).recovered == 1


def test_probes_sent_before_retirement_do_not_count(hdp):
    now = time.monotonic_ns()
    hdp.set_live(2, state=wire.PathState.ASSUMED_BAD, bad_ns=now, probe_seq=0)
    for seq in (1, 2, 3, 4):
        hdp.run_rx(reply(hdp, 2, seq, rtt_us=20_000))   # sent 20 ms ago, before bad_ns
    assert hdp.live(2).state == wire.PathState.ASSUMED_BAD


def test_flapping_path_needs_more_probes(hdp):
    """A path retired again within 1 s of recovering needs twice the probes."""
    hdp.set_slots([0, 2])
    now = time.monotonic_ns()
    overdue(hdp, 0, now, good_ns=now - 100 * MS)
    hdp.run_tx(inner_udp())
    live = hdp.live(0)
    assert live.state == wire.PathState.ASSUMED_BAD and live.flaps == 1
    time.sleep(0.001)   # replies to probes sent after the retirement only
    for seq in range(live.probe_seq + 1, live.probe_seq + 4):
        hdp.run_rx(reply(hdp, 0, seq))
    assert hdp.live(0).state == wire.PathState.ASSUMED_BAD      # 3 < 3 << 1
    for seq in range(live.probe_seq + 4, live.probe_seq + 7):
        hdp.run_rx(reply(hdp, 0, seq))
    assert hdp.live(0).state == wire.PathState.GOOD


# --------------------------------------------------------------- duplicate filter

def hedged(psn: int, **kw) -> bytes:
    return mrc_frame(psn=psn, flags=wire.MRC_F_HEDGE, **kw)


def test_dedup_drops_second_copy_only(hdp):
    before = hdp.drops()
    assert hdp.run_rx(hedged(1000))[0] == XDP_PASS
    assert hdp.run_rx(hedged(1001))[0] == XDP_PASS
    assert hdp.run_rx(hedged(1000, path_id=2))[0] == XDP_DROP    # the copy, other path
    assert hdp.drops()[wire.Reason.RX_DUPLICATE] - before[wire.Reason.RX_DUPLICATE] == 1
    assert health(hdp).dedup_drops == 1
    # not hedged: never filtered (retransmissions get new PSNs anyway)
    assert hdp.run_rx(mrc_frame(psn=1000))[0] == XDP_PASS


def test_dedup_per_wire_packet_of_a_gso_unit(hdp):
    """Segments of one unit share the header but have PSN psn + i: none is a
    duplicate of another; a second copy of any of them is."""
    for seq in (5000, 6000, 7000, 8000):
        frame = hedged(200, inner=inner_ip(1000, pkt.IPPROTO_TCP, seq=seq), segs=4,
                       seg_size=1000, seq0=5000)
        assert hdp.run_rx(frame)[0] == XDP_PASS
    frame = hedged(200, inner=inner_ip(1000, pkt.IPPROTO_TCP, seq=7000), segs=4, seg_size=1000,
                   seq0=5000, path_id=2)
    assert hdp.run_rx(frame)[0] == XDP_DROP
    assert hdp.run_rx(hedged(203))[0] == XDP_DROP      # = segment 3 of the unit
    assert hdp.run_rx(hedged(204))[0] == XDP_PASS


def test_dedup_window_slides(hdp):
    """Blocks of 32 PSNs share a word; a newer block reuses the word, an
    older one (out of the window) is let through rather than dropped."""
    window = wire.MRC_DEDUP_WORDS * 32
    assert hdp.run_rx(hedged(7))[0] == XDP_PASS
    # the top moves up with plain DATA first: a hedged copy a window above
    # it would not be marked (rx_hedge_ahead, bpf/dedup.h)
    assert hdp.run_rx(mrc_frame(psn=6 + window))[0] == XDP_PASS
    assert hdp.run_rx(hedged(7 + window))[0] == XDP_PASS   # same word, newer block
    assert hdp.run_rx(hedged(7 + window))[0] == XDP_DROP
    assert hdp.run_rx(hedged(7))[0] == XDP_PASS            # older than the window
    assert hdp.run_rx(hedged(8 + window))[0] == XDP_PASS


def test_dedup_psn_wrap(hdp):
    for psn in (0xFFFFFFFE, 0xFFFFFFFF, 0, 1):
        assert hdp.run_rx(hedged(psn))[0] == XDP_PASS
    for psn in (0xFFFFFFFF, 0):
        assert hdp.run_rx(hedged(psn))[0] == XDP_DROP


def test_dedup_sequence_against_model(hdp):
    """A long shuffled sequence of first copies and duplicates against a
    Python model of the window."""
    import random
    rnd = random.Random(7)
    seen: set[int] = set()
    base = 50_000
    for step in range(400):
        psn = base + step // 2 + rnd.randrange(0, 40)
        ret = hdp.run_rx(hedged(psn))[0]
        assert ret == (XDP_DROP if psn in seen else XDP_PASS), (step, psn)
        seen.add(psn)


# --------------------------------------------------------------- hedging

def test_hedge_all_sends_copy_on_other_plane(hdp, veth):
    """Duplicate-send mode: the clone leaves on the chosen path (here a
    throwaway veth), the original is rewritten for a GOOD path of the same
    family on another plane; both carry MRC_F_HEDGE."""
    paths = [wire.replace(PATHS[0], ifindex=veth), *PATHS[1:]]
    hdp.set_paths(paths)
    hdp.set_cfg(udp_port=UDP_PORT, flags=wire.MRC_CFG_LIVENESS | wire.MRC_CFG_HEDGE_ALL,
                dead_after_us=DEAD_US, hedge_after_us=DEAD_US // 2, recover_probes=3)
    hdp.set_slots([0])
    ret, out = hdp.run_tx(inner_udp())
    assert ret == TC_ACT_REDIRECT
    h = hdp_hdr = hdr_of(out)
    assert hdp_hdr.path_id == 3                   # v4 like path 0, plane 2 not 0
    assert h.flags & wire.MRC_F_HEDGE
    assert out[0:6] == wire.mac_bytes(PATHS[3].dmac)
    assert int.from_bytes(out[34:36], "big") == PATHS[3].ev
    assert wire.inet_csum(out[14:34]) == 0
    assert health(hdp).hedged == 1
    assert hdp.stats(0).tx_packets == 1 and hdp.stats(3).tx_packets == 1
    # the copy is the partner's: what the slot table sent stays on path 0
    assert (hdp.stats(0).tx_hedged, hdp.stats(3).tx_hedged) == (0, 1)


def suspect_path_0(hdp, veth) -> int:
    """Path 0 (on a throwaway veth, for the copy) 3 ms late: past
    hedge_after (1 ms), not dead (5 ms). Returns the time it was set."""
    paths = [wire.replace(PATHS[0], ifindex=veth), *PATHS[1:]]
    hdp.set_paths(paths)
    hdp.set_cfg(udp_port=UDP_PORT, flags=wire.MRC_CFG_LIVENESS | wire.MRC_CFG_HEDGE,
                dead_after_us=DEAD_US, hedge_after_us=1000, recover_probes=3)
    hdp.set_slots([0])
    now = time.monotonic_ns()
    hdp.set_live(0, unacked_ns=now - 3 * MS, last_ack_ns=now - 4 * MS)
    hdp.set_seq(ack_max_ns=now)
    return now


def test_suspect_path_is_hedged(hdp, veth):
    suspect_path_0(hdp, veth)
    ret, out = hdp.run_tx(inner_udp())
    assert ret == TC_ACT_REDIRECT and hdr_of(out).path_id == 3
    assert hdr_of(out).flags & wire.MRC_F_HEDGE
    assert hdp.live(0).state == wire.PathState.GOOD
    # on time: no copy
    hdp.set_live(0, unacked_ns=0)
    ret, out = hdp.run_tx(inner_udp())
    assert hdr_of(out).path_id == 0 and not hdr_of(out).flags & wire.MRC_F_HEDGE


def test_suspect_path_without_partner_is_counted(hdp, veth):
    """A suspect unit goes out alone when no partner on another plane may
    carry a copy; hedge_no_path counts such units (an operator reading
    `status` sees that hedging could not cover a failing path)."""
    suspect_path_0(hdp, veth)
    hdp.set_live(3, state=wire.PathState.ASSUMED_BAD)     # the only partner
    ret, out = hdp.run_tx(inner_udp())
    assert ret == TC_ACT_REDIRECT and hdr_of(out).path_id == 0
    assert not hdr_of(out).flags & wire.MRC_F_HEDGE
    assert (health(hdp).hedged, health(hdp).hedge_no_path) == (0, 1)
    # with the partner back, the copy goes and nothing more is counted
    hdp.set_live(3, state=wire.PathState.GOOD)
    ret, out = hdp.run_tx(inner_udp())
    assert hdr_of(out).path_id == 3 and hdr_of(out).flags & wire.MRC_F_HEDGE
    assert (health(hdp).hedged, health(hdp).hedge_no_path) == (1, 1)


def test_struck_path_stays_hedged_until_evidence(hdp, veth):
    """The first strike restarts the observation (lag from zero), but the
    path stays suspect - its units hedged - until evidence covers a unit
    sent after the strike; otherwise a dead plane's units (TCP's
    retransmissions among them) would go unhedged for hedge_after."""
    paths = [wire.replace(PATHS[0], ifindex=veth), *PATHS[1:]]
    hdp.set_paths(paths)
    hdp.set_cfg(udp_port=UDP_PORT, flags=wire.MRC_CFG_LIVENESS | wire.MRC_CFG_HEDGE,
                dead_after_us=DEAD_US, hedge_after_us=DEAD_US // 2, recover_probes=3)
    hdp.set_slots([0])
    now = time.monotonic_ns()
    overdue(hdp, 0, now, first=True)
    ret, out = hdp.run_tx(inner_udp())                  # first strike
    assert ret == TC_ACT_REDIRECT and hdr_of(out).flags & wire.MRC_F_HEDGE
    live = hdp.live(0)
    assert live.state == wire.PathState.GOOD and live.strike_ns == now - 50 * MS
    for _ in range(3):                                  # lag restarted, still hedged
        ret, out = hdp.run_tx(inner_udp())
        assert hdr_of(out).path_id == 3 and hdr_of(out).flags & wire.MRC_F_HEDGE
    assert hdp.live(0).state == wire.PathState.GOOD
    # evidence for a unit sent after the strike: healthy again, no copies
    live = hdp.live(0)
    hdp.set_live(0, unacked_ns=live.unacked_ns, last_ack_ns=live.unacked_ns + 1, strike_ns=live.strike_ns)
    ret, out = hdp.run_tx(inner_udp())
    assert hdr_of(out).path_id == 0 and not hdr_of(out).flags & wire.MRC_F_HEDGE
    assert hdp.live(0).strike_ns == 0


@pytest.mark.parametrize("hedge", [False, True])
def test_retransmission_takes_the_freshest_path(hdp, hedge):
    """A TCP unit that ends at or below the highest sequence its flow has
    sent goes out, without a copy, on the path that confirmed delivery most
    recently (if usable) instead of the next slot; new data, pure ACKs and
    data past the high keep to the slot table."""
    from test_tx import inner_tcp
    flags = wire.MRC_CFG_LIVENESS | (wire.MRC_CFG_HEDGE if hedge else 0)
    hdp.set_cfg(udp_port=UDP_PORT, flags=flags, dead_after_us=DEAD_US,
                hedge_after_us=DEAD_US // 2, recover_probes=3)
    hdp.set_slots([0])
    hdp.set_seq(ack_max_ns=time.monotonic_ns(), ack_max_path=2)

    def send(frame):
        ret, out = hdp.run_tx(frame)
        assert ret == TC_ACT_REDIRECT and not hdr_of(out).flags & wire.MRC_F_HEDGE
        return path_of(out)

    assert send(inner_tcp(5000, 300)) == 0          # new data: the slot
    assert send(inner_tcp(5300, 300)) == 0
    assert send(inner_tcp(5000, 300)) == 2          # resent: the freshest path
    assert send(inner_tcp(5300, 300)) == 2          # up to the high
    assert send(inner_tcp(5400, 300)) == 0          # ends past it: new data
    assert send(inner_tcp(5700, 0)) == 0            # pure ACK
    assert health(hdp).retx_steered == 2 and health(hdp).hedged == 0
    assert (hdp.stats(2).tx_steered, hdp.stats(2).tx_packets, hdp.stats(0).tx_steered) == (2, 2, 0)
    hdp.set_live(2, state=wire.PathState.ASSUMED_BAD)
    assert send(inner_tcp(5000, 300)) == 0          # freshest path not usable: the slot


def test_retransmission_avoids_a_freshest_path_gone_silent(hdp):
    """The path that confirmed delivery last stops being where
    retransmissions go once a unit has waited on it for more than twice its
    coverage delay (at least 1 ms) with no evidence: a flow stalled in an RTO
    sends nothing else, no sibling's evidence moves, and the judge cannot
    call the path overdue; steered there, every timed-out retransmission
    was lost again when that path had died (bpf/retx.h)."""
    from test_tx import inner_tcp
    hdp.set_cfg(udp_port=UDP_PORT, flags=wire.MRC_CFG_LIVENESS, dead_after_us=DEAD_US,
                hedge_after_us=DEAD_US // 2, recover_probes=3)
    hdp.set_slots([0])
    now = time.monotonic_ns()
    hdp.set_seq(ack_max_ns=now - 20 * MS, ack_max_path=2)

    def send(frame):
        ret, out = hdp.run_tx(frame)
        assert ret == TC_ACT_REDIRECT
        return path_of(out)

    assert send(inner_tcp(5000, 300)) == 0          # new data: the slot
    # the timed-out retransmission went to path 2 8 ms ago, unconfirmed
    hdp.set_live(2, unacked_ns=now - 8 * MS, last_ack_ns=now - 20 * MS, ev_cov_max_us=500)
    assert send(inner_tcp(5000, 300)) == 0          # the next one: not path 2
    assert health(hdp).retx_steered == 0
    # a path whose evidence usually takes 5 ms is not silent after 8 ms
    hdp.set_live(2, ev_cov_max_us=5000)
    assert send(inner_tcp(5000, 300)) == 2
    # nor one whose outstanding unit was sent just now (a burst of resends)
    hdp.set_live(2, unacked_ns=time.monotonic_ns(), ev_cov_max_us=500)
    assert send(inner_tcp(5000, 300)) == 2
    assert health(hdp).retx_steered == 2


def test_echo_prefers_unechoed_receipt(hdp):
    """Feedback picks, near the cursor, a path with a receipt not echoed yet."""
    hdp.set_slots([0])
    t = time.monotonic_ns()
    hdp.set_seq(fb_cursor=0)
    hdp.set_live(0, last_rx_ns=t, last_rx_ts=111, fb_echoed=111)   # already echoed
    hdp.set_live(2, last_rx_ns=t, last_rx_ts=222)
    _, out = hdp.run_tx(inner_udp())
    h = hdr_of(out)
    assert h.flags & wire.MRC_F_FEEDBACK and h.fb_path == 2 and h.fb_ts == 222
    assert hdp.live(2).fb_echoed == 222


def test_echo_serves_the_least_recently_echoed_path(hdp):
    """Among paths with receipts to echo, the one echoed longest ago goes
    first, however recent its newest receipt: ordered by the newest
    receipt's send time, a busy path (always a fresh receipt) lost to every
    quieter one while echoes were few, and a 3x weighted plane's paths
    were retired in transfers without a fault (bpf/feedback.h)."""
    hdp.set_slots([0])
    t = time.monotonic_ns()
    hdp.set_seq(fb_cursor=0)
    # path 0 is busy: its newest receipt is the freshest, its last echo the oldest
    hdp.set_live(0, last_rx_ns=t, last_rx_ts=300, fb_echoed=100, fb_echo_ns=t - 10 * MS)
    hdp.set_live(2, last_rx_ns=t, last_rx_ts=200, fb_echoed=150, fb_echo_ns=t - 1 * MS)
    echoed = []
    for _ in range(2):
        _, out = hdp.run_tx(inner_udp())
        h = hdr_of(out)
        echoed.append((h.fb_path, h.fb_ts) if h.flags & wire.MRC_F_FEEDBACK else None)
    # then path 2, echoed more recently but still waiting
    assert echoed == [(0, 300), (2, 200)], echoed
    assert hdp.live(0).fb_echoed == 300 and hdp.live(2).fb_echoed == 200


def test_agent_probes_a_good_path_only_when_its_evidence_is_overdue():
    """The agent's probe policy for a GOOD path of a peer in use
    (health.good_path_due): by its evidence's age, except while that
    evidence is on its way (the peer's evidence flows, the oldest unit
    outstanding on the path is younger than an interval plus the path's
    usual coverage delay)."""
    from mrcctl.agent.health import good_path_due
    ms = 1_000_000
    iv, now = 20 * ms, 1000 * ms
    assert not good_path_due(now, iv, False, False, now - 5 * ms, 0, 0)            # fresh evidence
    assert good_path_due(now, iv, False, False, now - 30 * ms, 0, 0)               # quiet, no data on it
    assert good_path_due(now, iv, True, False, now - 30 * ms, 0, 0)                # ... while the peer's flows
    # a unit out 25 ms on a path whose evidence takes ~15 ms: on its way
    assert not good_path_due(now, iv, True, False, now - 30 * ms, now - 25 * ms, 15 * ms)
    # ... 40 ms: overdue
    assert good_path_due(now, iv, True, False, now - 50 * ms, now - 40 * ms, 15 * ms)
    # the peer's evidence stalled (TCP waiting out a loss): by age again
    assert good_path_due(now, iv, False, False, now - 30 * ms, now - 25 * ms, 15 * ms)
    # a burst that ended (settled): a quiet path at QUIET_PATH_NS, not an interval
    from mrcctl.agent.health import QUIET_PATH_NS
    assert not good_path_due(now, iv, False, True, now - 30 * ms, 0, 0)
    assert good_path_due(now, iv, False, True, now - QUIET_PATH_NS, 0, 0)
    # ... but a unit outstanding on it still counts from an interval
    assert good_path_due(now, iv, False, True, now - 30 * ms, now - 25 * ms, 0)
