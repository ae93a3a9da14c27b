"""What the maps must hold for a config: `up` writes it, keeping what a
running instance already knows about paths that did not change."""

from __future__ import annotations

import ipaddress
import os
import time

from ..datapath import abi as wire
from ..datapath import libbpf
from ..datapath.maps import Datapath
from . import config as cfgmod
from .preflight import PlaneRuntime
from .slots import set_slots, set_slots_many


# State the datapath keeps per path and per peer, by map index. An index
# is only a slot: `up` may give a peer another one (the [[peer]] blocks
# reordered) or give its old one to another peer, and this state must
# follow the peer, never stay with the index (issue #13.3).
PATH_STATE = ("mrc_live", "mrc_admin", "mrc_path_delay", "mrc_path_stats", "mrc_path_cnt", "mrc_probe_nonce",
              "mrc_path_cong", "mrc_path_seq")
PEER_STATE = ("mrc_peer_seq", "mrc_tx_flows", "mrc_rx_flows", "mrc_rx_win", "mrc_dedup", "mrc_reorder", "mrc_rx_epoch")


def fill_maps(dp: Datapath, cfg: cfgmod.Config, planes: list[PlaneRuntime], overlay_ifindex: int,
              macs: dict) -> None:
    by_dev = {p.plane.device: p for p in planes}
    flags = (wire.MRC_CFG_LIVENESS if cfg.health.liveness else 0) | \
        (wire.MRC_CFG_HEDGE if cfg.health.hedge else 0) | \
        (wire.MRC_CFG_HEDGE_ALL if cfg.health.hedge == "always" else 0) | \
        (wire.MRC_CFG_FB_FRAMES if cfg.health.feedback_frames else 0) | \
        (wire.MRC_CFG_PAWS_GUARD if cfg.paws_guard else 0)
    old_cfg = dp.map("mrc_cfg").lookup(wire.u32(0))
    dp.map("mrc_cfg").update(wire.u32(0), wire.Config(
        udp_port=cfg.udp_port, overlay_ifindex=overlay_ifindex,
        dead_after_us=int(cfg.health.dead_after_ms * 1000), flags=flags,
        hedge_after_us=int(cfg.health.hedge_after * 1000),
        recover_probes=cfg.health.recover_probes,
        cong_hold_us=int(cfg.weights.ecn_hold_us),
        epoch=new_epoch(wire.Config.unpack(old_cfg).epoch if old_cfg else 0)).pack())

    paths_m, peers_m = dp.map("mrc_paths"), dp.map("mrc_peers")
    rx_peers = dp.map("mrc_rx_peers")
    sz = dp.sizing
    old_peers = [wire.Peer.unpack(raw) for raw in peers_m.lookup_range(0, sz.peers)]
    moves = _plan_moves(dp, cfg, by_dev, old_peers)
    _move_state(dp, moves)
    # Thousands of peers: every map is written in batches (one system call
    # each), not one update per entry (docs/benchmarks/scale.md).
    path_kv: dict[bytes, bytes] = {}
    rx_kv: dict[bytes, bytes] = {}
    peer_kv: dict[bytes, bytes] = {}
    for peer in cfg.peers:
        for path in peer.paths:
            rt = by_dev[path.plane.device]
            path_kv[sz.path_key(peer.index, path.id)] = wire.Path(
                ifindex=rt.ifindex, ev=path.ev, family=path.family, plane=path.plane.index,
                smac=rt.mac, dmac=macs.get((path.plane.device, str(path.remote))) or bytes(6),
                saddr=str(rt.local[path.family]), daddr=str(path.remote),
                weight=path.weight).pack()
        for dev, addr in peer.underlay.items():
            rt = by_dev[dev]
            key = wire.RxKey(ifindex=rt.ifindex, family=addr.version, addr=str(addr)).pack()
            rx_kv[key] = wire.RxPeer(peer=peer.index, plane=rt.plane.index).pack()
    # Paths first, then the idle slot tables, then the peer entries that
    # switch n_paths and the live table in one write each: spraying never
    # sees a slot naming a path that does not exist yet.
    paths_m.update_batch(list(path_kv), list(path_kv.values()))
    tables = set_slots_many(dp, [(peer, [p.weight for p in peer.paths]) for peer in cfg.peers], old_peers)
    for peer in cfg.peers:
        # flowlet_gap_us 0 = adaptive: the (re)started agent sets it
        peer_kv[wire.u32(peer.index)] = wire.Peer(
            n_paths=len(peer.paths), table=tables[peer.index],
            spray_mode=wire.SprayMode[peer.spray.upper()], min_active=peer.min_active,
            overlay=peer_identity(peer), ev_base=peer.ev_base, flowlet_gap_us=peer.flowlet_gap_us).pack()
    # Peers and sources no longer in the config stop being accepted.
    for key in rx_peers.keys():
        if key not in rx_kv:
            rx_peers.delete(key)
    rx_peers.update_batch(list(rx_kv), list(rx_kv.values()))
    # indices no peer holds now (membership leaves holes: assign_indices)
    used = {p.index for p in cfg.peers}
    for i in range(sz.peers):
        if i not in used and old_peers[i].n_paths:
            peer_kv[wire.u32(i)] = wire.Peer().pack()
    peers_m.update_batch(list(peer_kv), list(peer_kv.values()))
    # an LPM trie takes no batch updates
    _fill_lpm(dp.map("mrc_peer_ip"), peer_entries(cfg))
    _fill_lpm(dp.map("mrc_ovl_owner"), owner_entries(cfg))
    _fill_auth(dp, cfg)
    _fill_acl(dp, cfg, planes)


