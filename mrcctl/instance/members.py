"""Membership that changes live: peers added to and removed from a running
instance one at a time, touching nothing of the others.

A peer's map index is stable: the instance record keeps which peer (by
overlay address, what the datapath binds its traffic to) holds which
index, and every command binds a loaded config to it (`bind`), so `status`,
the agent and `up` agree on indices whatever order the [[peer]] tables and
files come in. Indices are allocated in one place, config.assign_indices.

Adding a peer writes only its own entries: fresh per-peer and per-path
state (fill.fresh_peer_state), its key, paths, receive keys, slot table and
peer entry with an epoch of its own (its PSNs start at 0 while the
instance's epoch stays, and the peer's receiver must restart its windows,
bpf/epoch.h), then mrc_ovl_owner and mrc_peer_ip (from here on mrc_tx sends
to it) and last the route to its overlay address. Removing one undoes that
in the opposite order and clears its state, and the index is retired: it
goes to a new peer only when no never-used index is left, and then starts
afresh like any other. The overlay device is NOARP (topology.create_overlay):
a peer needs a route, no neighbour entry.

The applier is the agent when one runs (it owns mrc_paths and the slot
tables while it runs, bpf/mrc.h; agent/members.py) and the CLI otherwise,
under the instance lock either way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from contextlib import suppress

from ..datapath import abi as wire
from ..datapath.maps import Datapath
from ..errors import InputError, MrcError, StepError
from . import config as cfgmod
from .fill import fresh_peer_state, new_epoch, peer_key, write_peer
from .lock import InstanceLock
from .state import Instance

# retired indices remembered (oldest first), for assign_indices
RETIRED_KEEP = 4096


def record_of(state: dict) -> dict:
    return state.get("members") or {"peers": {}, "retired": []}


def bind(cfg: cfgmod.Config, state: dict | None = None) -> cfgmod.Config:
    """`cfg` with the indices the running instance gave its peers (new
    peers: the next free ones)."""
    if state is None:
        state = Instance(cfg.overlay_device).read()
    rec = record_of(state)
    held = {ov: e["index"] for ov, e in rec["peers"].items()}
    return cfgmod.assign_indices(cfg, held, rec.get("retired", []))


def peer_digest(p: cfgmod.Peer) -> str:
    """What a peer's definition is, apart from where it is written and its
    index: a peer whose digest changes is removed and added again. Its own
    fields, not its paths: those follow from them and from the planes,
    which only `up` changes (and the repr of every path with its plane was
    0.5 ms a peer: seconds for every change at thousands of peers)."""
    own = []
    for f in _PEER_FIELDS:
        v = getattr(p, f)
        own.append(sorted(v.items()) if isinstance(v, dict) else v)
    return hashlib.sha256(repr(own).encode()).hexdigest()[:16]


_PEER_FIELDS = tuple(f.name for f in dataclasses.fields(cfgmod.Peer) if f.name not in ("index", "source", "paths"))


def note(state: dict, cfg: cfgmod.Config, epochs: dict[int, int] | None = None,
         digests: dict[str, str] | None = None) -> None:
    """Record `cfg`'s peers as the ones the instance runs with (after `up`
    or a live change); indices no longer held are retired. `digests`: the
    peers' (digests_of), where the caller has them."""
    digests = digests or digests_of(cfg)
    rec = record_of(state)
    old = {e["index"] for e in rec["peers"].values()}
    now = {p.index for p in cfg.peers}
    retired = [i for i in rec.get("retired", []) if i not in now] + sorted(old - now)
    prev_epochs = {e["index"]: e.get("epoch", 0) for e in rec["peers"].values()}
    epochs = epochs or {}
    state["members"] = {
        "peers": {str(p.overlay): {"index": p.index, "name": p.name, "source": p.source,
                                   "digest": digests[str(p.overlay)],
                                   "epoch": epochs.get(p.index, prev_epochs.get(p.index, 0))}
                  for p in cfg.peers},
        "retired": retired[-RETIRED_KEEP:],
        "generation": rec.get("generation", 0) + 1,
        "digest": cfg.digest,
        "error": None,
    }


def note_error(inst: Instance, msg: str) -> None:
    """A change that could not be applied (the agent saw a bad file):
    what `peer list` and the waiting `peer add` report."""
    state = inst.read()
    rec = record_of(state)
    rec.update(error=msg, generation=rec.get("generation", 0) + 1)
    state["members"] = rec
    inst.write(state)


@dataclasses.dataclass
class Change:
    added: list[cfgmod.Peer]
    removed: list[tuple[str, int, str]]     # overlay, index, name
    cfg: cfgmod.Config | None = None        # apply(): the config as bound to the record and applied

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)

    def describe(self) -> str:
        parts = [f"added {p.name} (index {p.index})" for p in self.added]
        parts += [f"removed {name} (index {i})" for _ov, i, name in self.removed]
        return ", ".join(parts) or "no change"


