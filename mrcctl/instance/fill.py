"""What the maps must hold for a config: `up` writes it, keeping what a
running instance already knows about paths that did not change."""

from __future__ import annotations

import os
import time

from ..datapath import abi as wire
from ..datapath.maps import Datapath
from . import config as cfgmod
from .preflight import PlaneRuntime
from .slots import set_slots


# State the datapath keeps per path and per peer, by map index. An index
# is only a slot: `up` may give a peer another one (the [[peer]] blocks
# reordered) or give its old one to another peer, and this state must
# follow the peer, never stay with the index (issue #13.3).
PATH_STATE = ("mrc_live", "mrc_admin", "mrc_path_delay", "mrc_path_stats", "mrc_probe_nonce")
PEER_STATE = ("mrc_peer_seq", "mrc_tx_flows", "mrc_rx_win", "mrc_dedup", "mrc_reorder", "mrc_rx_epoch")


def fill_maps(dp: Datapath, cfg: cfgmod.Config, planes: list[PlaneRuntime], overlay_ifindex: int,
              macs: dict) -> None:
    by_dev = {p.plane.device: p for p in planes}
    flags = (wire.MRC_CFG_LIVENESS if cfg.health.liveness else 0) | \
        (wire.MRC_CFG_HEDGE if cfg.health.hedge else 0) | \
        (wire.MRC_CFG_HEDGE_ALL if cfg.health.hedge == "always" else 0)
    old_cfg = dp.map("mrc_cfg").lookup(wire.u32(0))
    dp.map("mrc_cfg").update(wire.u32(0), wire.Config(
        udp_port=cfg.udp_port, overlay_ifindex=overlay_ifindex,
        dead_after_us=int(cfg.health.dead_after_ms * 1000), flags=flags,
        hedge_after_us=int(cfg.health.hedge_after * 1000),
        recover_probes=cfg.health.recover_probes,
        epoch=new_epoch(wire.Config.unpack(old_cfg).epoch if old_cfg else 0)).pack())

    paths_m, peers_m = dp.map("mrc_paths"), dp.map("mrc_peers")
    peer_ip, rx_peers = dp.map("mrc_peer_ip"), dp.map("mrc_rx_peers")
    moves = _plan_moves(dp, cfg, by_dev)
    _move_state(dp, moves)
    wanted_rx = set()
    wanted_ip = set()
    for peer in cfg.peers:
        for path in peer.paths:
            rt = by_dev[path.plane.device]
            paths_m.update(wire.path_key(peer.index, path.id), wire.Path(
                ifindex=rt.ifindex, ev=path.ev, family=path.family, plane=path.plane.index,
                smac=rt.mac, dmac=macs.get((path.plane.device, str(path.remote))) or bytes(6),
                saddr=str(rt.local[path.family]), daddr=str(path.remote),
                weight=path.weight).pack())
        for dev, addr in peer.underlay.items():
            rt = by_dev[dev]
            key = wire.RxKey(ifindex=rt.ifindex, family=addr.version, addr=str(addr)).pack()
            rx_peers.update(key, wire.RxPeer(peer=peer.index, plane=rt.plane.index).pack())
            wanted_rx.add(key)
        # Paths first, then the idle slot table, then the peer entry that
        # switches n_paths and the live table in one write: spraying never
        # sees a slot naming a path that does not exist yet.
        table = set_slots(dp, peer, [p.weight for p in peer.paths], flip=False)
        # flowlet_gap_us 0 = adaptive: the (re)started agent sets it
        gap = peer.flowlet_gap_us
        peers_m.update(wire.u32(peer.index), wire.Peer(
            n_paths=len(peer.paths), table=table, spray_mode=wire.SprayMode[peer.spray.upper()],
            min_active=peer.min_active, overlay=str(peer.overlay), ev_base=peer.ev_base,
            flowlet_gap_us=gap).pack())
        ip_key = peer.overlay.packed
        peer_ip.update(ip_key, wire.u32(peer.index))
        wanted_ip.add(ip_key)
    _fill_owners(dp, cfg)
    _fill_auth(dp, cfg)
    _fill_acl(dp, cfg, planes)
    # Peers and sources no longer in the config stop being accepted.
    for key in rx_peers.keys():
        if key not in wanted_rx:
            rx_peers.delete(key)
    for key in peer_ip.keys():
        if key not in wanted_ip:
            peer_ip.delete(key)
    for i in range(len(cfg.peers), wire.MRC_MAX_PEERS):
        old = peers_m.lookup(wire.u32(i))
        if old and wire.Peer.unpack(old).n_paths:
            peers_m.update(wire.u32(i), wire.Peer().pack())


def new_epoch(old: int) -> int:
    """The epoch this `up` sends (mrc_hdr.epoch): random, never 0 and never
    the one before, so that every peer sees a change (bpf/epoch.h)."""
    while True:
        e = int.from_bytes(os.urandom(2), "big")
        if e and e != old:
            return e