def write_peer(dp: Datapath, peer: cfgmod.Peer, by_dev: dict, macs: dict, epoch: int = 0) -> set[bytes]:
    """A peer's paths, receive keys, slot table and peer entry (not
    mrc_peer_ip, which makes the transmit side find it: the caller writes
    that last). Returns its mrc_rx_peers keys. epoch 0: the instance's
    (mrc_config.epoch)."""
    paths_m, peers_m, rx_peers = dp.map("mrc_paths"), dp.map("mrc_peers"), dp.map("mrc_rx_peers")
    for path in peer.paths:
        rt = by_dev[path.plane.device]
        paths_m.update(dp.sizing.path_key(peer.index, path.id), wire.Path(
            ifindex=rt.ifindex, ev=path.ev, family=path.family, plane=path.plane.index,
            smac=rt.mac, dmac=macs.get((path.plane.device, str(path.remote))) or bytes(6),
            saddr=str(rt.local[path.family]), daddr=str(path.remote),
            weight=path.weight).pack())
    keys = set()
    for dev, addr in peer.underlay.items():
        rt = by_dev[dev]
        key = wire.RxKey(ifindex=rt.ifindex, family=addr.version, addr=str(addr)).pack()
        rx_peers.update(key, wire.RxPeer(peer=peer.index, plane=rt.plane.index).pack())
        keys.add(key)
    # Paths first, then the idle slot table, then the peer entry that
    # switches n_paths and the live table in one write: spraying never
    # sees a slot naming a path that does not exist yet.
    table = set_slots(dp, peer, [p.weight for p in peer.paths], flip=False)
    # flowlet_gap_us 0 = adaptive: the (re)started agent sets it
    peers_m.update(wire.u32(peer.index), wire.Peer(
        n_paths=len(peer.paths), table=table, spray_mode=wire.SprayMode[peer.spray.upper()],
        min_active=peer.min_active, overlay=peer_identity(peer), ev_base=peer.ev_base,
        flowlet_gap_us=peer.flowlet_gap_us, epoch=epoch).pack())
    return keys


def fresh_peer_state(dp: Datapath, index: int, n_paths: int) -> None:
    """Everything the datapath keeps for peer index `index` and its first
    n_paths paths starts afresh: PSNs, cursors, reorder window, duplicate
    filter, epoch seen, flows; liveness, admin state (no DENIED), delays,
    counters, probe nonces, congestion marks, path MTU records. For an index that changes owner outside `up`'s
    moves (a peer added or removed live)."""
    moves = ({index: None}, {dp.sizing.path_idx(index, pid): None for pid in range(n_paths)})
    _move_state(dp, moves)
    # a path MTU an ICMP taught the index's previous owner is not this one's
    mtu_m = dp.map("mrc_path_mtu")
    for pid in range(n_paths):
        mtu_m.update(dp.sizing.path_key(index, pid), bytes(mtu_m.value_size))


def new_epoch(old: int) -> int:
    """The epoch this `up` sends (mrc_hdr.epoch): random, never 0 and never
    the one before, so that every peer sees a change (bpf/epoch.h)."""
    while True:
        e = int.from_bytes(os.urandom(2), "big")
        if e and e != old:
            return e