# digests_of's memo: id(a peer's underlay dict) -> (its own fields, digest).
# A peer that a load took over from the one before (config.LoadCache) or
# only gave another index shares its field objects with the one digested
# last time (digesting every peer was 30 ms a change at 4,096 peers).
_digested: dict[int, tuple[tuple, str]] = {}


def digests_of(cfg: cfgmod.Config) -> dict[str, str]:
    """Every peer's digest by overlay address, made once for diff and note."""
    global _digested
    out, memo = {}, {}
    for p in cfg.peers:
        own = tuple(getattr(p, f) for f in _PEER_FIELDS)
        hit = _digested.get(id(p.underlay))
        if hit is not None and all(a is b for a, b in zip(hit[0], own)):
            d = hit[1]
        else:
            d = peer_digest(p)
        # the fields are kept alive with the digest: their ids are not reused meanwhile
        memo[id(p.underlay)] = (own, d)
        out[str(p.overlay)] = d
    _digested = memo
    return out


def diff(state: dict, cfg: cfgmod.Config, digests: dict[str, str] | None = None) -> Change:
    """What differs between the peers the instance runs with and `cfg`'s
    (bound to the same record)."""
    digests = digests or digests_of(cfg)
    old = record_of(state)["peers"]
    new = {str(p.overlay): p for p in cfg.peers}
    removed, added = [], []
    for ov, e in old.items():
        p = new.get(ov)
        if p is None or e["index"] != p.index or e["digest"] != digests[ov]:
            removed.append((ov, e["index"], e["name"]))
    gone = {ov for ov, _i, _n in removed}
    for ov, p in new.items():
        if ov not in old or ov in gone:
            added.append(p)
    return Change(added, removed)


def apply(cfg: cfgmod.Config) -> tuple[Change, float]:
    """Apply the difference between the running peers and `cfg`'s; returns
    it and the seconds it took. Refuses (nothing changed) what only `up` can
    do: an instance not up, a changed overlay MTU."""
    inst = Instance(cfg.overlay_device)
    with InstanceLock(inst):
        t0 = time.monotonic()
        state = inst.read()
        if not state.get("prog_ids"):
            raise MrcError(f"{cfg.overlay_device}: not up (run `mrcctl up` first)")
        if "members" not in state:
            # brought up by an mrc that kept no record: which index is whose
            # is not known here, and guessing could reset a running peer
            raise MrcError(f"{cfg.overlay_device}: run `mrcctl up` once, so that the instance records "
                           "its peers' indices")
        cfg = bind(cfg, state)
        digests = digests_of(cfg)
        change = diff(state, cfg, digests)
        change.cfg = cfg
        if not change:
            if record_of(state).get("digest") != cfg.digest:
                note(state, cfg, digests=digests)
                inst.write(state)
            return change, time.monotonic() - t0
        # netlink only here: `bind` serves every command, `status` too
        from . import topology
        from .preflight import preflight
        with topology.Netlink() as nl:
            planes, mtu = preflight(cfg, nl)
            if state.get("mtu") and mtu < state["mtu"]:
                raise InputError(f"the new peers need overlay MTU {mtu} (now {state['mtu']}): "
                                 "run `mrcctl up` to apply them")
            for p in change.added:      # refused before anything changes
                if cfg.key_file_of(p):
                    try:
                        peer_key(cfg, p)
                    except cfgmod.ConfigError as e:
                        raise InputError(f"peer {p.name}: {e}") from None
            try:
                with Datapath(inst) as dp:
                    epochs = change_peers(dp, state, cfg, change, nl, planes)
            except PartlyApplied:
                inst.write(state)
                raise
        note(state, cfg, epochs, digests)
        took = time.monotonic() - t0
        state["members"].update(last_apply_ms=took * 1000, last_change=change.describe())
        # `up` with the same files has nothing left to do, unless the
        # config file itself changed (only `up` applies that)
        if state.get("file_digest") == cfg.file_digest:
            state["config_digest"] = cfg.digest
        inst.write(state)
        return change, took


class PartlyApplied(StepError):
    """A peer failed: it was taken out again, the ones before it stay
    (and `state` records them)."""


