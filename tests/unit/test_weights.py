"""Adaptive weights (mrcctl/agent/weights.py): the control law as pure functions,
and the config keys of issue 4. No BPF here."""

from __future__ import annotations

import math

import pytest

from mrcctl.instance import config as cfgmod
from mrcctl.agent import weights as W

MB = 1e6 / 8   # bytes/s in one Mbit/s


def run(c, d, q, sent=None, usable=None, idle=None, offered=None, local=None):
    n = len(d)
    idle = idle if idle is not None else [0] * n
    return W.step_capacity(c, d, q, sent or [1] * n, usable or [True] * n, idle, offered, local), idle


def test_saturated_plane_is_estimated_at_its_delivered_rate():
    c, _ = run([None] * 2, [50 * MB, 100 * MB], [5000, 5000])
    assert c == [50 * MB, 100 * MB]
    # then an EWMA of what it delivers while saturated
    c2, _ = run(c, [60 * MB, 100 * MB], [5000, 5000])
    assert c2[0] == pytest.approx(50 * MB + W.SAT_GAIN * 10 * MB)


def test_rate_drop_is_taken_at_once():
    c, _ = run([200 * MB, 100 * MB], [50 * MB, 100 * MB], [20000, 3000])
    assert c[0] == 50 * MB


def test_draining_queue_is_no_capacity_reading():
    # the sender backed off (offers 10 while 50 leaves): keep the estimate
    c, _ = run([200 * MB], [50 * MB], [20000], offered=[10 * MB])
    assert c == [200 * MB]


def test_full_local_queue_delivering_less_is_a_rate_drop_even_when_the_sender_backed_off():
    # the plane's own qdisc still holds 20 ms: it delivers at its rate, so
    # 50 against an estimate of 200 is the plane, not the sender
    c, _ = run([200 * MB], [50 * MB], [20000], offered=[10 * MB], local=[True])
    assert c == [50 * MB]
    # a local queue delivering near the estimate is only draining: no reading
    c, _ = run([200 * MB], [180 * MB], [20000], offered=[10 * MB], local=[True])
    assert c == [200 * MB]


def test_unsaturated_plane_probes_up_after_a_while():
    idle = [0]
    c = [100 * MB]
    for _ in range(W.PROBE_AFTER - 1):
        c, idle = run(c, [100 * MB], [100], idle=idle)
        assert c == [100 * MB]
    c, idle = run(c, [100 * MB], [100], idle=idle)
    assert c[0] == pytest.approx(100 * MB * (1 + W.PROBE))


def test_plane_without_news_keeps_its_estimate_and_idle_plane_may_grow():
    c, _ = run([100 * MB, 100 * MB], [100 * MB, 0.0], [None, None], sent=[5, 0],
               idle=[W.PROBE_AFTER] * 2)
    assert c[0] == 100 * MB             # sending, no fresh echo: no news
    assert c[1] > 100 * MB              # nothing sent: it has no queue


def test_no_estimate_goes_above_the_planes_known_rate():
    # probing up stops at the plane's shaper / link rate; an unknown rate
    # (None) keeps the old bound of 4 x the best delivered rate
    c = W.step_capacity([95 * MB, 95 * MB], [95 * MB, 95 * MB], [100, 100], [1, 1], [True, True],
                        [W.PROBE_AFTER] * 2, cap=[100 * MB, None])
    assert c[0] == 100 * MB and c[1] == pytest.approx(95 * MB * (1 + W.PROBE))


def _controller(min_weight=0.0):
    return W.Controller(parse('', f'[weights]\nmode = "adaptive"\nmin_weight = {min_weight}'), dp=None)


def _state(k):
    return W._PeerState(groups=[[i] for i in range(k)], devices=[f"p{i}" for i in range(k)],
                        w=[1 / k] * k, c=[None] * k, d=[None] * k, idle=[0] * k,
                        min_rtt=[0.0] * k, min_prev=[0.0] * k)


def test_planes_of_known_different_rates_start_weighted_by_them():
    ctl, st = _controller(), _state(4)
    assert ctl._follow_caps(st, [250 * MB, 125 * MB, 62.5 * MB, 62.5 * MB])
    assert st.w == pytest.approx([0.5, 0.25, 0.125, 0.125])
    # partly unknown rates tell nothing: the configured weights stand, unestimated
    st = _state(4)
    assert not ctl._follow_caps(st, [100 * MB, None, 50 * MB, 50 * MB])
    assert st.w == [0.25] * 4 and st.c == [None] * 4
    # equal known rates: estimated at them, weights as they were
    st = _state(4)
    assert not ctl._follow_caps(st, [100 * MB] * 4)
    assert st.w == [0.25] * 4 and st.c == [100 * MB] * 4


