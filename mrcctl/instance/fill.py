"""What the maps must hold for a config: `up` writes it, keeping what a
running instance already knows about paths that did not change."""

from __future__ import annotations

import time

from ..datapath import abi as wire
from ..datapath.maps import Datapath
from . import config as cfgmod
from .preflight import PlaneRuntime
from .slots import set_slots


def fill_maps(dp: Datapath, cfg: cfgmod.Config, planes: list[PlaneRuntime], overlay_ifindex: int,
              macs: dict) -> None:
    by_dev = {p.plane.device: p for p in planes}
    flags = (wire.MRC_CFG_LIVENESS if cfg.health.liveness else 0) | \
        (wire.MRC_CFG_HEDGE if cfg.health.hedge else 0) | \
        (wire.MRC_CFG_HEDGE_ALL if cfg.health.hedge == "always" else 0)
    dp.map("mrc_cfg").update(wire.u32(0), wire.Config(
        udp_port=cfg.udp_port, overlay_ifindex=overlay_ifindex,
        dead_after_us=int(cfg.health.dead_after_ms * 1000), flags=flags,
        hedge_after_us=int(cfg.health.hedge_after * 1000),
        recover_probes=cfg.health.recover_probes).pack())

    paths_m, peers_m = dp.map("mrc_paths"), dp.map("mrc_peers")
    live_m, peer_ip, rx_peers = dp.map("mrc_live"), dp.map("mrc_peer_ip"), dp.map("mrc_rx_peers")
    wanted_rx = set()
    wanted_ip = set()
    for peer in cfg.peers:
        for path in peer.paths:
            rt = by_dev[path.plane.device]
            idx = wire.path_idx(peer.index, path.id)
            old = paths_m.lookup(wire.u32(idx))
            old = wire.Path.unpack(old) if old else None
            # An upgrade that changes EVs or planes renumbers paths: an id
            # that now names another (plane, EV) starts afresh, it must not
            # inherit the old path's denial or liveness.
            same = old is not None and (old.ifindex, old.ev) == (rt.ifindex, path.ev)
            admin = old.admin if same else wire.PathState.GOOD
            paths_m.update(wire.u32(idx), wire.Path(
                ifindex=rt.ifindex, ev=path.ev, family=path.family, plane=path.plane.index,
                smac=rt.mac, dmac=macs.get((path.plane.device, str(path.remote))) or bytes(6),
                saddr=str(rt.local[path.family]), daddr=str(path.remote),
                weight=path.weight, admin=admin).pack())
            if not same or not _path_known(dp, idx):
                live_m.update(wire.u32(idx), wire.PathLive(last_ack_ns=time.monotonic_ns()).pack())
        for dev, addr in peer.underlay.items():
            rt = by_dev[dev]
            key = wire.RxKey(ifindex=rt.ifindex, family=addr.version, addr=str(addr)).pack()
            rx_peers.update(key, wire.RxPeer(peer=peer.index, plane=rt.plane.index).pack())
            wanted_rx.add(key)
        # Paths first, then the idle slot table, then the peer entry that
        # switches n_paths and the live table in one write: spraying never
        # sees a slot naming a path that does not exist yet.
        table = set_slots(dp, peer, [p.weight for p in peer.paths], flip=False)
        old = peers_m.lookup(wire.u32(peer.index))
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


def _path_known(dp: Datapath, idx: int) -> bool:
    raw = dp.map("mrc_live").lookup(wire.u32(idx))
    return raw is not None and wire.PathLive.unpack(raw).last_ack_ns != 0



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
