"""Adaptive path weights, the adaptive flowlet gap, and run-time spray mode.

Adaptive weights (``[weights] mode = "adaptive"``, the default unless a
plane has a typed weight): the agent re-weights a peer's paths so each
plane carries traffic in proportion to what it can deliver.

What a plane's first hop can carry, where the host knows it (the rate of a
tbf at the device's root, the link speed; netdev.root_qdiscs, re-read every
CAP_TTL_S or with the backlog), bounds its capacity estimate: planes of
different known rates start weighted by them before the first byte, a
lowered rate takes effect at once, and a plane whose own shaper is full is
taken to deliver exactly its rate (the interval's byte count under a busy
CPU is noise, and following it drifted the shares off the rates).

Every `interval_ms`, per plane (the EVs of a plane share its capacity and
weight):

* delivered rate d: what the plane device transmitted (its tx_bytes), i.e.
  what actually left on that plane;
* its own queue: where the plane device has a qdisc, its backlog divided by
  d (exact, and local: MRC's planes are NICs, the first hop is the usual
  bottleneck); otherwise, or when larger, the queueing delay seen by the
  peer's feedback echoes: RTT minus the path's base (minimum) RTT, fresh
  echoes only, and none the peer held for a reverse packet to carry it
  (MRC_F_EHELD: the wait is not the path's; mrc_path_delay, bpf/evidence.h),
  averaged over the plane's
  paths, less the smallest such delay of any plane (delay that every plane
  shares, e.g. a busy CPU, is no plane's own queue);
* capacity estimate c: a plane with a queue of its own (> 1.5 ms) is
  saturated and delivers what it can, so c follows d (an EWMA over the
  saturated intervals, since TCP's sawtooth drains a queue now and then; a
  full queue delivering under 70 % of c is a rate drop, taken at once); a
  plane without a queue for 3 intervals in a row can take more, so c grows
  10 % per interval (probing) until it saturates too. A plane too lightly
  used to be measured counts as without a queue, so it cannot starve.

The weights move half way to the capacity shares c / sum(c) per interval,
and the slot table is rewritten only when they moved by 2.4 % in total:
every rewrite moves traffic between queues, and that reorders packets. When
no plane has a queue of its own (all have room, e.g. the CPU is the limit)
nothing changes: there is nothing to learn and moving weight only reorders.
While a peer is idle (too little traffic to measure) nothing changes either.
A plane whose rate drops mid-stream saturates at once and its share falls
within a few intervals (tests/integration/test_aggregation.py: 30-100 ms of
traffic from the delivered rate alone; 13 ms where the lowered rate is its
shaper's, read directly); one whose rate rises stops queueing and probes up.

Why not steer by delay alone: the queue of a plane given more than its rate
fills within milliseconds (it integrates the rate error), so delay is an
on/off signal, and a controller acting on its size oscillated (measured
here), and echo delay also grows with a busy receiver CPU, which says
nothing about the plane. Delay (or backlog) says *whether* a plane is
saturated; the delivered rate says by how much.

Within a plane, the same law splits the plane's weight over its EVs
(split_evs). On a routed plane each EV crosses the fabric links its hash
picks, and with few EVs the hash is lumpy (with 4 EVs and 2 spines, 3:1 or
worse half the time): an even split overloads one link while another idles.
An EV's own queue is its delay beyond the plane's least-delayed EV (and
beyond EV_Q_REL of the plane's mean delay, so the sampling spread of a queue
they all share is no one's own), or CE marks on its echoes MARK_REL more
often than a sibling's (with_marks: a fabric that marks is seen long before
a queue stands, and TCP sprayed over paths of unequal delay backs off on the
reordering before one does), or loss standing above its siblings' over the
last second or so (loss_looks, lossy_evs), or a queue under the saturation
threshold that stands, averaged over 40 ms, on two EVs at least at once
(standing_queues: a link cross traffic keeps full, once TCP has backed
off); an EV with one is estimated at
what it carries, one without probes up, and each EV's share of its plane
follows its estimate. A plane with none relaxes toward its configured split
(relax_evs). Between planes, marks count where all of a plane's EVs are
marked (a bottleneck the whole plane shares, which no split can avoid).
Where every EV of a plane shares its fate (point-to-point planes) no EV has
a queue of its own and the split stays even. A fabric link whose queue
clears sees its EVs probe back up (measured on the testbed:
tests/integration/test_fabric_mrc.py).

Updates go through instance.slots.set_slots: the idle slot table is written, then
the peer flips to it, so the datapath never sees a half-written table.

What the agent costs (it shares the CPUs with the datapath it steers):
a step reads every peer's tx PSN in one read of mrc_peer_seq and looks only
at the peers that sent IDLE_BPS since the last step or did not for less than
QUIET_AFTER steps (an idle peer gets a full step every IDLE_FULL_S, which
learns from a probe's echo, if any came, to keep base RTTs current); a busy
step reads the peer's counters in one batch, the qdiscs by one netlink dump
at most every BACKLOG_TTL_S, and rewrites the slot table only when the
weights moved by WRITE_MIN. Where the CPU is the limit, every
CPU-millisecond the agent spends is goodput the datapath loses (what it
cost and saved is in docs/developing.md, "The idle agent").

Adaptive flowlet gap (``peer.flowlet_gap_us`` absent or 0): the gap must
exceed the delay difference between paths, or a flowlet's first packet on a
new path overtakes its last on the old one. The agent sets it to
1.5 x (largest - smallest RTT of the usable paths, from fresh echoes) + 100 µs,
within 100 µs..100 ms.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import socket
import struct
import time
from dataclasses import dataclass, field

from ..datapath import abi as wire
from ..datapath import libbpf, maps as dpmaps, netdev
from ..instance import config as cfgmod
from ..instance.slots import rebuild_slots, set_path_weights
from . import loop as agentmod

log = logging.getLogger("mrc.weights")
_PEER_AT = wire.Peer.offsets()
_DELAY = struct.Struct(wire.PathDelay.fmt())
_DELAY_SAMPLES, _DELAY_RTT, _DELAY_EWMA, _DELAY_HELD = (
    [n for n, _f in wire.PathDelay.LAYOUT].index(k) for k in ("samples", "rtt_us", "ewma_us", "held"))
_CONG_CE, _CONG_LOSS = (wire.PathCong.offsets()[k] for k in ("ce_echoes", "loss_echoes"))

SCALE = 240             # integer weights sum to this: 1/240 steps; a slot table repeats a
                        # 240-slot round (960 slots), which the agent computes 4x faster than 1000
Q_SAT_US = 1500.0       # standing queue: the plane is saturated
PROBE = 0.10            # growth per interval of an unsaturated plane's capacity estimate
PROBE_AFTER = 3         # ... after this many intervals in a row without a queue
SAT_GAIN = 0.35         # capacity estimate of a saturated plane: EWMA of its delivered rate
EWMA = 0.3              # smoothing of the per-interval rates
SMOOTH = 0.5            # weights move this fraction of the way to the new shares per interval:
                        # every change of weights reorders packets between planes, so jitter costs
WRITE_MIN = 12          # rewrite the slot table when weights moved by >= 12/240 in total:
                        # each rewrite moves traffic between queues, i.e. reorders
IDLE_BPS = 1_000_000    # below this many bytes/s toward a peer: do not re-weight
QUIET_AFTER = 3         # intervals in a row under IDLE_BPS before a peer counts as idle
IDLE_FULL_S = 1.0       # an idle peer: a full step (new echoes, its planes' rates) once a second
IDLE_STEP_S = 0.05      # every peer idle: the next look for traffic this much later, not an interval
PSN_BYTES = 1500        # a wire packet carries at most this much: PSNs/s x this bounds bytes/s
MIN_RTT_WINDOW_S = 10.0  # base RTT = minimum over the last 10-20 s
GAP_PERIOD_S = 0.1
USABLE_TTL_S = 0.1
BACKLOG_TTL_S = 0.03
CAP_TTL_S = 0.25        # a plane's local rate (shaper, link speed) is re-read this often
GAP_MIN_US, GAP_MAX_US = 100, 100_000
EV_Q_REL = 0.5          # an EV's own queue must exceed this fraction of its plane's mean delay
EV_PROBE = 0.5          # growth per interval of an EV without a queue beside one that has: fast
                        # enough to leave a congested link within ~0.1 s (docs/fabric.md)
EV_PROBE_AFTER = 1      # ... from the first interval a sibling's queue stands: the EVs of a plane
                        # share the far host and the plane's own queue, so the comparison is fair
LOSS_TAU_S = 1.0        # loss per EV: a count of the looks whose echoes said loss, decayed with this
LOSS_LOOKS = 3.0        # ... stands at this count at least (lossy_evs; docs/fabric.md)
LOSS_RATIO = 4.0        # ... and this many times the least lossy usable sibling's
RELAX_TAU_S = 2.0       # a plane none of whose EVs queues, is marked or loses: its split returns
                        # toward the configured one with this time constant (relax_evs)
QBAR_TAU_S = 0.04       # an EV's own queue averaged over time with this time constant: a link a
                        # cross stream fills holds its EVs 0.3-1 ms above their siblings look after
                        # look, under the saturation threshold; spikes of busy CPUs come and go
QBAR_MIN_US = 250.0     # ... stands at this average at least (standing_queues)
QBAR_CLIP_US = 1000.0   # ... to which a look adds at most this much: one echo delayed by
                        # milliseconds (a busy CPU) is not a standing queue, two in a row are
QBAR_RATIO = 3.0        # ... and this many times the least usable sibling's average
QBAR_TOGETHER = 2       # ... on this many EVs at once: a link's queue delays all that cross it
QBAR_MIN_SHARE = 0.25   # ... of those carrying this much of an even share at least
QBAR_BUSY_BPS = 6.25e6  # ... on a plane sending this many bytes/s at least: the few echoes of a
                        # plane that carries only ACKs scatter by more than such a queue
MARK_REL = 0.25         # marked this much more often than a sibling: a congested link of its own
EV_Q_SAT_US = 1000.0    # an EV's own queue this long says its link is full: TCP sprayed over
                        # paths of unequal delay backs off on the reordering, and a congested
                        # link's queue stood at 1.5-2 ms (the sampling spread without one: 0.1-0.4)
EV_Q_UNITS = 1.0        # ... or, where longer, the time a spraying unit takes at an even share
                        # of the plane's EVs (ev_q_sat): units queue behind each other on slow
                        # links without any link being full


@dataclass
class _PeerState:
    groups: list[list[int]]              # path ids per plane
    devices: list[str]                   # plane device per group
    w: list[float]                       # weight per plane (the last shares)
    c: list[float | None]                # capacity estimate per plane (bytes/s)
    d: list[float | None]                # smoothed delivered rate per plane
    idle: list[int]                      # intervals in a row without a standing queue
    min_rtt: list[float]                 # per path: current window's minimum RTT (µs)
    min_prev: list[float]                # previous window's minimum
    window_start: float = 0.0
    last_tx: list[int] = field(default_factory=list)
    last_dev: list[int | None] = field(default_factory=list)
    last_samples: list[int] = field(default_factory=list)
    last_t: float = 0.0
    written: list[int] = field(default_factory=list)
    updates: int = 0
    caps: list[float | None] | None = None   # per plane: its known local rate (Controller._caps)
    caps_t: float = 0.0
    full_at: float = 0.0                 # Controller._quiet: an idle peer's next full step
    look_delay: bytes = b""              # the paths' mrc_path_delay at the last full idle step
    quiet: int = 0
    # per path, the same law one level down (split_evs): the share of its
    # plane's weight, its capacity estimate, smoothed sent rate, idle count
    ev_w: list[float] = field(default_factory=list)
    ev_c: list[float | None] = field(default_factory=list)
    ev_d: list[float | None] = field(default_factory=list)
    ev_idle: list[int] = field(default_factory=list)
    ev_q: list[float | None] = field(default_factory=list)   # per path: its own queue at the last look
    ev_qbar: list[float] = field(default_factory=list)       # per path: its own queue, averaged (standing_queues)
    ev_stood: list[bool] = field(default_factory=list)       # per path: it stood at the last look (standing_queues)
    last_marks: tuple | None = None      # per path: (CE echoes, loss echoes, echoes) at the last look
    ev_home: list[float] = field(default_factory=list)   # per path: its configured share of the plane
    loss_looks: list | None = None       # per path: decayed count of its looks that said loss (lossy_evs)


def quantize(shares: list[float], usable: list[bool], total: int = SCALE) -> list[int]:
    """Integer weights summing to `total`, proportional to shares (largest
    remainder), every usable path at least 1 so it keeps being measured."""
    s = sum(x for x, u in zip(shares, usable) if u) or 1.0
    raw = [(x / s * total if u else 0.0) for x, u in zip(shares, usable)]
    out = [max(1, int(r)) if u else 0 for r, u in zip(raw, usable)]
    rem = total - sum(out)
    order = sorted(range(len(raw)), key=lambda i: raw[i] - int(raw[i]), reverse=True)
    i = 0
    while rem > 0 and order:
        j = order[i % len(order)]
        if usable[j]:
            out[j] += 1
            rem -= 1
        i += 1
        if i > 10 * len(order) and rem > 0:
            break
    while rem < 0:
        j = max(range(len(out)), key=lambda k: out[k])
        out[j] -= 1
        rem += 1
    return out


def step_capacity(c: list[float | None], d: list[float], q_us: list[float | None],
                  sent: list[int], usable: list[bool], idle: list[int],
                  offered: list[float] | None = None,
                  local: list[bool] | None = None,
                  cap: list[float | None] | None = None, probe: float = PROBE,
                  probe_after: int = PROBE_AFTER, q_sat: float = Q_SAT_US) -> list[float | None]:
    """One control step (pure, unit-tested): new capacity estimates per
    plane from delivered rates d (bytes/s), queueing delays q (None: no
    fresh sample) and bytes sent on each plane this interval. `idle` counts,
    per plane, consecutive intervals without a standing queue (updated in
    place). `offered` (bytes/s handed to the plane) tells a saturated plane
    from a queue draining because the sender backed off: the delay echoes
    lag by the queue's own length, so only a plane still offered at least
    what it delivers gives a capacity reading - unless `local` says the
    queue is the plane's own qdisc backlog, read now: a queue that is still
    full delivers at the plane's rate, so one delivering far under the
    estimate is a rate drop whatever the sender offers (a rate cut makes
    TCP back off at once: waiting for it to offer again cost 100-200 ms).
    `cap` (bytes/s, None: unknown) is what the plane's first hop can carry
    (its shaper's rate, its link speed): no estimate goes above it. `probe`:
    the growth per interval of one without a queue, after `probe_after`
    such intervals; `q_sat`: the queue (µs) that says saturated."""
    out = list(c)
    offered = offered or d
    local = local or [False] * len(c)
    cap = cap or [None] * len(c)
    for i in range(len(c)):
        if not usable[i]:
            continue
        if local[i] and q_us[i] is not None and q_us[i] > q_sat and cap[i] is not None:
            # its own shaper is full, so it delivers exactly its rate (what
            # the interval's byte count says is noise: with the CPU the
            # limit, a sawtooth's worth of it, and it drifted the shares)
            idle[i] = 0
            out[i] = cap[i]
        elif local[i] and q_us[i] is not None and q_us[i] > q_sat and c[i] and 0 < d[i] < 0.7 * c[i]:
            idle[i] = 0
            out[i] = d[i]
        elif q_us[i] is not None and q_us[i] > q_sat and d[i] > 0 and offered[i] < 0.9 * d[i]:
            idle[i] = 0       # draining, not measuring: keep the estimate
        elif q_us[i] is not None and q_us[i] > q_sat and d[i] > 0:
            # saturated: it delivers what it can; averaged over the
            # saturated intervals (TCP's sawtooth drains a queue now and then)
            idle[i] = 0
            if not c[i] or d[i] < 0.7 * c[i]:
                out[i] = d[i]       # a full queue delivering far less: the rate fell
            else:
                out[i] = c[i] + SAT_GAIN * (d[i] - c[i])
        elif q_us[i] is not None or sent[i] == 0:
            idle[i] += 1
            base = max(c[i] or 0.0, d[i])
            if base <= 0:
                base = max([x for x in d if x > 0] or [1.0])
            # room left: probe up, once the queue has stayed away for a while
            # (a dip of the sawtooth is not spare capacity)
            out[i] = base * (1 + probe) if idle[i] >= probe_after else base
        # sending without a fresh sample: no news, keep the estimate
    # never let the probing run away: past the plane's known rate, or where
    # that is unknown past 4 x the best delivered rate
    top = max(d) if d else 0.0
    for i, x in enumerate(out):
        if x is not None and cap[i] is not None:
            out[i] = min(x, cap[i])
        elif x is not None and top > 0:
            out[i] = min(x, 4 * top)
    return out


def own_queues(qp: list[float | None], group: list[int]) -> list[float | None]:
    """Per EV of one plane: its queueing delay beyond the least-delayed
    fresh EV of that plane (None without a fresh echo, or where fewer than
    two EVs have one). Delay every EV of a plane shares (the plane's own
    shaper, the far host's CPU) is nobody's own; what is left sits on the
    fabric links the EV's hash crosses."""
    fresh = [qp[i] for i in group if qp[i] is not None]
    if len(fresh) < 2:
        return [None] * len(group)
    low = min(fresh)
    # beside a queue the whole plane shares, the EVs' echoes differ by
    # when each was sampled: only a difference of EV_Q_REL of the plane's
    # mean delay is a queue of the EV's own
    floor = EV_Q_REL * sum(fresh) / len(fresh)
    return [None if qp[i] is None else (qp[i] - low if qp[i] - low > floor else 0.0) for i in group]


def with_marks(q_own: list[float | None], marks: list[float | None], q_sat: float) -> list[float | None]:
    """`marks`: per EV (or plane), the fraction of its echoes since the last
    step that said CE (None: no echo). One marked MARK_REL more often than
    its least-marked sibling crosses a queue the fabric flagged: its own,
    however short its delay (a switch marks from a threshold well under a
    queue that TCP's reordering response would let stand; bursts get some
    marks on every link), so it reads as twice `q_sat`."""
    seen = [m for m in marks if m is not None]
    if len(seen) < 2:
        return q_own
    low = min(seen)
    return [max(q or 0.0, 2 * q_sat) if m is not None and m - low >= MARK_REL else q
            for q, m in zip(q_own, marks)]


def loss_looks(saw: list[bool], looks: list[float], dt: float) -> list[float]:
    """Per path, the count of looks whose echoes said loss, decayed with
    LOSS_TAU_S over time (`saw`: this look's echoes of the path said loss;
    `dt`: seconds since the last look). A count of looks, not a fraction of
    echoes or units: the receiver flags a path's echoes for a fixed time
    after a loss, so the fraction of flagged echoes grows with the path's
    rate, and a rule over looks in a row (what this replaced) read a link
    dropping 1 % under a stream of a few units per look only at random."""
    decay = math.exp(-dt / LOSS_TAU_S) if dt > 0 else 1.0
    return [x * decay + (1.0 if s else 0.0) for s, x in zip(saw, looks)]


def lossy_evs(looks: list[float], usable: list[bool]) -> list[bool]:
    """One plane's EVs whose loss stands: a count of lossy looks (loss_looks)
    of LOSS_LOOKS at least and LOSS_RATIO times the least of its usable
    siblings' (a retired EV carries nothing, so its count says nothing). A link that drops at
    random loses look after look, on its EVs only; one TCP filling healthy
    links loses a burst on one of them now and then (a look or two), and a
    receiver's own drops (a full backlog) hit every EV arriving, which the
    comparison with siblings leaves out."""
    seen = [x for x, u in zip(looks, usable) if u]
    if len(seen) < 2:
        return [False] * len(looks)
    low = min(seen)
    return [u and x >= LOSS_LOOKS and x >= LOSS_RATIO * low for x, u in zip(looks, usable)]


def standing_queues(qbar: list[float], usable: list[bool], w: list[float],
                    stood: list[bool] | None = None) -> list[bool]:
    """One plane's EVs whose own queue stands: averaged over time (QBAR_TAU_S)
    at QBAR_MIN_US at least and QBAR_RATIO times the least of its usable
    siblings' averages, on QBAR_TOGETHER EVs at least at once (`w`: their
    shares of the plane). A fabric link that cross traffic keeps full delays
    its EVs by less than the saturation threshold (ev_q_sat) once TCP has
    backed off, but at nearly every look and every EV that crosses it alike.
    What delays one EV alone is the host: a busy CPU, a burst, or the echo
    waiting for a reverse packet, which an EV carrying little meets at most
    of its few echoes (an EV under QBAR_MIN_SHARE of an even share is not
    judged: read as a queue, that wait kept a starved EV starved). An EV
    that stood at the last look (`stood`) is judged whatever it carries now:
    its share is the rule's doing, and dropping it from the count left its
    sibling across the same link alone, so that sibling kept its share and
    took the one given up (docs/fabric.md)."""
    idx = [k for k, u in enumerate(usable) if u]
    if len(idx) < 2:
        return [False] * len(qbar)
    stood = stood or [False] * len(qbar)
    low = min(qbar[k] for k in idx)
    floor = QBAR_MIN_SHARE * sum(w[k] for k in idx) / len(idx)
    out = [u and x >= QBAR_MIN_US and x >= QBAR_RATIO * low and (s >= floor or was)
           for x, u, s, was in zip(qbar, usable, w, stood)]
    return out if sum(out) >= QBAR_TOGETHER else [False] * len(qbar)


def relax_evs(w: list[float], home: list[float], usable: list[bool], dt: float) -> list[float] | None:
    """One step of a quiet plane's split (no EV queues, is marked or loses)
    back toward its configured one (`home`), with RELAX_TAU_S: split_evs
    moves weight only on a signal, so an EV weighted down for a fault, a
    queue or loss that has since cleared stayed down until some other EV's
    signal moved the split again. Usable EVs only, within the share they
    hold; None when that is already there."""
    idx = [i for i, u in enumerate(usable) if u]
    mass, h = sum(w[i] for i in idx), sum(home[i] for i in idx)
    if len(idx) < 2 or mass <= 0 or h <= 0:
        return None
    a = 1.0 - math.exp(-dt / RELAX_TAU_S)
    out = list(w)
    for i in idx:
        out[i] = w[i] + a * (home[i] * mass / h - w[i])
    if sum(abs(x - y) for x, y in zip(out, w)) < 1e-4:
        return None
    return out


def _least(xs: list[float | None]) -> float | None:
    seen = [x for x in xs if x is not None]
    return min(seen) if seen else None


def ev_q_sat(d: list[float], unit: int) -> float:
    """The own queue (µs) that says an EV's link is full, for one plane's
    EVs sending d bytes/s each: EV_Q_SAT_US, or EV_Q_UNITS units of `unit`
    bytes at their mean rate where that is longer. On a slow link a unit
    sent beside another on the same link waits the other's whole length:
    at 200 Mbit/s per link a 32 KiB unit takes 1.3 ms, and 1-2 ms echoes
    came and went on random EVs of an evenly loaded fabric; chasing them
    moved share between links every few intervals and doubled TCP's
    spurious retransmissions (docs/fabric.md, "Per-EV weights")."""
    mean = sum(d) / len(d) if d else 0.0
    return max(EV_Q_SAT_US, EV_Q_UNITS * unit / mean * 1e6) if mean > 0 else EV_Q_SAT_US


def split_evs(w: list[float], c: list[float | None], d: list[float], q_own: list[float | None],
              sent: list[int], usable: list[bool], idle: list[int],
              min_weight: float, q_sat: float = EV_Q_SAT_US) -> tuple[list[float], list[float | None]] | None:
    """One step of a plane's split over its EVs (pure, unit-tested): the
    plane law (step_capacity) applied to the EVs, whose capacities are those
    of the fabric links their hashes cross. `w` are the EVs' shares of the
    plane (they sum to 1); the part of it the usable, estimated EVs hold is
    redistributed by capacity shares, half way per step; retired EVs keep
    their share for when they come back. None when no EV has a queue of its
    own: nothing to learn (a plane whose first hop is the bottleneck, or no
    bottleneck at all), and moving weight would only move traffic."""
    if not any(x is not None and x > q_sat for x in q_own):
        return None
    c = step_capacity(c, d, q_own, sent, usable, idle, probe=EV_PROBE, probe_after=EV_PROBE_AFTER,
                      q_sat=q_sat)
    # an EV not yet estimated (no fresh echo while a sibling queued) keeps its share too
    known = [u and x is not None for u, x in zip(usable, c)]
    target = shares(c, known, min_weight)
    mass = sum(x for x, k in zip(w, known) if k)
    if not any(target) or mass <= 0:
        return None
    return [o + SMOOTH * (t * mass - o) if k else o for o, t, k in zip(w, target, known)], c


def shares(c: list[float | None], usable: list[bool], min_weight: float) -> list[float]:
    """Capacity shares of the usable planes, each at least min_weight of an equal share."""
    idx = [i for i, u in enumerate(usable) if u and c[i]]
    out = [0.0] * len(c)
    if not idx:
        return out
    tot = sum(c[i] for i in idx)
    for i in idx:
        out[i] = max(c[i] / tot, min_weight / len(idx))
    s = sum(out)
    return [x / s for x in out]


def overlay_unit(cfg: cfgmod.Config) -> int:
    """The spraying unit: the overlay's gso_max_size as `up` set it (sysfs),
    else what the config would pick where units do not cross whole."""
    try:
        return int(open(f"/sys/class/net/{cfg.overlay_device}/gso_max_size").read())
    except (OSError, ValueError):
        return cfg.spray_unit()


class Controller:
    """Adaptive weights for every peer of one instance (runs in the agent)."""

    def __init__(self, cfg: cfgmod.Config, dp, trace: str | None = None):
        self.cfg, self.dp = cfg, dp
        self.unit = overlay_unit(cfg)
        # MRC_WEIGHTS_TRACE=FILE: one JSON line per control step (benchmarks, debugging)
        self.trace = open(trace, "a", buffering=1) if trace else None
        self.peers: dict[int, _PeerState] = {}
        self.usable: dict[int, tuple[float, list[bool]]] = {}
        self.backlog_cache: tuple[float, dict[int, tuple[int, int | None]]] | None = None
        self.gaps: dict[int, int] = {}
        self.psns: list[int] = []           # every peer's tx PSN at the last step (Datapath.tx_psns)
        self.psns_t = 0.0
        self.by_index = {p.index: p for p in cfg.peers}
        self.asleep: dict[int, float] = {}  # idle peers (Controller._quiet): index -> next full step
        self.ifindexes: dict[str, tuple[float, int | None]] = {}   # device -> (when asked, ifindex)
        self.tx_fds: dict[str, int] = {}    # device -> its tx_bytes file, open

    def _state(self, peer: cfgmod.Peer, now: float) -> _PeerState:
        st = self.peers.get(peer.index)
        if st is None:
            planes: dict[int, list[int]] = {}
            devs: dict[int, str] = {}
            for p in peer.paths:
                planes.setdefault(p.plane.index, []).append(p.id)
                devs[p.plane.index] = p.plane.device
            groups = list(planes.values())
            w = [float(sum(max(peer.paths[i].weight, 0) for i in g)) for g in groups]
            tot = sum(w) or 1.0
            n, k = len(peer.paths), len(groups)
            ev_w = [0.0] * n
            for g in groups:
                sub = [max(peer.paths[i].weight, 0) for i in g]
                for i, x in zip(g, sub):
                    ev_w[i] = x / sum(sub) if sum(sub) else 1 / len(g)
            st = _PeerState(groups=groups, devices=[devs[i] for i in planes], w=[x / tot for x in w],
                            c=[None] * k, d=[None] * k, idle=[0] * k, min_rtt=[math.inf] * n,
                            min_prev=[math.inf] * n, window_start=now, ev_w=ev_w, ev_home=list(ev_w),
                            ev_c=[None] * n,
                            ev_d=[None] * n, ev_idle=[0] * n, ev_q=[None] * n,
                            ev_qbar=[0.0] * n, ev_stood=[False] * n)
            self.peers[peer.index] = st
        return st

    def _backlogs(self, now: float) -> dict[int, int]:
        """Root qdisc backlog (bytes) per ifindex: the local queue of a plane.
        A dump costs CPU the datapath on this 2-core machine misses (through
        pyroute2, 12 ms: adaptive mode lost a third of its goodput reading
        it every 10 ms), so it is read at most every BACKLOG_TTL_S."""
        return {k: v[0] for k, v in self._qdiscs(now, BACKLOG_TTL_S).items()}

    def _qdiscs(self, now: float, ttl: float) -> dict[int, tuple[int, int | None]]:
        """(backlog bytes, shaper rate bytes/s or None) of each root qdisc, by ifindex."""
        if self.backlog_cache and now - self.backlog_cache[0] < ttl:
            return self.backlog_cache[1]
        out = netdev.root_qdiscs()
        self.backlog_cache = (now, out)
        return out

    def _caps(self, st: _PeerState, now: float) -> list[float | None]:
        """What each plane's first hop can carry (bytes/s): the rate of a
        shaper at its root (tbf) and its link speed, the lower of the two;
        None where neither is known. Re-read every CAP_TTL_S, so a rate the
        operator changes takes effect within that."""
        fresher = self.backlog_cache is not None and self.backlog_cache[0] > st.caps_t
        if st.caps is not None and now - st.caps_t < CAP_TTL_S and not fresher:
            return st.caps
        qd = self._qdiscs(now, CAP_TTL_S)
        caps: list[float | None] = []
        for dev in st.devices:
            known = [x for x in (qd.get(self._ifindex(dev), (0, None))[1], self._speed(dev)) if x]
            caps.append(float(min(known)) if known else None)
        st.caps, st.caps_t = caps, now
        return caps

    @staticmethod
    @functools.lru_cache(maxsize=1024)
    def _speed(dev: str) -> int | None:
        """Link speed in bytes/s (/sys/class/net/DEV/speed, Mbit/s; -1 or
        unreadable when the driver does not know). Read once per device: a
        NIC's speed changes with a link renegotiation, which restarts mrc's
        use of the plane anyway."""
        try:
            with open(f"/sys/class/net/{dev}/speed") as f:
                mbit = int(f.read())
        except (OSError, ValueError):
            return None
        return mbit * 125_000 if mbit > 0 else None

    def _ifindex(self, dev: str) -> int | None:
        """The device's ifindex, asked again after CAP_TTL_S (a plane
        device deleted and made again gets a new one)."""
        now = time.monotonic()
        hit = self.ifindexes.get(dev)
        if hit is None or now - hit[0] >= CAP_TTL_S:
            try:
                idx = socket.if_nametoindex(dev)
            except OSError:
                idx = None
            hit = self.ifindexes[dev] = (now, idx)
        return hit[1]

    def _dev_tx(self, dev: str) -> int | None:
        """The device's tx_bytes, by pread on a file kept open (sysfs makes
        the value anew at each read from offset 0): an open and a close per
        plane each step cost more than the read."""
        fd = self.tx_fds.get(dev)
        try:
            if fd is None:
                fd = self.tx_fds[dev] = os.open(f"/sys/class/net/{dev}/statistics/tx_bytes", os.O_RDONLY)
            return int(os.pread(fd, 32, 0))
        except (OSError, ValueError):
            if fd is not None:
                os.close(self.tx_fds.pop(dev))
            return None

    def _usable(self, peer: cfgmod.Peer, now: float) -> list[bool]:
        """Which paths the datapath may use; path states change rarely, so
        this is re-read every USABLE_TTL_S, not every interval (the agent
        shares two CPUs with the datapath it steers)."""
        hit = self.usable.get(peer.index)
        if hit and now - hit[0] < USABLE_TTL_S:
            return hit[1]
        out = self.dp.usable_paths(peer.index, len(peer.paths))
        self.usable[peer.index] = (now, out)
        return out

    def read(self, peer: cfgmod.Peer, now: float = 0.0):
        """(samples, rtt_us, ewma_us, held) of each path's mrc_path_delay, which
        paths are usable, and each path's tx bytes. The fields are sliced out
        of one batch read, not unpacked into objects: the step runs a hundred
        times a second per busy peer beside the traffic it steers."""
        stats_m, delay_m = self.dp.map("mrc_path_stats"), self.dp.map("mrc_path_delay")
        delays = [(t[_DELAY_SAMPLES], t[_DELAY_RTT], t[_DELAY_EWMA], t[_DELAY_HELD]) for t in _DELAY.iter_unpack(
            delay_m.read_raw(self.dp.path_idx(peer.index, 0), len(peer.paths)))]
        # tx_bytes of each path, summed over CPUs: one batch read of the
        # peer's range (every CPU's struct mrc_path_stats, 8-byte aligned)
        n = len(peer.paths)
        words = memoryview(stats_m.read_raw(self.dp.path_idx(peer.index, 0), n)).cast("Q")
        per_path = len(words) // n if n else 0
        per_cpu = per_path // libbpf.num_possible_cpus() if per_path else 0
        tx = [sum(words[i * per_path + 1:(i + 1) * per_path:per_cpu]) for i in range(n)]
        return delays, self._usable(peer, now), tx

    def _echoed(self, peer: cfgmod.Peer, st: _PeerState) -> bool:
        """Whether an echo reached any path of an idle peer since its last
        full step (a probe's): the only thing such a step can learn."""
        raw = self.dp.map("mrc_path_delay").read_raw(self.dp.path_idx(peer.index, 0), len(peer.paths))
        if raw == st.look_delay:
            return False
        st.look_delay = raw
        return True

    def step(self, now: float) -> float | None:
        """One control interval over the peers; returns IDLE_STEP_S when
        every peer is idle (the agent loop waits that long instead of an
        interval: a peer that starts sending keeps the weights it had for
        up to that long)."""
        txs: dict[str, int | None] = {}     # each plane device read once a step, for every peer
        psns, prev = self.dp.tx_psns(self.cfg.index_span), self.psns
        span = now - self.psns_t if self.psns_t else 0.0
        self.psns, self.psns_t = psns, now
        # looked at: every peer not idle, an idle one whose PSN moved or
        # whose full step is due; the others cost nothing (one compare of
        # the PSN lists when none moved)
        asleep = self.asleep
        moved = set(dpmaps.changed(psns, prev or None))
        look = [i for i in self.by_index if i not in asleep or i in moved or now >= asleep[i]]
        for i in look:
            peer = self.by_index[i]
            st = self._state(peer, now)
            sent_bps = (psns[i] - prev[i]) * PSN_BYTES / span if span > 0 and i < len(prev) else math.inf
            # an idle peer's caps are followed at its full steps only: a
            # rate lowered meanwhile meets no traffic, and the first look
            # that sees traffic ends the quiet
            skip = self._quiet(st, sent_bps, now, IDLE_FULL_S)
            if st.quiet > QUIET_AFTER:
                asleep[i] = st.full_at
            else:
                asleep.pop(i, None)
            if skip:
                continue
            caps = self._caps(st, now)
            if self._follow_caps(st, caps):
                self._apply(peer, st)
            if st.quiet > QUIET_AFTER and not self._echoed(peer, st):
                continue
            dev = [txs[d] if d in txs else txs.setdefault(d, self._dev_tx(d)) for d in st.devices]
            delays, usable, tx = self.read(peer, now)
            n = len(peer.paths)
            samples = [d[0] for d in delays]
            if not st.last_tx or now <= st.last_t:
                st.last_tx, st.last_dev, st.last_samples, st.last_t = tx, dev, samples, now
                continue
            dt = now - st.last_t
            if now - st.window_start > MIN_RTT_WINDOW_S:
                st.min_prev, st.min_rtt, st.window_start = st.min_rtt, [math.inf] * n, now
            sent = [max(0, a - b) for a, b in zip(tx, st.last_tx)]
            busy = sum(sent) / dt >= IDLE_BPS
            # queueing delay per path, from fresh echoes only
            qp: list[float | None] = [None] * n
            for i, (n_samples, rtt_us, ewma_us, _held) in enumerate(delays):
                if n_samples != st.last_samples[i] and ewma_us:
                    st.min_rtt[i] = min(st.min_rtt[i], rtt_us or ewma_us)
                    qp[i] = max(0.0, ewma_us - min(st.min_rtt[i], st.min_prev[i]))
            for i in range(n):
                rate = sent[i] / dt
                st.ev_d[i] = rate if st.ev_d[i] is None else EWMA * rate + (1 - EWMA) * st.ev_d[i]
            echoes = [d[0] + d[3] for d in delays]
            ce, lossy = self._marks(peer, st, echoes, usable, dt) if busy else ([None] * n, [False] * n)
            split = busy and self.cfg.weights.per_ev and self._split(peer, st, qp, sent, usable, ce, lossy,
                                                                     dt, now)
            # per plane: the paths of a plane share its queue and its rate
            q: list[float | None] = []
            g_sent, g_usable, g_d = [], [], []
            for k, g in enumerate(st.groups):
                fresh = [qp[i] for i in g if qp[i] is not None]
                q.append(sum(fresh) / len(fresh) if fresh else None)
                g_sent.append(sum(sent[i] for i in g))
                g_usable.append(any(usable[i] for i in g))
                if dev[k] is not None and st.last_dev[k] is not None:
                    rate = max(0, dev[k] - st.last_dev[k]) / dt
                else:
                    rate = g_sent[k] / dt
                st.d[k] = rate if st.d[k] is None else EWMA * rate + (1 - EWMA) * st.d[k]
                g_d.append(st.d[k])
            st.last_tx, st.last_dev, st.last_samples, st.last_t = tx, dev, samples, now
            if not busy:
                continue
            # A queue of its own: delay beyond the least-delayed plane's. Delay
            # all planes share (a busy CPU, a common bottleneck) says nothing
            # about one plane, and reading it as saturation would lock a
            # plane at whatever share it has (measured: one starved to 2 %).
            fresh_q = [x for x in q if x is not None]
            low = min(fresh_q) if len(fresh_q) > 1 else 0.0
            q_own = [None if x is None else x - low for x in q]
            # The plane's own qdisc, where it has one, tells its local queue
            # exactly (backlog / delivered rate); the echoes only tell about
            # the bottlenecks beyond it.
            backlog = self._backlogs(now) if any(x is not None and x > Q_SAT_US for x in q_own) \
                or (self.backlog_cache and any(b for b, _ in self.backlog_cache[1].values())) else {}
            full = [False] * len(st.devices)
            for k, devname in enumerate(st.devices):
                idx = self._ifindex(devname)
                if idx in backlog and g_d[k] > 0:
                    local = backlog[idx] / g_d[k] * 1e6
                    q_own[k] = local if local > Q_SAT_US or q_own[k] is None else min(q_own[k], local)
                    full[k] = local > Q_SAT_US
            # a plane all of whose EVs were marked more often than another's
            # (one with an unmarked EV is the split's to fix, above: counting
            # its marked EVs against it starved a plane with a healthy EV).
            # CE only, not loss: a plane's EVs all lose while a fault retires
            # some of them, and a plane weighted down then stayed down after
            # the heal, since weights move only while some plane queues
            # (docs/benchmarks/cross.md, the failover column)
            q_own = with_marks(q_own, [_least([ce[i] for i in g]) for g in st.groups], Q_SAT_US)
            if not any(x is not None and x > Q_SAT_US for x in q_own):
                # No plane has a queue of its own: every one has room, there
                # is nothing to learn, and moving weight would only reorder.
                if split:
                    self._apply(peer, st)
                continue
            st.c = step_capacity(st.c, g_d, q_own, g_sent, g_usable, st.idle, [x / dt for x in g_sent], full,
                                 caps)
            w = shares(st.c, g_usable, self.cfg.weights.min_weight)
            if not any(w):
                continue
            st.w = [o + SMOOTH * (x - o) if u else 0.0 for o, x, u in zip(st.w, w, g_usable)]
            if self.trace:
                self.trace.write(json.dumps({
                    "t": round(now, 4), "peer": peer.name,
                    "q": [None if x is None else round(x) for x in q],
                    "d_mbit": [round(x * 8e-6, 1) for x in g_d],
                    "c_mbit": [None if x is None else round(x * 8e-6, 1) for x in st.c],
                    "w": [round(x, 4) for x in st.w]}) + "\n")
            self._apply(peer, st)
        return IDLE_STEP_S if len(asleep) == len(self.by_index) else None

    def _marks(self, peer: cfgmod.Peer, st: _PeerState, echoes: list[int], usable: list[bool],
               dt: float) -> tuple[list[float | None], list[bool]]:
        """Per path: the fraction of its echoes (`echoes`: the paths' fresh
        echo counts now, held ones included) since the last look that said CE (None without an echo),
        and whether its loss stands against its plane's siblings (loss_looks,
        lossy_evs; mrc_path_cong, bpf/congest.h). CE counts only where the
        operator left ECN avoidance on (weights.ecn_hold_us > 0), loss where
        weights.loss is on."""
        n = len(peer.paths)
        if not self.cfg.weights.ecn_hold_us and not self.cfg.weights.loss:
            return [None] * n, [False] * n
        cong = self.dp.map("mrc_path_cong")
        raw = memoryview(cong.read_raw(self.dp.path_idx(peer.index, 0), n)).cast("Q")
        step = cong.value_size // 8
        ce = list(raw[_CONG_CE // 8::step]) if self.cfg.weights.ecn_hold_us else [0] * n
        loss = list(raw[_CONG_LOSS // 8::step]) if self.cfg.weights.loss else [0] * n
        last, st.last_marks = st.last_marks, (ce, loss, echoes)
        if last is None or len(last[0]) != n:
            return [None] * n, [False] * n
        ce_f = [min(1.0, (a - b) / (e - f)) if e > f else None
                for a, b, e, f in zip(ce, last[0], echoes, last[2])]
        st.loss_looks = loss_looks([a > b for a, b in zip(loss, last[1])], st.loss_looks or [0.0] * n, dt)
        lossy = [False] * n
        for g in st.groups:
            for i, x in zip(g, lossy_evs([st.loss_looks[i] for i in g], [usable[i] for i in g])):
                lossy[i] = x
        return ce_f, lossy

    def _split(self, peer: cfgmod.Peer, st: _PeerState, qp: list[float | None], sent: list[int],
               usable: list[bool], marks: list[float | None], lossy: list[bool], dt: float,
               now: float) -> bool:
        """Each plane's split over its EVs, one step (split_evs); True when
        any moved. On a routed plane a leaf hashes each EV onto one uplink,
        and with few EVs the hash is lumpy (3 of 4 on one spine one time in
        2): an even split overloads that link while the other idles."""
        moved = False
        for g in st.groups:
            if len(g) < 2:
                continue
            idle = [st.ev_idle[i] for i in g]
            # an own queue counts when it stood at two looks in a row: a busy
            # CPU delays single echoes of random paths by milliseconds, a
            # congested link its EVs' echoes at every look (docs/fabric.md,
            # "Per-EV weights": chasing the former costs goodput)
            now_q = own_queues(qp, g)
            q_own = [None if a is None else (min(a, b) if b is not None else 0.0)
                     for a, b in zip(now_q, [st.ev_q[i] for i in g])]
            gain = 1.0 - math.exp(-dt / QBAR_TAU_S) if dt > 0 else 0.0
            for k, i in enumerate(g):
                st.ev_q[i] = now_q[k] if now_q[k] is not None else st.ev_q[i]
                if now_q[k] is not None:
                    st.ev_qbar[i] += gain * (min(now_q[k], QBAR_CLIP_US) - st.ev_qbar[i])
            standing = standing_queues([st.ev_qbar[i] for i in g], [usable[i] for i in g],
                                       [st.ev_w[i] for i in g], [st.ev_stood[i] for i in g]) \
                if sum(sent[i] for i in g) >= QBAR_BUSY_BPS * dt else [False] * len(g)
            for i, stood in zip(g, standing):
                st.ev_stood[i] = stood
            d = [st.ev_d[i] or 0.0 for i in g]
            q_sat = ev_q_sat(d, self.unit)
            q_own = with_marks(q_own, [marks[i] for i in g], q_sat)
            q_own = [max(q or 0.0, 2 * q_sat) if lossy[i] or stood else q
                     for q, i, stood in zip(q_own, g, standing)]
            out = split_evs([st.ev_w[i] for i in g], [st.ev_c[i] for i in g], d, q_own,
                            [sent[i] for i in g], [usable[i] for i in g], idle,
                            self.cfg.weights.min_weight, q_sat)
            for k, i in enumerate(g):
                st.ev_idle[i] = idle[k]
            if out is None:
                # quiet: back toward the configured split (relax_evs)
                out = relax_evs([st.ev_w[i] for i in g], [st.ev_home[i] for i in g],
                                [usable[i] for i in g], dt)
                if out is None:
                    continue
                out = out, [st.ev_c[i] for i in g]
            for k, i in enumerate(g):
                st.ev_w[i], st.ev_c[i] = out[0][k], out[1][k]
            moved = True
            if self.trace:
                self.trace.write(json.dumps({
                    "t": round(now, 4), "pid": os.getpid(), "peer": peer.name, "paths": g,
                    "q_own": [None if x is None else round(x) for x in q_own], "q_sat": round(q_sat),
                    "lossy": [i for i in g if lossy[i]],
                    "qbar": [round(st.ev_qbar[i]) for i in g],
                    "standing": [i for i, stood in zip(g, standing) if stood],
                    "d_mbit": [round((st.ev_d[i] or 0.0) * 8e-6, 1) for i in g],
                    "ev_w": [round(st.ev_w[i], 4) for i in g]}) + "\n")
        return moved

    @staticmethod
    def _quiet(st: _PeerState, sent_bps: float, now: float, every_s: float) -> bool:
        """True when this interval can be skipped: the peer's own tx PSN
        moved by less than IDLE_BPS worth of wire packets in the last
        interval (one read of mrc_peer_seq for all peers: the plane devices,
        which every peer shares, kept 63 idle peers stepping beside a busy
        one), for QUIET_AFTER intervals in a row, and its last full step is
        less than every_s ago (those keep the base RTTs current from the
        probes' echoes, if any came: Controller._echoed). The next full
        step measures over the whole span since the last one."""
        if sent_bps >= IDLE_BPS:
            st.quiet = 0
            return False
        st.quiet += 1
        if st.quiet <= QUIET_AFTER or now >= st.full_at:
            st.full_at = now + every_s
            return False
        return True

    def _follow_caps(self, st: _PeerState, caps: list[float | None]) -> bool:
        """Capacity estimates from the planes' known rates: planes whose first
        hops all have known rates start from those (2/1/0.5/0.5 Gbit/s
        shapers give weights 0.5/0.25/0.125/0.125 before the first byte;
        equal ones keep the weights as they are: an estimate of each plane
        at its rate leaves nothing to learn while every queue is local), and an
        estimate above its plane's rate (the operator lowered it) falls to it
        at once. True when the weights changed."""
        known = [k for k in caps if k is not None]
        if all(c is None for c in st.c):
            if len(known) < len(caps):
                return False       # unknown: the configured weights stand until measured
            st.c = list(caps)
            if len(set(known)) < 2:
                return False       # equal: so are the configured weights, as a rule
            st.w = shares(st.c, [True] * len(caps), self.cfg.weights.min_weight)
            return True
        low = [c if c is None or k is None else min(c, k) for c, k in zip(st.c, caps)]
        if low == st.c:
            return False
        st.c = low
        w = shares(st.c, [x > 0 for x in st.w], self.cfg.weights.min_weight)
        if any(w):
            st.w = w
        return True

    def _apply(self, peer: cfgmod.Peer, st: _PeerState) -> None:
        """Spread each plane's weight over its EVs by their shares (even
        until split_evs learns otherwise) and rewrite the slot table when
        the weights moved by WRITE_MIN since the last write."""
        # Each plane's total is quantized first, then split over its EVs: a
        # plane of 1/8 over 4 EVs is 7.5 slots per EV, and rounding EV by EV
        # gave one such plane 8+8+8+7 and its twin 8+7+7+7, 3 % over its
        # rate: a standing queue, hedged copies and deep reordering.
        # Retired EVs keep their weight: rebuild_slots leaves them out while
        # they are not GOOD (so the plane's share falls with them, as with
        # fixed weights, and rises again only as measured), and they rejoin
        # at once when they recover. Concentrating a plane's share on its
        # EVs still alive loaded a dying plane's last EVs, and the links
        # left beside a dead one on a fabric.
        planes = quantize(st.w, [x > 0 for x in st.w])
        ints = [0] * len(peer.paths)
        for g, wg in zip(st.groups, planes):
            sub = quantize([st.ev_w[i] for i in g], [True] * len(g), wg) if wg else [0] * len(g)
            for k, i in enumerate(g):
                ints[i] = max(1, sub[k]) if wg else 0
        if not st.written or sum(abs(a - b) for a, b in zip(ints, st.written)) >= WRITE_MIN:
            set_path_weights(self.dp, peer, {i: w for i, w in enumerate(ints) if w > 0})
            rebuild_slots(self.dp, self.cfg, [peer])
            st.written = ints
            st.updates += 1

    def gap_step(self, now: float) -> None:
        peers_m, delay_m = self.dp.map("mrc_peers"), self.dp.map("mrc_path_delay")
        raw = peers_m.read_raw(0, self.cfg.index_span)
        # only a peer spraying flowlets now (`mrcctl spray` may switch it at
        # run time) needs its gap: the spray modes of every peer are one
        # slice of one read, and with none on flowlets the step ends here
        # (thousands of peers unpacked ten times a second were 7 % of a core)
        vs = peers_m.value_size
        modes = raw[_PEER_AT["spray_mode"]::vs]       # the low byte of each: the modes fit one
        if wire.SprayMode.FLOWLET not in modes:
            return
        ents = [raw[i:i + vs] for i in range(0, len(raw), vs)]
        for peer in self.cfg.peers:
            if peer.flowlet_gap_us or peer.index >= len(ents):
                continue
            if modes[peer.index] != wire.SprayMode.FLOWLET:
                continue
            srtts = []
            usable = self._usable(peer, now)
            delays = delay_m.lookup_range(self.dp.path_idx(peer.index, 0), len(peer.paths))
            for raw, ok in zip(delays, usable):
                d = wire.PathDelay.unpack(raw)
                # fresh-echo RTTs only (a re-echoed old timestamp measures idleness)
                if d.samples and d.ewma_us and ok:
                    srtts.append(d.ewma_us)
            if len(srtts) < 2:
                continue
            gap = int(min(GAP_MAX_US, max(GAP_MIN_US, 1.5 * (max(srtts) - min(srtts)) + 100)))
            old = self.gaps.get(peer.index)
            if old is not None and abs(gap - old) <= 0.25 * old:
                continue
            ent = wire.Peer.unpack(ents[peer.index])
            if ent.flowlet_gap_us not in (0, old):
                # set by the operator (`mrcctl spray --gap-us N`), or by an
                # earlier agent: left alone until `--gap-us 0` hands it back
                continue
            ent.flowlet_gap_us = gap
            peers_m.update(wire.u32(peer.index), ent.pack())
            self.gaps[peer.index] = gap

    def peers_changed(self, cfg: cfgmod.Config, touched: set[int]) -> None:
        """What was learned of the peers removed or added goes; the others
        keep theirs."""
        self.cfg = cfg
        self.by_index = {p.index: p for p in cfg.peers}
        for i in touched:
            for rec in (self.peers, self.usable, self.gaps, self.asleep):
                rec.pop(i, None)
        if self.psns:
            self.psns = dpmaps.resized(self.psns, cfg.index_span, touched)


class _Tasks:
    """The controller's tasks, which follow the peers: the adaptive mode is
    the default only up to ADAPTIVE_DEFAULT_MAX_PEERS peers, and only peers
    without a configured flowlet gap need the gap step."""

    def __init__(self, agent: agentmod.Agent, ctl: Controller):
        self.agent, self.ctl = agent, ctl
        self.weights: agentmod.Task | None = None
        self.gap: agentmod.Task | None = None
        self.peers_changed(agent.cfg, set())
        agent.on_peers(self.peers_changed)

    def peers_changed(self, cfg: cfgmod.Config, touched: set[int]) -> None:
        self.ctl.peers_changed(cfg, touched)
        adaptive = cfgmod.weights_mode(cfg) == "adaptive"
        if adaptive and self.weights is None:
            self.weights = self.agent.add_task("weights", cfg.weights.interval_ms / 1000.0, self.ctl.step)
        elif not adaptive and self.weights is not None:
            # as a start with these peers would: the weights stay as last written
            self.agent.remove_task(self.weights)
            self.weights = None
            self.ctl.peers.clear()
            self.ctl.asleep.clear()
        if self.gap is None and any(not p.flowlet_gap_us for p in cfg.peers):
            self.gap = self.agent.add_task("flowlet-gap", GAP_PERIOD_S, self.ctl.gap_step)


@agentmod.subsystem
def _setup(agent: agentmod.Agent) -> None:
    _Tasks(agent, Controller(agent.cfg, agent.dp, os.environ.get("MRC_WEIGHTS_TRACE")))