def test_a_lowered_plane_rate_takes_effect_at_once():
    ctl, st = _controller(), _state(2)
    st.c = [100 * MB, 100 * MB]
    assert not ctl._follow_caps(st, [100 * MB, 100 * MB])
    assert ctl._follow_caps(st, [25 * MB, 100 * MB])
    assert st.c == [25 * MB, 100 * MB] and st.w == pytest.approx([0.2, 0.8])


def test_an_idle_peer_is_looked_at_without_a_full_step():
    st = _state(1)
    dt = 1 / 64             # an interval of ~16 ms, exact in binary
    every = 10 * dt
    # a trickle (a ping per interval: 96 KB/s at most) is idle
    # (the first step has no interval to measure: as if busy)
    sent = [math.inf] + [W.PSN_BYTES / dt] * 38
    skipped = [W.Controller._quiet(st, bps, t * dt, every) for t, bps in enumerate(sent, 1)]
    assert skipped[:W.QUIET_AFTER + 1] == [False] * (W.QUIET_AFTER + 1)
    full = [i for i, x in enumerate(skipped) if not x and i > W.QUIET_AFTER]
    assert full and all(b - a == 10 for a, b in zip(full, full[1:]))
    # traffic (100 wire packets in an interval) ends the quiet at once
    assert not W.Controller._quiet(st, 100 * W.PSN_BYTES / dt, 40 * dt, every)
    assert st.quiet == 0


def test_unusable_planes_get_nothing():
    s = W.shares([100.0, 100.0, None], [True, False, True], 0.02)
    assert s == [1.0, 0.0, 0.0]


def test_shares_follow_capacities_with_a_floor():
    s = W.shares([200.0, 100.0, 50.0, 50.0], [True] * 4, 0.0)
    assert s == pytest.approx([0.5, 0.25, 0.125, 0.125])
    s = W.shares([1000.0, 1.0], [True, True], 0.1)
    assert s[1] > 0.04 and sum(s) == pytest.approx(1.0)   # ~ the floor, renormalised