def change_peers(dp: Datapath, state: dict, cfg: cfgmod.Config, change: Change, nl, planes) -> dict[int, int]:
    """Remove, then add, the peers of `change` in the running maps; returns
    the epochs given to the added ones. A peer that fails is removed again
    (nothing of it stays half written) and PartlyApplied raised, with
    `state` updated to what the instance now runs."""
    sz = dp.sizing
    for p in change.added:
        if p.index >= sz.peers or len(p.paths) > sz.stride:
            # growing the maps is up's (it carries every peer's state into
            # the new ones, objects.carry_resized); nothing is applied
            raise StepError(f"adding peer {p.name}",
                            f"the maps have room for {sz.peers} peers of {sz.stride} paths "
                            f"(index {p.index}, {len(p.paths)} paths): run `mrcctl up`, or raise [limits]")
    by_dev = {rt.plane.device: rt for rt in planes}
    routes = set(state.get("routes", []))
    old_epochs = {e["index"]: e.get("epoch", 0) for e in record_of(state)["peers"].values()}
    epochs: dict[int, int] = {}
    cfg_epoch = wire.Config.unpack(dp.map("mrc_cfg").lookup(wire.u32(0))).epoch
    for ov, index, _name in change.removed:
        routes -= set(remove_peer(dp, nl, cfg.overlay_device, ov, index))
    for n, p in enumerate(change.added):
        epoch = new_epoch(cfg_epoch)
        while epoch == old_epochs.get(p.index):
            epoch = new_epoch(cfg_epoch)
        try:
            add_peer(dp, nl, cfg, p, by_dev, epoch)
        except Exception as e:
            with suppress(Exception):
                remove_peer(dp, nl, cfg.overlay_device, str(p.overlay), p.index)
            not_added = change.added[n:]
            note(state, dataclasses.replace(cfg, peers=tuple(q for q in cfg.peers if q not in not_added)),
                 epochs)
            state["routes"] = sorted(routes)
            cause = str(e) if isinstance(e, MrcError) else (getattr(e, "strerror", None) or repr(e))
            raise PartlyApplied(f"adding peer {p.name}", cause) from None
        epochs[p.index] = epoch
        routes |= {str(net) for net in p.owned()}
    state["routes"] = sorted(routes)
    return epochs


def add_peer(dp: Datapath, nl, cfg: cfgmod.Config, p: cfgmod.Peer, by_dev: dict, epoch: int) -> None:
    """One peer into the running maps, in the order that never lets the
    datapath see half of it (module docstring)."""
    # paths past n_paths are never read (validate.h, path ids < n_paths)
    fresh_peer_state(dp, p.index, len(p.paths))
    dp.map("mrc_auth").update(wire.u32(p.index), wire.AuthKey.of(peer_key(cfg, p)).pack())
    # Neighbours are looked up, not waited for: until the agent's
    # neighbours task finds them, mrc_tx hands frames to
    # bpf_redirect_neigh, which resolves them.
    macs = {}
    for path in p.paths:
        key = (path.plane.device, str(path.remote))
        if key not in macs:         # per plane, not per EV; one entry, not a dump of thousands
            macs[key] = nl.neighbour(path.plane.device, nl.next_hop(*key))
    write_peer(dp, p, by_dev, macs, epoch=epoch)
    # what it owns (its overlay addresses and prefixes, both families):
    # first whom mrc_rx believes, then where mrc_tx sends, then the routes
    for net in p.owned():
        dp.map("mrc_ovl_owner").update(wire.OvlKey.of(net).pack(), wire.u32(p.index))
    for net in p.owned():
        dp.map("mrc_peer_ip").update(wire.OvlKey.of(net).pack(), wire.u32(p.index))
    failed = nl.routes_replace([str(net) for net in p.owned()], cfg.overlay_device, cfg.rto_min_ms)
    if failed:
        raise MrcError(f"route {failed[0][0]}: {os.strerror(failed[0][1])}")


def remove_peer(dp: Datapath, nl, overlay_device: str, overlay: str, index: int) -> list[str]:
    """One peer out of the running maps: first what finds it (routes,
    overlay lookups, receive keys), then its entry, then its state, so that
    the index carries nothing to whoever gets it next. What it owned is read
    from the maps (every LPM entry naming its index: overlay addresses and
    prefixes of both families). Returns the routes it had."""
    peer_ip, owners = dp.map("mrc_peer_ip"), dp.map("mrc_ovl_owner")
    me = wire.u32(index)
    mine = [k for k, v in peer_ip.items() if v == me]
    routes = [str(wire.OvlKey.unpack(k).network) for k in mine]
    for r in routes:
        nl.route_delete(r, overlay_device)
    for k in mine:
        peer_ip.delete(k)
    for k, v in owners.items():
        if v == me:
            owners.delete(k)
    rx = dp.map("mrc_rx_peers")
    for key, raw in rx.items():
        if wire.RxPeer.unpack(raw).peer == index:
            rx.delete(key)
    peers_m = dp.map("mrc_peers")
    raw = peers_m.lookup(wire.u32(index))
    n_paths = wire.Peer.unpack(raw).n_paths if raw else 0
    peers_m.update(wire.u32(index), wire.Peer().pack())
    paths_m = dp.map("mrc_paths")
    for pid in range(min(n_paths, wire.MRC_MAX_PATHS)):
        paths_m.update(dp.sizing.path_key(index, pid), bytes(paths_m.value_size))
    dp.map("mrc_auth").update(wire.u32(index), wire.AuthKey.of(None).pack())
    fresh_peer_state(dp, index, max(n_paths, 1))
    return routes