def _plan_moves(dp: Datapath, cfg: cfgmod.Config, by_dev: dict, old_peers: list) -> tuple[dict, dict]:
    """Where each index's state comes from: {new peer index: old peer index
    or None (a peer new here)}, {new path map index: old path map index or
    None}, for the indices whose owner is not the one they had. A peer is
    its overlay address (peer_identity); a path,
    its peer, plane device and EV."""
    paths_m = dp.map("mrc_paths")
    sz = dp.sizing
    old_peer: dict[str, int] = {}
    old_paths: dict[int, dict[tuple[int, int], int]] = {}
    for i, ent in enumerate(old_peers):
        if not ent.n_paths:
            continue
        old_peer.setdefault(ent.overlay, i)
        old_paths[i] = {}
        n = min(ent.n_paths, sz.stride)
        for pid, raw in enumerate(paths_m.lookup_range(sz.path_idx(i, 0), n)):
            p = wire.Path.unpack(raw)
            # the configured EV (ev_base + path id), not the one in use: the
            # EV map (agent/evmap.py) may have moved the path to another port
            old_paths[i][(p.ifindex, ent.ev_base + pid)] = pid
    peer_moves, path_moves = {}, {}
    for peer in cfg.peers:
        j = old_peer.get(peer_identity(peer))
        if j != peer.index:
            peer_moves[peer.index] = j
        for path in peer.paths:
            src = None
            if j is not None:
                pid = old_paths[j].get((by_dev[path.plane.device].ifindex, path.ev))
                src = None if pid is None else sz.path_idx(j, pid)
            dst = sz.path_idx(peer.index, path.id)
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
    plans = [(PEER_STATE, peer_moves), (PATH_STATE, path_moves)]
    staged = []
    for names, where in plans:
        for name in names:
            m = dp.map(name)
            fresh = _fresh(name, m)
            lazy = m.map_type == libbpf.BPF_MAP_TYPE_HASH   # made on first use (bpf/dedup.h)
            present = {wire.unpack_u32(k) for k in m.keys()} if lazy else set()
            keys, values, drop = [], [], []
            for dst, src in where.items():
                value = m.lookup(wire.u32(src)) if src is not None and (not lazy or src in present) else None
                if value is None and lazy:
                    if dst in present:
                        drop.append(wire.u32(dst))     # afresh = no entry
                    continue
                keys.append(wire.u32(dst))
                values.append(value if value is not None else fresh)
            staged.append((m, keys, values, drop))
    for m, keys, values, drop in staged:
        for k in drop:
            m.delete(k)
        m.update_batch(keys, values)
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


def peer_identity(peer: cfgmod.Peer) -> str:
    """What mrc_peer.overlay holds (a dotted IPv4 string): how the next `up`
    recognises a peer whose index changed. Its IPv4 overlay address; a peer
    with IPv6 overlay addresses only is known by the last 32 bits of its
    first one (a peer's overlay addresses are unique within the config)."""
    v4 = [a for a in peer.overlays if a.version == 4]
    if v4:
        return str(v4[0])
    return str(ipaddress.IPv4Address(peer.overlays[0].packed[-4:]))


def peer_entries(cfg: cfgmod.Config) -> dict[bytes, int]:
    """mrc_peer_ip's content: every prefix a peer owns -> the peer, where
    mrc_tx sends an inner destination (by longest prefix)."""
    return {wire.OvlKey.of(net).pack(): peer.index for peer in cfg.peers for net in peer.owned()}


def owner_entries(cfg: cfgmod.Config) -> dict[bytes, int]:
    """mrc_ovl_owner's content: what each peer owns (the inner sources
    mrc_rx accepts from it) and what is served here (the inner destinations
    a peer may send to): our overlay addresses and overlay.prefixes."""
    wanted = {wire.OvlKey.of(net).pack(): wire.MRC_OWNER_LOCAL for net in cfg.local_owned()}
    wanted.update(peer_entries(cfg))
    return wanted


def _fill_lpm(m, wanted: dict[bytes, int]) -> None:
    """Write an LPM map's entries, then delete the stale ones: a prefix
    moving from one peer to another is never unowned in between."""
    for key, value in wanted.items():
        m.update(key, wire.u32(value))
    for key in m.keys():
        if key not in wanted:
            m.delete(key)


def _fill_auth(dp: Datapath, cfg: cfgmod.Config) -> None:
    """mrc_auth: each peer's key (the cluster key or its own), or off. The
    loader is the only writer; the key goes nowhere else (no log, no
    state record)."""
    auth = dp.map("mrc_auth")
    keys: dict[str, bytes] = {}
    values = []
    by_index = {p.index: p for p in cfg.peers}
    for i in range(dp.sizing.peers):
        key = None
        name = cfg.key_file_of(by_index[i]) if i in by_index else None
        if name:
            if name not in keys:
                keys[name] = cfgmod.read_key("security.key_file", name)
            key = keys[name]
        values.append(wire.AuthKey.of(key).pack())
    auth.update_batch([wire.u32(i) for i in range(len(values))], values)


def peer_key(cfg: cfgmod.Config, peer: cfgmod.Peer | None) -> bytes | None:
    """The key authenticating traffic with a peer (None: off)."""
    if peer is None or not cfg.key_file_of(peer):
        return None
    return cfgmod.read_key("security.key_file", cfg.key_file_of(peer))


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