def test_quantize_sums_to_scale_and_keeps_every_usable_path():
    q = W.quantize([0.5, 0.25, 0.125, 0.125, 0.0], [True, True, True, True, False])
    assert sum(q) == W.SCALE and q[4] == 0
    assert q[:4] == [W.SCALE // 2, W.SCALE // 4, W.SCALE // 8, W.SCALE // 8]
    q = W.quantize([1.0, 1e-9], [True, True])
    assert q[1] >= 1 and sum(q) == W.SCALE


BASE = """
[overlay]
address = "172.31.0.1/24"
[[plane]]
device = "p0"
[[peer]]
name = "b"
overlay = "172.31.0.2"
{peer}
[peer.underlay]
p0 = "10.0.0.2"
{extra}
"""


def parse(peer: str = "", extra: str = ""):
    return cfgmod.parse(BASE.format(peer=peer, extra=extra))


def test_config_keys():
    c = parse('spray = "flowlet"\nflowlet_gap_us = 250', '[weights]\nmode = "adaptive"\ninterval_ms = 20')
    assert c.peers[0].flowlet_gap_us == 250 and c.weights.mode == "adaptive"
    assert c.weights.interval_ms == 20
    assert parse().peers[0].flowlet_gap_us == 0
    assert parse().weights.per_ev and not parse('', '[weights]\nper_ev = false').weights.per_ev
    with pytest.raises(cfgmod.ConfigError, match="weights.per_ev: must be true or false"):
        parse('', '[weights]\nper_ev = 1')
    assert parse().weights.loss and not parse('', '[weights]\nloss = false').weights.loss
    with pytest.raises(cfgmod.ConfigError, match="weights.loss: must be true or false"):
        parse('', '[weights]\nloss = "yes"')
    assert cfgmod.parse(BASE.format(peer="", extra="").replace(
        "[overlay]\n", "[overlay]\ngso_max_size = 16384\n")).gso_max_size == 16384


def test_weights_adapt_unless_the_operator_typed_some():
    typed = BASE.replace('device = "p0"\n', 'device = "p0"\nweight = 2\n')
    assert parse().weights.mode == "adaptive"
    assert cfgmod.parse(typed.format(peer="", extra="")).weights.mode == "fixed"
    # an explicit mode wins either way
    assert cfgmod.parse(typed.format(peer="", extra='[weights]\nmode = "adaptive"')).weights.mode == "adaptive"
    assert parse(extra='[weights]\nmode = "fixed"').weights.mode == "fixed"


@pytest.mark.parametrize("peer,extra,msg", [
    ("", '[weights]\nmode = "fast"', "weights.mode: 'fast' is not one of fixed, adaptive"),
    ("", "[weights]\ninterval_ms = 0", "weights.interval_ms: 0 is out of range"),
    ("", "[weights]\nspeed = 1", "weights.speed: unknown key"),
    ("flowlet_gap_us = -1", "", "peer[0].flowlet_gap_us: -1 is out of range"),
    ('flowlet_gap_us = "auto"', "", "peer[0].flowlet_gap_us: must be an integer"),
])
def test_config_errors_name_the_key(peer, extra, msg):
    with pytest.raises(cfgmod.ConfigError) as e:
        parse(peer, extra)
    assert msg in str(e.value)


def test_gso_max_size_range():
    with pytest.raises(cfgmod.ConfigError, match="overlay.gso_max_size: 100 is out of range"):
        cfgmod.parse(BASE.format(peer="", extra="").replace("[overlay]\n", "[overlay]\ngso_max_size = 100\n"))


def test_spray_unit_default():
    """64 KiB / planes (at least 16 KiB) where units reach TCP segment by
    segment; 64 KiB where every plane takes them whole (tc on veth); an
    explicit overlay.gso_max_size wins over both."""
    c = parse()
    n = len(c.planes)
    assert c.spray_unit() == max(16384, 65536 // n)
    assert c.spray_unit(whole_units=True) == 65536
    c = cfgmod.parse(BASE.format(peer="", extra="").replace("[overlay]\n", "[overlay]\ngso_max_size = 8192\n"))
    assert c.spray_unit() == c.spray_unit(whole_units=True) == 8192


def test_units_cross_whole_only_over_on_link_tc_veths():
    """The 64 KiB unit is for veth planes received at tc ingress with every
    peer on-link; a vlan or macvlan plane (a NIC below segments), an XDP
    plane or a peer behind a gateway keeps 64 KiB / planes."""
    from mrcctl.instance.reconcile import units_cross_whole
    kinds = {"a": "veth", "b": "veth", "v": "vlan", "n": None}
    kind = kinds.get
    on_link = {("a", "10.0.0.2"): (3, "10.0.0.2"), ("b", "10.1.0.2"): (4, "10.1.0.2")}
    assert units_cross_whole({"a": "tc", "b": "tc"}, on_link, kind)
    assert not units_cross_whole({"a": "tc", "b": "xdp"}, on_link, kind)
    assert not units_cross_whole({"a": "tc", "v": "tc"}, on_link, kind)
    assert not units_cross_whole({"a": "tc", "n": "tc"}, on_link, kind)
    routed = {**on_link, ("b", "10.9.0.2"): (4, "10.1.0.1")}
    assert not units_cross_whole({"a": "tc", "b": "tc"}, routed, kind)
    assert not units_cross_whole({}, {}, kind)


def test_up_hints_at_more_evs_for_peers_behind_gateways():
    """With the EV map off, a peer reached through a gateway (a leaf switch
    hashing EVs onto its uplinks) with few EVs per plane gets a hint in
    `up`'s line; on-link peers, peers with enough EVs and the default (the
    EV map spreads the EVs) do not."""
    from mrcctl.instance.reconcile import ROUTED_EVS, few_evs_note
    off = '[ev_map]\nmode = "off"'
    on_link = {("p0", "10.0.0.2"): (3, "10.0.0.2")}
    routed = {("p0", "10.0.0.2"): (3, "10.0.0.1")}
    assert few_evs_note(parse("", off), on_link) == ""
    note = few_evs_note(parse("", off), routed)
    assert "peer b behind gateways with 4 EVs per plane" in note and "docs/fabric.md" in note
    assert few_evs_note(parse(f"evs_per_plane = {ROUTED_EVS}", off), routed) == ""
    assert parse().ev_map.mode == "auto" and few_evs_note(parse(), routed) == ""


def test_a_full_shaper_delivers_its_rate():
    # the plane's own tbf holds 5 ms: it sends at its rate whatever this
    # interval's bytes say; without a known rate the bytes are the reading
    c, _ = run([200 * MB], [120 * MB], [5000], local=[True])
    assert c == [120 * MB]
    c = W.step_capacity([200 * MB], [120 * MB], [5000], [1], [True], [0], local=[True], cap=[250 * MB])
    assert c == [250 * MB]


def test_many_peers_default_to_fixed_weights():
    def cfg(n, weights=""):
        toml = ['[overlay]\naddress = "172.31.0.1/16"\n[[plane]]\ndevice = "p0"', weights]
        toml += [f'[[peer]]\nname = "n{i}"\noverlay = "172.31.{1 + i // 200}.{1 + i % 200}"\n'
                 f'[peer.underlay]\np0 = "10.0.{i // 200}.{2 + i % 200}"' for i in range(n)]
        return cfgmod.parse("\n".join(toml))
    n = cfgmod.ADAPTIVE_DEFAULT_MAX_PEERS
    assert cfgmod.weights_mode(cfg(n)) == "adaptive"
    assert cfgmod.weights_mode(cfg(n + 1)) == "fixed"
    assert cfgmod.weights_mode(cfg(n + 1, '[weights]\nmode = "adaptive"')) == "adaptive"


def test_the_weights_tasks_follow_the_peers_of_a_running_agent():
    """Peers added to or removed from a running agent (loop.Agent.set_peers)
    move the default mode across ADAPTIVE_DEFAULT_MAX_PEERS as a start with
    those peers would; what was learned of the peers touched goes, the
    others keep theirs."""
    from mrcctl.agent import loop

    def cfg(n, gap=250):
        toml = ['[overlay]\naddress = "172.31.0.1/16"\n[[plane]]\ndevice = "p0"']
        toml += [f'[[peer]]\nname = "n{i}"\noverlay = "172.31.{1 + i // 200}.{1 + i % 200}"\n'
                 f'flowlet_gap_us = {gap}\n[peer.underlay]\np0 = "10.0.{i // 200}.{2 + i % 200}"' for i in range(n)]
        return cfgmod.parse("\n".join(toml))
    n = cfgmod.ADAPTIVE_DEFAULT_MAX_PEERS
    agent = loop.Agent.__new__(loop.Agent)
    agent.tasks, agent._peer_hooks, agent._entries = [], [], {}
    agent.cfg = cfg(n)
    ctl = W.Controller(agent.cfg, dp=None)
    W._Tasks(agent, ctl)
    assert [t.name for t in agent.tasks] == ["weights"]      # every gap configured: no gap step
    ctl.peers = {0: "learned", 1: "learned"}
    ctl.psns = [5] * n
    agent.set_peers(cfg(n + 1), {n})
    assert [t.name for t in agent.tasks] == [] and not ctl.peers
    agent.set_peers(cfg(n), {n})
    assert [t.name for t in agent.tasks] == ["weights"]
    ctl.peers = {0: "learned", 1: "learned"}
    agent.set_peers(cfg(n, gap=0), {1})
    assert [t.name for t in agent.tasks] == ["weights", "flowlet-gap"] and ctl.peers == {0: "learned"}
    assert ctl.psns[:2] == [5, 0]


def test_a_task_may_ask_to_wait_longer():
    """The agent loop (loop.Agent.run_due): a task that returns a number is
    due again that many seconds later (the weights step when every peer is
    idle), one that returns None after its period, one that fails too."""
    from mrcctl.agent import loop

    def boom(_now):
        raise RuntimeError("a task's bug")

    agent = loop.Agent.__new__(loop.Agent)
    agent.tasks = [loop.Task("idle", 0.01, lambda _now: W.IDLE_STEP_S),
                   loop.Task("busy", 0.01, lambda _now: None), loop.Task("boom", 0.02, boom)]
    agent.run_due(100.0)
    assert [t.due for t in agent.tasks] == [100.0 + W.IDLE_STEP_S, 100.01, 100.02]
    assert [(t.runs, t.errors) for t in agent.tasks] == [(1, 0), (1, 0), (1, 1)]
    agent.run_due(100.015)                      # only the busy one is due
    assert [t.runs for t in agent.tasks] == [1, 2, 1]


def test_an_evs_own_queue_is_delay_beyond_its_planes_least_delayed_ev():
    # two EVs cross a queueing link (12 ms), two do not: theirs is their own
    assert W.own_queues([12000.0, 300.0, 11500.0, 200.0], [0, 1, 2, 3]) == [11800.0, 0.0, 11300.0, 0.0]
    # a queue the whole plane shares (its own shaper): the EVs' echoes differ
    # by when each was sampled, which is no queue of an EV's own
    assert W.own_queues([9000.0, 12000.0, 10000.0, 11000.0], [0, 1, 2, 3]) == [0.0] * 4
    # one fresh echo compares with nothing; stale ones stay None
    assert W.own_queues([None, 5000.0, None, None], [0, 1, 2, 3]) == [None] * 4
    assert W.own_queues([None, 9000.0, 100.0], [1, 2]) == [8900.0, 0.0]


def _fabric_split(links: list[int], cap: list[float], steps: int, w=None, queue_us=10000.0):
    """A plane whose EVs cross fabric links of capacities `cap`, EV i over
    link links[i], carrying one TCP flow: the flow grows until the link with
    the least room per share fills (it holds queue_us, the others none).
    split_evs runs once per interval; returns the EVs' shares."""
    n = len(links)
    w = w or [1 / n] * n
    c: list[float | None] = [None] * n
    idle = [0] * n
    for _ in range(steps):
        load = [sum(w[i] for i in range(n) if links[i] == s) for s in range(len(cap))]
        rate = min(cap[s] / load[s] for s in range(len(cap)) if load[s] > 0)
        full = {s for s in range(len(cap)) if load[s] > 0 and rate * load[s] >= 0.999 * cap[s]}
        qp = [queue_us if links[i] in full else 200.0 for i in range(n)]
        d = [rate * x for x in w]
        out = W.split_evs(w, c, d, W.own_queues(qp, list(range(n))), [int(x) or 1 for x in d],
                          [True] * n, idle, 0.02)
        if out is not None:
            w, c = out
    return w


def test_a_lumpy_hash_is_evened_out_over_the_links():
    # 3 of 4 EVs hash onto link 1: evenly sprayed, it carries 3/4 and caps the
    # plane at 133 % of one link; split by what each link delivers, the lone
    # EV takes half and the plane gets both links
    w = _fabric_split([1, 1, 1, 0], [100 * MB, 100 * MB], 150)
    assert w[3] == pytest.approx(0.5, abs=0.05)
    assert sum(w[:3]) == pytest.approx(0.5, abs=0.05) and sum(w) == pytest.approx(1.0)
    # unequal links (a rate drop on one): shares follow them
    w = _fabric_split([0, 0, 1, 1], [150 * MB, 50 * MB], 150)
    assert w[2] + w[3] == pytest.approx(0.25, abs=0.08)


def test_traffic_comes_back_to_evs_whose_link_cleared():
    # link 0 was slow (its EVs at 1/8 of the plane); now both are equal
    w = _fabric_split([0, 0, 1, 1], [100 * MB, 100 * MB], 200, w=[0.0625, 0.0625, 0.4375, 0.4375])
    assert w[0] + w[1] == pytest.approx(0.5, abs=0.08)


def test_evs_sharing_one_queue_keep_their_split():
    # all four over one link (or the plane's own shaper): nothing to learn
    assert W.split_evs([0.25] * 4, [None] * 4, [25 * MB] * 4, W.own_queues([10000.0] * 4, [0, 1, 2, 3]),
                       [1] * 4, [True] * 4, [0] * 4, 0.02) is None


def test_a_retired_ev_keeps_its_share_for_when_it_comes_back():
    w, _ = W.split_evs([0.25] * 4, [None] * 4, [25 * MB, 25 * MB, 25 * MB, 0.0], [12000.0, 0.0, 0.0, None],
                       [1, 1, 1, 0], [True, True, True, False], [W.PROBE_AFTER] * 4, 0.02)
    assert w[3] == 0.25 and sum(w) == pytest.approx(1.0)
    assert w[0] < 0.25 < min(w[1], w[2])


def test_slots_split_each_planes_weight_by_its_evs_shares(monkeypatch):
    ctl, st = _controller(), _state(2)
    st.groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
    st.w = [0.5, 0.5]
    st.ev_w = [0.25] * 4 + [0.5, 1 / 6, 1 / 6, 1 / 6]
    calls = []
    monkeypatch.setattr(W, "set_path_weights", lambda dp, peer, ws: calls.append(ws))
    monkeypatch.setattr(W, "rebuild_slots", lambda dp, cfg, peers: None)
    ctl._apply(type("Peer", (), {"paths": [None] * 8})(), st)
    assert calls == [{0: 30, 1: 30, 2: 30, 3: 30, 4: 60, 5: 20, 6: 20, 7: 20}]


def test_an_ev_counts_as_queued_from_a_millisecond_of_its_own():
    # TCP over paths of unequal delay backs off on the reordering, so a full
    # link's queue stands at a few ms at most; the sampling spread is less
    def split(q):
        return W.split_evs([0.25] * 4, [None] * 4, [25 * MB] * 4, W.own_queues(q, [0, 1, 2, 3]), [1] * 4,
                           [True] * 4, [0] * 4, 0.02)
    assert split([600.0, 200.0, 550.0, 250.0]) is None            # 0.4 ms spread: nobody's own
    w, _ = split([1400.0, 200.0, 1300.0, 150.0])                  # 1.15-1.25 ms of their own
    assert w[1] > 0.25 and w[3] > 0.25 and w[0] < 0.25 and w[2] < 0.25


def test_on_slow_links_a_unit_waiting_for_another_is_no_queue_of_its_own():
    # 200 Mbit/s links, two EVs each at 80 Mbit/s: a 32 KiB unit takes 3.3 ms
    # at that share, so 1-2 ms echoes come and go on EVs of an even fabric
    d = [80 * MB] * 4
    q_sat = W.ev_q_sat(d, 32768)
    assert q_sat == pytest.approx(32768 / (80 * MB) * 1e6)

    def split(q, sat):
        return W.split_evs([0.25] * 4, [None] * 4, d, W.own_queues(q, [0, 1, 2, 3]), [1] * 4,
                           [True] * 4, [0] * 4, 0.02, sat)
    assert split([1900.0, 200.0, 1800.0, 150.0], q_sat) is None
    assert split([1900.0, 200.0, 1800.0, 150.0], W.EV_Q_SAT_US) is not None    # what it was
    w, _ = split([9000.0, 200.0, 8500.0, 150.0], q_sat)                   # a link really full
    assert w[1] > 0.25 and w[3] > 0.25 and w[0] < 0.25 and w[2] < 0.25
    # fast links: the millisecond floor; an idle plane: the floor too
    assert W.ev_q_sat([500 * MB] * 4, 32768) == W.EV_Q_SAT_US
    assert W.ev_q_sat([0.0] * 4, 32768) == W.EV_Q_SAT_US


def test_an_ev_marked_more_often_than_its_siblings_has_a_queue_of_its_own():
    # a switch marks from a threshold well under what TCP lets stand, and
    # bursts get a few marks on every link: only a clear excess counts
    q = [200.0, 300.0, 250.0, None]
    out = W.with_marks(q, [0.6, 0.1, 0.2, None], W.EV_Q_SAT_US)
    assert out == [2 * W.EV_Q_SAT_US, 300.0, 250.0, None]
    assert W.with_marks(q, [0.9, 0.8, 0.85, 0.9], W.EV_Q_SAT_US) == q      # all marked: shared
    assert W.with_marks(q, [0.6, None, None, None], W.EV_Q_SAT_US) == q    # nothing to compare
    # then split_evs moves weight off it, as off a delayed one
    w, _ = W.split_evs([0.25] * 4, [None] * 4, [25 * MB] * 4, W.own_queues(out, [0, 1, 2]) + [None],
                       [1] * 4, [True] * 4, [0] * 4, 0.02)
    assert w[0] < 0.25 < w[1]


def test_marks_on_every_ev_of_a_plane_read_as_its_queue_in_the_plane_law():
    # plane 1's EVs all cross one marking link, plane 0's two links mark rarely
    marks = [0.05, 0.1, 0.0, 0.05, 0.7, 0.6, 0.8, 0.65]
    planes = [W._least(marks[:4]), W._least(marks[4:])]
    q = W.with_marks([100.0, 150.0], planes, W.Q_SAT_US)
    assert q == [100.0, 2 * W.Q_SAT_US]
    # a plane with one unmarked EV is the split's to fix, not the plane law's
    marks = [0.9, 0.0, 0.9, 0.9, 0.0, 0.0, 0.0, 0.0]
    assert W.with_marks([100.0, 150.0], [W._least(marks[:4]), W._least(marks[4:])], W.Q_SAT_US) == [100.0, 150.0]
    c, _ = run([100 * MB, 100 * MB], [60 * MB, 60 * MB], q, idle=[W.PROBE_AFTER] * 2)
    assert c[1] == 60 * MB and c[0] > 100 * MB


def test_an_evs_own_queue_counts_when_it_stood_at_two_looks_in_a_row():
    # a busy CPU delays single echoes of random paths; a congested link its
    # EVs' echoes at every look
    ctl = _controller()
    ctl.unit = 16384      # at 200 Mbit/s an EV: under EV_Q_SAT_US (ev_q_sat)
    st = _state(1)
    st.groups, n = [[0, 1, 2, 3]], 4
    st.ev_w, st.ev_c, st.ev_d, st.ev_idle, st.ev_q = [0.25] * n, [None] * n, [200 * MB] * n, [0] * n, [None] * n
    st.ev_qbar, st.ev_stood = [0.0] * n, [False] * n
    st.ev_home = [0.25] * n
    peer = type("Peer", (), {"name": "p"})()

    def look(qp):
        return ctl._split(peer, st, qp, [1] * n, [True] * n, [None] * n, [False] * n, 0.01, 0.0)
    assert not look([3000.0, 200.0, 250.0, 300.0])      # first look: nothing to compare with
    assert not look([200.0, 3000.0, 250.0, 300.0])      # another EV this time: noise
    assert look([200.0, 3000.0, 250.0, 300.0])          # the same EV again: its own queue
    assert st.ev_w[1] < 0.25


def test_loss_counts_where_it_stands_against_its_siblings():
    """A count of lossy looks, decayed over time: loss spread over many looks
    (a link dropping at random under a paced stream, a lost unit every few
    looks) counts as surely as loss at every look, where a burst of a look
    or two does not, nor loss that every sibling sees too."""
    dt = 0.01
    looks = [0.0] * 4
    for k in range(40):          # EV 0 loses at every third look, EV 1 at a burst of two
        looks = W.loss_looks([k % 3 == 0, k in (20, 21), False, False], looks, dt)
    assert W.lossy_evs(looks, [True] * 4) == [True, False, False, False]
    # every EV losing alike (the receiver's own drops): no one's own, even
    # where one lost twice as often as the least
    assert W.lossy_evs([8.0, 16.5, 7.9, 8.2], [True] * 4) == [False] * 4
    assert W.lossy_evs([8.0, 40.0, 7.9, 8.2], [True] * 4) == [False, True, False, False]
    # a retired sibling's count is not the floor to compare with
    assert W.lossy_evs([4.0, 4.0, 4.0, 0.0], [True, True, True, False]) == [False] * 4
    assert W.lossy_evs([4.0, 0.0], [True, False]) == [False, False]      # nothing to compare with
    # a link that clears: its count decays, and two time constants later no longer counts
    for _ in range(round(2 * W.LOSS_TAU_S / dt)):
        looks = W.loss_looks([False] * 4, looks, dt)
    assert W.lossy_evs(looks, [True] * 4) == [False] * 4


def test_an_own_queue_under_the_saturation_threshold_stands_when_it_holds():
    """A link cross traffic keeps full: TCP has backed off, and its EVs sit
    0.3-1 ms above their siblings at nearly every look, under ev_q_sat. The
    average says so within a few looks, where two EVs at least stand at
    once; single echoes delayed by milliseconds on random EVs (a busy CPU),
    one EV alone, an EV carrying little, or a delay every EV shares, do not."""
    ctl = _controller()
    ctl.unit = 32768      # ev_q_sat at 150 Mbit/s an EV: 1.75 ms
    st = _state(1)
    st.groups, n = [[0, 1, 2, 3]], 4
    st.ev_w, st.ev_c, st.ev_d, st.ev_idle, st.ev_q = [0.25] * n, [None] * n, [19 * MB] * n, [0] * n, [None] * n
    st.ev_qbar, st.ev_stood, st.ev_home = [0.0] * n, [False] * n, [0.25] * n
    peer = type("Peer", (), {"name": "p"})()

    def look(qp):
        return ctl._split(peer, st, qp, [MB] * n, [True] * n, [None] * n, [False] * n, 0.01, 0.0)
    # noise: one EV's echo late by 3 ms now and then, another's the next time
    for k in range(30):
        qp = [200.0, 220.0, 210.0, 190.0]
        if k % 3 == 0:
            qp[(k // 3) % 4] = 3200.0
        assert not look(qp), (k, st.ev_qbar)
    assert st.ev_w == [0.25] * n
    # every EV 2 ms late alike (a queue the plane shares): nobody's own
    for _ in range(10):
        assert not look([2200.0, 2150.0, 2250.0, 2180.0])
    # EVs 2 and 3 cross a full link: 0.5-0.9 ms above the others at most looks
    moved = [look([200.0, 230.0, 750.0, 1050.0] if k % 5 else [210.0, 200.0, 240.0, 220.0]) for k in range(5)]
    assert any(moved[:4]), st.ev_qbar
    for k in range(5):
        look([200.0, 230.0, 750.0, 1050.0])
    assert max(st.ev_w[2:]) < 0.2 < min(st.ev_w[:2]), st.ev_w
    # one of the two moved off far (under QBAR_MIN_SHARE of an even share),
    # the other hardly: both keep standing while the link stays full
    st.ev_w = [0.35, 0.35, 0.01, 0.29]
    for k in range(10):
        look([200.0, 230.0, 750.0, 1050.0])
    assert st.ev_w[3] < 0.2 and st.ev_w[2] < 0.2, st.ev_w
    # a plane that carries only ACKs: its few echoes scatter, nothing stands
    st.ev_w, st.ev_c, st.ev_q, st.ev_qbar = [0.25] * n, [None] * n, [None] * n, [0.0] * n
    for _ in range(10):
        ctl._split(peer, st, [200.0, 230.0, 750.0, 1050.0], [4000] * n, [True] * n, [None] * n,
                   [False] * n, 0.01, 0.0)
    assert st.ev_w == [0.25] * n and st.ev_qbar[3] > W.QBAR_MIN_US
    even = [0.25] * 4
    assert W.standing_queues([300.0, 350.0, 120.0, 0.0], [True, True, True, False], even) == [False] * 4  # 0: retired
    assert W.standing_queues([400.0, 500.0, 120.0, 80.0], [True] * 4, even) == [True, True, False, False]
    # one EV alone: the host (a busy CPU, an echo that waited), not a link
    assert W.standing_queues([400.0, 120.0, 100.0, 80.0], [True] * 4, even) == [False] * 4
    # an EV carrying little is not judged: its few echoes are no measure
    assert W.standing_queues([400.0, 500.0, 120.0, 80.0], [True] * 4, [0.01, 0.33, 0.33, 0.33]) == [False] * 4
    # ... unless it stood at the last look: the rule moved it off, and its
    # sibling across the same link must not be left to stand alone
    assert W.standing_queues([400.0, 500.0, 120.0, 80.0], [True] * 4, [0.01, 0.33, 0.33, 0.33],
                             [True, True, False, False]) == [True, True, False, False]
    assert W.standing_queues([400.0, 500.0, 120.0, 80.0], [True] * 4, [0.01, 0.01, 0.49, 0.49],
                             [True, False, False, False]) == [False] * 4
    assert W.standing_queues([200.0, 200.0, 0.0], [True] * 3, even[:3]) == [False] * 3   # under QBAR_MIN_US


def test_a_quiet_plane_returns_to_its_configured_split():
    """No EV queues, is marked or loses: the split moves back toward the
    configured one (even here) with RELAX_TAU_S, within the share the usable
    EVs hold; a retired EV keeps its weight for when it comes back."""
    home = [0.25] * 4
    w = [0.05, 0.45, 0.25, 0.25]
    t, dt = 0.0, 0.01
    while t < W.RELAX_TAU_S - dt / 2:
        w = W.relax_evs(w, home, [True] * 4, dt) or w
        t += dt
    # one time constant: about 1/e of the gap left
    assert abs((0.25 - w[0]) / 0.2 - math.exp(-1)) < 0.02, w
    assert abs(sum(w) - 1.0) < 1e-9
    out = W.relax_evs([0.05, 0.45, 0.3, 0.2], home, [True, True, True, False], dt)
    assert out[3] == 0.2 and abs(sum(out[:3]) - 0.8) < 1e-9 and out[0] > 0.05
    assert W.relax_evs(home, home, [True] * 4, dt) is None           # there already


def test_loss_on_an_ev_moves_its_share_and_it_comes_back_after():
    """The controller's split: an EV flagged lossy loses share to its
    siblings; once the loss has cleared the split relaxes back."""
    ctl = _controller()
    ctl.unit = 16384
    st = _state(1)
    st.groups, n = [[0, 1, 2, 3]], 4
    st.ev_w, st.ev_c, st.ev_d, st.ev_idle, st.ev_q = [0.25] * n, [None] * n, [50 * MB] * n, [0] * n, [None] * n
    st.ev_qbar, st.ev_stood = [0.0] * n, [False] * n
    st.ev_home = [0.25] * n
    peer = type("Peer", (), {"name": "p"})()
    qp = [200.0, 250.0, 220.0, 240.0]

    def look(lossy):
        ctl._split(peer, st, qp, [MB // 2] * n, [True] * n, [None] * n, lossy, 0.01, 0.0)
    for _ in range(10):
        look([True, False, False, False])
    assert st.ev_w[0] < 0.1 and min(st.ev_w[1:]) > 0.25, st.ev_w
    for _ in range(int(3 * W.RELAX_TAU_S / 0.01)):
        look([False] * n)
    assert st.ev_w[0] > 0.2 and abs(sum(st.ev_w) - 1.0) < 1e-6, st.ev_w