def _plan_moves(dp: Datapath, cfg: cfgmod.Config, by_dev: dict) -> tuple[dict, dict]:
    """Where each index's state comes from: {new peer index: old peer index
    or None (a peer new here)}, {new path map index: old path map index or
    None}, for the indices whose owner is not the one they had. A peer is
    its overlay address (what the datapath binds its traffic to); a path,
    its peer, plane device and EV."""
    peers_m, paths_m, admin_m = dp.map("mrc_peers"), dp.map("mrc_paths"), dp.map("mrc_admin")
    old_peer: dict[str, int] = {}
    old_paths: dict[int, dict[tuple[int, int], int]] = {}
    for i in range(wire.MRC_MAX_PEERS):
        raw = peers_m.lookup(wire.u32(i))
        ent = wire.Peer.unpack(raw) if raw else None
        if not ent or not ent.n_paths:
            continue
        old_peer.setdefault(ent.overlay, i)
        old_paths[i] = {}
        for pid in range(min(ent.n_paths, wire.MRC_MAX_PATHS)):
            key = wire.path_key(i, pid)
            p = wire.Path.unpack(paths_m.lookup(key))
            old_paths[i][(p.ifindex, p.ev)] = pid
            if p.rsvd == wire.PathState.DENIED:
                # maps of a datapath that kept the denial in mrc_path
                # (now rsvd): it moves to mrc_admin once, then as any other
                admin_m.update(key, wire.u32(wire.PathState.DENIED))
    peer_moves, path_moves = {}, {}
    for peer in cfg.peers:
        j = old_peer.get(str(peer.overlay))
        if j != peer.index:
            peer_moves[peer.index] = j
        for path in peer.paths:
            src = None
            if j is not None:
                pid = old_paths[j].get((by_dev[path.plane.device].ifindex, path.ev))
                src = None if pid is None else wire.path_idx(j, pid)
            dst = wire.path_idx(peer.index, path.id)
            if src != dst:
                path_moves[dst] = src
    return peer_moves, path_moves


def _move_state(dp: Datapath, moves: tuple[dict, dict]) -> None:
    """Carry state to the indices its peers and paths have now; start
    afresh where no owner continues. Everything is read before anything is
    written: two peers may swap indices. The loader writes datapath-owned
    maps here, once per `up` and only for indices that change hands (the
    programs may write the same entries meanwhile; that traffic belongs to
    the index's old owner, whose state is being moved or reset anyway)."""
    peer_moves, path_moves = moves
    plans = [(PEER_STATE, peer_moves, wire.u32), (PATH_STATE, path_moves, wire.u32)]
    staged = []
    for names, where, key in plans:
        for name in names:
            m = dp.map(name)
            for dst, src in where.items():
                value = m.lookup(key(src)) if src is not None else None
                staged.append((m, key(dst), value if value is not None else _fresh(name, m)))
    for m, k, value in staged:
        m.update(k, value)
    if peer_moves:
        flowlets = dp.map("mrc_flowlets")
        for k in flowlets.keys():
            if wire.FlowletKey.unpack(k).peer in peer_moves:
                flowlets.delete(k)


def _fresh(name: str, m) -> bytes:
    """A new path is known to work until the datapath learns otherwise;
    everything else starts at zero."""
    if name == "mrc_live":
        return wire.PathLive(last_ack_ns=time.monotonic_ns()).pack()
    return bytes(m.value_size)


def _fill_owners(dp: Datapath, cfg: cfgmod.Config) -> None:
    """mrc_ovl_owner: which overlay prefixes each peer owns (the inner
    sources it may send) and which are served here (the inner destinations
    it may send to). Today /32s: every peer's overlay address and ours;
    routed prefixes (issue #14) are more entries of the same map."""
    owners = dp.map("mrc_ovl_owner")
    wanted = {wire.OvlKey.of(cfg.overlay_address.ip).pack(): wire.MRC_OWNER_LOCAL}
    for peer in cfg.peers:
        wanted[wire.OvlKey.of(peer.overlay).pack()] = peer.index
    for key, owner in wanted.items():
        owners.update(key, wire.u32(owner))
    for key in owners.keys():
        if key not in wanted:
            owners.delete(key)


def _fill_auth(dp: Datapath, cfg: cfgmod.Config) -> None:
    """mrc_auth: each peer's key (the cluster key or its own), or off. The
    loader is the only writer; the key goes nowhere else (no log, no
    state record)."""
    auth = dp.map("mrc_auth")
    for i in range(wire.MRC_MAX_PEERS):
        key = None
        if i < len(cfg.peers) and cfg.key_file_of(cfg.peers[i]):
            key = cfgmod.read_key("security.key_file", cfg.key_file_of(cfg.peers[i]))
        auth.update(wire.u32(i), wire.AuthKey.of(key).pack())


def _fill_acl(dp: Datapath, cfg: cfgmod.Config, planes: list[PlaneRuntime]) -> None:
    """mrc_acl: each plane's allow_underlay; no entry where there is none."""
    acl = dp.map("mrc_acl")
    wanted = {}
    for rt in planes:
        if rt.plane.allow_underlay is not None:
            wanted[wire.u32(rt.ifindex)] = wire.Acl.of([e.rule() for e in rt.plane.allow_underlay]).pack()
    for key, val in wanted.items():
        acl.update(key, val)
    for key in acl.keys():
        if key not in wanted:
            acl.delete(key)
