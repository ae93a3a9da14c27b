"""Slot tables: how path weights and states become what the datapath sprays.

The datapath picks a unit's path from the peer's live slot table; the
control plane writes the idle one and flips (bpf/mrc.h, mrc_slots).
"""

from __future__ import annotations

import functools
import types
from typing import Sequence

from ..datapath import abi as wire
from ..datapath.maps import Datapath
from . import config as cfgmod


def build_slot_table(weights: Sequence[int], n: int = wire.MRC_SLOTS) -> list[int]:
    """Spray slot table of n entries for paths 0..len(weights)-1, each path
    getting a share of slots proportional to its weight (weight 0: none).

    Smooth weighted round robin (as nginx upstreams): consecutive slots
    interleave paths (3:1:1:1 gives 0,1,0,2,3,0, ...) instead of runs, so a
    burst of packets spreads over all paths. Over any window of sum(weights) slots each path
    gets exactly its weight; over n slots, within one slot of n*w/sum(w)."""
    if not 1 <= n <= wire.MRC_SLOTS:
        raise ValueError(f"slot table size {n} not in 1..{wire.MRC_SLOTS}")
    if len(weights) > wire.MRC_MAX_PATHS:
        raise ValueError(f"{len(weights)} paths > MRC_MAX_PATHS")
    if any(w < 0 for w in weights):
        raise ValueError("negative weight")
    total = sum(weights)
    if total == 0:
        raise ValueError("no path with a positive weight")
    if n > total:
        # after sum(weights) slots every counter is back at 0: the table
        # repeats, so one round is computed (the agent rewrites tables live)
        one = build_slot_table(weights, total)
        return (one * (n // total + 1))[:n]
    current = [0] * len(weights)
    table = []
    for _ in range(n):
        best = -1
        for i, w in enumerate(weights):
            if w <= 0:
                continue
            current[i] += w
            if best < 0 or current[i] > current[best]:
                best = i
        current[best] -= total
        table.append(best)
    return table


def slot_table(peer: cfgmod.Peer, weights: list[int], n: int) -> list[int]:
    """n slots over the peer's paths by weight, consecutive slots on
    different planes wherever the weights allow.

    Smooth weighted round robin runs twice: over the planes (a plane's
    weight is the sum of its paths'), which spreads each plane's slots as
    evenly as its share allows (2/1/0.5/0.5 Gbit/s gives planes
    0,1,0,2,3,0,1,0), then within each plane over its paths (EVs). Back-to-back
    units then drain in parallel on different planes instead of queueing
    behind each other on one, which roughly halves the reordering TCP sees
    (docs/benchmarks/aggregation.md). One round robin over all paths at once
    would send a plane's EVs back to back when planes differ in weight.
    """
    planes: dict[int, list[int]] = {}
    for i in sorted(range(len(weights)), key=lambda i: (peer.paths[i].plane.index, peer.paths[i].ev_index)):
        if weights[i] > 0:
            planes.setdefault(peer.paths[i].plane.index, []).append(i)
    if not planes:
        raise ValueError("no path with a positive weight")
    order = list(planes)
    pw = [sum(weights[i] for i in planes[p]) for p in order]
    # one round of a plane's EVs (at most a table's worth: weights go up to 1000 per path)
    inner = {p: build_slot_table([weights[i] for i in planes[p]], min(w, wire.MRC_SLOTS))
             for p, w in zip(order, pw)}
    sent = dict.fromkeys(order, 0)
    table = []
    for k in build_slot_table(pw, n):
        p = order[k]
        table.append(planes[p][inner[p][sent[p] % len(inner[p])]])
        sent[p] += 1
    return table


def _table_for(peer: cfgmod.Peer, weights: list[int]) -> list[int]:
    if sum(weights) == 0:
        weights = [1] * len(weights)
    total = sum(weights)
    # A whole number of weight rounds makes every path's share exact.
    n = (wire.MRC_SLOTS // total) * total if total <= wire.MRC_SLOTS else wire.MRC_SLOTS
    shape = tuple((p.plane.index, p.ev_index) for p in peer.paths)
    return list(_shaped_table(shape, tuple(weights), n))


@functools.lru_cache(maxsize=64)
def _shaped_table(shape: tuple, weights: tuple, n: int) -> tuple:
    """slot_table() depends on the paths' planes and EV order and their
    weights only: thousands of peers of one shape share one computation.
    Few entries: a table is up to 8 KB, and the adaptive weights (per EV
    above all) rarely write the same weights twice; 4,096 of them grew the
    agent by 9 MB in a 30 s soak."""
    ns = types.SimpleNamespace
    peer = ns(paths=[ns(plane=ns(index=pl), ev_index=ev) for pl, ev in shape])
    return tuple(slot_table(peer, list(weights), n))


def set_slots_many(dp: Datapath, wanted: list[tuple[cfgmod.Peer, list[int]]], current: list[wire.Peer]) -> dict:
    """set_slots(flip=False) for many peers in one batch write (what `up`
    does for thousands): {peer index: the table written}. `current`: the
    peers' mrc_peers entries by index. Peers of one shape (planes, EVs,
    weights) share one table, computed once."""
    cache: dict[tuple, bytes] = {}
    keys, values, out = [], [], {}
    for peer, weights in wanted:
        cur = current[peer.index]
        idle = 1 - (cur.table & 1) if cur.n_paths else 0
        shape = (tuple((p.plane.index, p.ev_index) for p in peer.paths), tuple(weights))
        if shape not in cache:
            cache[shape] = wire.Slots.of(_table_for(peer, weights)).pack()
        keys.append(wire.u32(wire.slots_idx(peer.index, idle)))
        values.append(cache[shape])
        out[peer.index] = idle
    dp.map("mrc_slots").update_batch(keys, values)
    return out


def set_slots(dp: Datapath, peer: cfgmod.Peer, weights: list[int], flip: bool = True,
              unless_same: bool = False) -> int:
    """Write the idle slot table, then flip the peer to it (atomic for the
    datapath); returns the table written. flip=False leaves the flip to the
    caller (fill_maps flips together with a change of n_paths).
    unless_same: nothing is written when the live table is that one
    already (returns the live table)."""
    peers_m, slots_m = dp.map("mrc_peers"), dp.map("mrc_slots")
    raw = peers_m.lookup(wire.u32(peer.index))
    cur = wire.Peer.unpack(raw) if raw else wire.Peer()
    idle = 1 - (cur.table & 1) if cur.n_paths else 0
    packed = wire.Slots.of(_table_for(peer, weights)).pack()
    if unless_same and cur.n_paths and \
            slots_m.lookup(wire.u32(wire.slots_idx(peer.index, cur.table))) == packed:
        return cur.table & 1
    slots_m.update(wire.u32(wire.slots_idx(peer.index, idle)), packed)
    if cur.n_paths and flip:
        cur.table = idle
        peers_m.update(wire.u32(peer.index), cur.pack())
    return idle


def rebuild_slots(dp: Datapath, cfg: cfgmod.Config, peers=None) -> None:
    """Spray only over GOOD, not denied paths, by each path's current weight.

    The one place that turns path states and weights into slot tables: the
    health subsystem (state changes), the operator (deny/allow) and adaptive
    weights (which first store their weights in mrc_paths) all call it, so
    whichever runs last writes the same policy from the same maps. With no
    path left, every not-denied path stays in: the datapath's min_active
    fallback then decides, rather than the control plane blacking out.
    """
    peers = list(cfg.peers if peers is None else peers)
    if not peers:
        return
    # the fields it needs of every path concerned, from one batch read per
    # map, not a struct unpacked per path (every peer's table is rebuilt at
    # the agent's start: 4 s for 4,096 peers x 32 paths that way); a peer
    # whose table comes out as the live one is not written
    first = min(dp.path_idx(p.index, 0) for p in peers)
    end = max(dp.path_idx(p.index, 0) + len(p.paths) for p in peers)
    maps = [dp.map(n) for n in ("mrc_paths", "mrc_admin", "mrc_live")]
    (ents, admins, lives), (pv, av, lv) = ([m.read_raw(first, end - first) for m in maps],
                                           [m.value_size for m in maps])
    # each field of every path as one strided view (the entries are arrays
    # of 4-byte-aligned structs: a value size and offsets that are multiples of 4)
    ent32 = memoryview(ents).cast("I")
    w_all = ent32[_PATH_AT["weight"] // 4::pv // 4]
    if_all = ent32[_PATH_AT["ifindex"] // 4::pv // 4]
    fam_all = ents[_PATH_AT["family"]::pv]
    adm_all = memoryview(admins).cast("I")[::av // 4]
    st_all = memoryview(lives).cast("I")[_LIVE_AT["state"] // 4::lv // 4]
    denied = wire.PathState.DENIED
    for peer in peers:
        base = dp.path_idx(peer.index, 0) - first
        span = range(base, base + len(peer.paths))
        fallback = [0 if adm_all[k] == denied else w_all[k] for k in span]
        weights = [w_all[k] if wire.usable_fields(if_all[k], fam_all[k], adm_all[k], st_all[k]) else 0
                   for k in span]
        if sum(weights) == 0:
            weights = fallback
        if sum(weights) == 0:
            weights = [1] * len(peer.paths)
        set_slots(dp, peer, weights, unless_same=True)


_PATH_AT = wire.Path.offsets()
_LIVE_AT = wire.PathLive.offsets()


def set_path_weights(dp: Datapath, peer: cfgmod.Peer, weights: dict[int, int]) -> None:
    """Store path id -> current weight in mrc_paths (see rebuild_slots)."""
    paths_m = dp.map("mrc_paths")
    for pid, w in weights.items():
        key = dp.path_key(peer.index, pid)
        ent = wire.Path.unpack(paths_m.lookup(key))
        if ent.weight != w:
            ent.weight = w
            paths_m.update(key, ent.pack())


def slot_weights(dp, peer: cfgmod.Peer) -> list[int]:
    """Slots per path in the peer's live slot table (what the datapath uses)."""
    raw = dp.map("mrc_peers").lookup(wire.u32(peer.index))
    table = wire.Peer.unpack(raw).table if raw else 0
    slots = wire.Slots.unpack(dp.map("mrc_slots").lookup(wire.u32(wire.slots_idx(peer.index, table))))
    counts = [0] * len(peer.paths)
    for s in slots.slot[:slots.n]:
        if s < len(counts):
            counts[s] += 1
    return counts
