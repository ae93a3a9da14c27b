"""What the operator changes on a running instance: path admin state
(`mrcctl path deny|allow`) and spray mode (`mrcctl spray`)."""

from __future__ import annotations

import time

from ..datapath import abi as wire
from ..datapath.maps import Datapath
from ..errors import MrcError
from . import config as cfgmod
from .events import EventLog, event_record, events_path
from .lock import InstanceLock
from .state import Instance


def parse_path_spec(cfg: cfgmod.Config, spec: str) -> tuple[cfgmod.Peer, list[cfgmod.Path]]:
    """PEER/ID (path id < 256), PEER/EV (an EV, >= 1024), PEER/PLANE (every
    path on that plane device), PEER/PLANE/EV, or PEER/all."""
    parts = spec.split("/")
    if len(parts) not in (2, 3) or not parts[0]:
        raise cfgmod.ConfigError(f"{spec!r}: expected PEER/ID, PEER/EV, PEER/PLANE, PEER/PLANE/EV or PEER/all")
    try:
        peer = cfg.peer(parts[0])
    except KeyError:
        names = ", ".join(p.name for p in cfg.peers)
        raise cfgmod.ConfigError(f"{spec!r}: no peer {parts[0]!r} (peers: {names})") from None
    sel = parts[1]
    if len(parts) == 3:
        if not parts[2].isdigit():
            raise cfgmod.ConfigError(f"{spec!r}: EV {parts[2]!r} is not a number")
        ev = int(parts[2])
        paths = [p for p in peer.paths if p.plane.device == sel and p.ev == ev]
    elif sel == "all":
        paths = list(peer.paths)
    elif sel.isdigit():
        n = int(sel)
        paths = [p for p in peer.paths if (p.id == n if n < wire.MRC_MAX_PATHS else p.ev == n)]
    else:
        paths = [p for p in peer.paths if p.plane.device == sel]
    if not paths:
        raise cfgmod.ConfigError(f"{spec!r}: matches no path of peer {peer.name} "
                                 f"(ids 0..{len(peer.paths) - 1}, EVs {peer.paths[0].ev}.."
                                 f"{peer.paths[-1].ev}, planes {', '.join(peer.underlay)})")
    return peer, paths


def set_admin(cfg: cfgmod.Config, spec: str, deny: bool) -> list[dict]:
    """Deny or allow paths by hand; returns the events logged (one per
    path whose admin state changed). Under the instance lock: `up`, the
    other writer of mrc_admin, moves entries between indices."""
    peer, paths = parse_path_spec(cfg, spec)
    inst = Instance(cfg.overlay_device)
    out = []
    with InstanceLock(inst), Datapath(inst) as dp:
        elog = EventLog(events_path(inst))
        for pid, old, new in write_admin(dp, peer, paths, deny):
            reason = (wire.EvReason.DENIED if deny else wire.EvReason.ALLOWED).label
            rec = event_record(cfg, peer.index, pid, old, new, reason, "operator")
            elog.append(rec)
            out.append(rec)
    # The slot tables follow within a second: the agent rebuilds them when
    # mrc_admin changes (their one writer); meanwhile the datapath already
    # skips a denied path (path_allowed()).
    return out


def write_admin(dp: Datapath, peer: cfgmod.Peer, paths: list[cfgmod.Path], deny: bool) -> list[tuple]:
    """Write the operator's admin state of paths into mrc_admin, its own
    map (no other writer's whole-entry rewrite can undo it); returns
    (path id, old state, new state) of each path that changed."""
    admin_m = dp.map("mrc_admin")
    want = wire.PathState.DENIED if deny else wire.PathState.GOOD
    out = []
    for path in paths:
        key = dp.path_key(peer.index, path.id)
        if wire.unpack_u32(admin_m.lookup(key)) == want:
            continue
        admin_m.update(key, wire.u32(want))
        _ent, lv = dp.path(peer.index, path.id)
        out.append((path.id, lv.state, want) if deny else (path.id, wire.PathState.DENIED, lv.state))
    return out


def set_spray(dp, peer: cfgmod.Peer, mode: str, gap_us: int | None = None) -> wire.Peer:
    """Switch a running peer's spray mode (and optionally the flowlet gap).

    The agent rewrites the same map value when it flips slot tables, so the
    write is verified and repeated if a flip raced it."""
    key = wire.u32(peer.index)
    for _ in range(5):
        raw = dp.map("mrc_peers").lookup(key)
        if not raw or not wire.Peer.unpack(raw).n_paths:
            raise MrcError(f"peer {peer.name}: not in the running datapath; run `mrcctl up`")
        ent = wire.Peer.unpack(raw)
        ent.spray_mode = wire.SprayMode[mode.upper()]
        if gap_us is not None:
            ent.flowlet_gap_us = gap_us
        dp.map("mrc_peers").update(key, ent.pack())
        time.sleep(0.03)
        now = wire.Peer.unpack(dp.map("mrc_peers").lookup(key))
        if now.spray_mode == ent.spray_mode and (gap_us is None or now.flowlet_gap_us == gap_us):
            return now
    return now
