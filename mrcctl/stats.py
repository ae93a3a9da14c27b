"""Reading the datapath's counters and states into one snapshot.

The snapshot is what `status --json` prints (docs/status.schema.json), what
`top` renders and what the Prometheus exporter serves, so all three agree.
"""

from __future__ import annotations

import time

from . import config as cfgmod
from . import wire
from .loader import Datapath
from .state import Instance

SCHEMA_VERSION = 1


def _state_name(live: wire.PathLive, path: wire.Path) -> str:
    if path.admin == wire.PathState.DENIED:
        return "DENIED"
    return wire.PathState(live.state).name if live.state in wire.PathState._value2member_map_ else "UNKNOWN"


def snapshot(cfg: cfgmod.Config, dp: Datapath | None = None) -> dict:
    own = dp is None
    if own:
        dp = Datapath(Instance(cfg.overlay_device))
    try:
        return _snapshot(cfg, dp)
    finally:
        if own:
            dp.close()


def _snapshot(cfg: cfgmod.Config, dp: Datapath) -> dict:
    now_ns = time.monotonic_ns()
    stats_m, live_m, paths_m = dp.map("mrc_path_stats"), dp.map("mrc_live"), dp.map("mrc_paths")
    peers_m, seq_m = dp.map("mrc_peers"), dp.map("mrc_peer_seq")
    inst_state = dp.inst.read()
    peers = []
    for peer in cfg.peers:
        praw = peers_m.lookup(wire.u32(peer.index))
        pent = wire.Peer.unpack(praw) if praw else wire.Peer()
        seq = wire.PeerSeq.unpack(seq_m.lookup(wire.u32(peer.index)) or bytes(wire.PeerSeq.size()))
        paths = []
        for path in peer.paths:
            key = wire.u32(wire.path_idx(peer.index, path.id))
            st = wire.PathStats.sum(stats_m.lookup_percpu(key))
            live = wire.PathLive.unpack(live_m.lookup(key))
            pent_path = wire.Path.unpack(paths_m.lookup(key))
            age_ms = (now_ns - live.last_ack_ns) / 1e6 if live.last_ack_ns else None
            paths.append({
                "id": path.id,
                "plane": path.plane.device,
                "ev": path.ev,
                "remote": str(path.remote),
                "state": _state_name(live, pent_path),
                "weight": pent_path.weight,
                "tx_packets": st.tx_packets,
                "tx_bytes": st.tx_bytes,
                "rx_packets": st.rx_packets,
                "rx_bytes": st.rx_bytes,
                "rx_ooo": st.rx_ooo,
                "rx_dup": st.rx_dup,
                "probes_tx": st.probes_tx,
                "probes_rx": st.probes_rx,
                "rtt_us": live.rtt_us or None,
                "srtt_us": live.srtt_us or None,
                "evidence_age_ms": round(age_ms, 3) if age_ms is not None else None,
            })
        peers.append({
            "name": peer.name,
            "overlay": str(peer.overlay),
            "spray": peer.spray,
            "min_active": peer.min_active,
            "active_table": pent.table,
            "tx_psn": seq.psn,
            "rx_psn_max": seq.rx_psn_max,
            "paths": paths,
        })
    drops = {}
    drops_m = dp.map("mrc_drops")
    for r in wire.Reason:
        drops[r.label] = wire.sum_percpu_u64(drops_m.lookup_percpu(wire.u32(int(r))))
    return {
        "schema": SCHEMA_VERSION,
        "time": time.time(),
        "overlay": {
            "device": cfg.overlay_device,
            "address": str(cfg.overlay_address),
            "mtu": inst_state.get("mtu"),
            "udp_port": cfg.udp_port,
        },
        "planes": [{"device": p.device, "weight": p.weight} for p in cfg.planes],
        "peers": peers,
        "drops": drops,
        "agent": {"pid": inst_state.get("agent_pid")},
    }
