"""Reading the datapath's counters and states into one snapshot.

The snapshot is what `status --json` prints (docs/status.schema.json), what
`top` renders and what the Prometheus exporter serves, so all three agree.
"""

from __future__ import annotations

import collections
import json
import struct
import time

from ..datapath import abi as wire
from ..datapath.maps import Datapath
from ..errors import InputError, MrcError
from ..instance import config as cfgmod
from ..instance.state import Instance

SCHEMA_VERSION = 1


_STATE_NAMES = {int(s): s.name for s in wire.PathState}


def _state_name(state: int) -> str:
    return _STATE_NAMES.get(state, "UNKNOWN")


def _hist(buckets: list[int]) -> dict[str, int]:
    """Reorder-distance histogram keyed by its PSN range ("1", "2-3", "128+")."""
    return {wire.hist_label(b, len(buckets)): c for b, c in enumerate(buckets)}


def _reorder(dp: Datapath, peer: int) -> dict | None:
    """The receiver's per-peer reorder/loss accounting (bpf/reorder.h).

    lost counts PSNs whose gap was not filled within the 4096-PSN window;
    late ones arrived after that, and unmarked ones arrived while another CPU
    moved the window (bpf/reorder.h), so net_lost = lost - late - unmarked."""
    try:
        m = dp.map("mrc_reorder")
    except Exception:   # an instance loaded before this map existed
        return None
    r = wire.Reorder.sum(m.lookup_percpu(wire.u32(peer)))
    net = max(0, r.lost - r.late - r.unmarked)
    seen = r.rx_packets + net
    return {
        "rx_packets": r.rx_packets, "ooo": r.ooo, "dup": r.dup, "lost": r.lost, "late": r.late,
        "unmarked": r.unmarked, "net_lost": net, "resync": r.resync,
        "ooo_ratio": round(r.ooo / r.rx_packets, 6) if r.rx_packets else 0.0,
        "loss_ratio": round(net / seen, 6) if seen else 0.0,
        "hist": _hist(r.hist),
    }


def _with_slot_shares(dp: Datapath, pent: wire.Peer, peer: int, paths: list[dict]) -> list[dict]:
    """Each path's share of the live slot table: the weights in force (adaptive or fixed)."""
    raw = dp.map("mrc_slots").lookup(wire.u32(wire.slots_idx(peer, pent.table)))
    if not raw:
        return paths
    # counted on the table's bytes (a path index per byte), not a list of ints
    n = min(wire.unpack_u32(raw[:4]), wire.MRC_SLOTS)
    table = raw[_SLOT_AT:_SLOT_AT + n]
    for p in paths:
        p["slot_share"] = round(table.count(p["id"]) / n, 4) if n else None
    return paths


_LIVE_AT = wire.PathLive.offsets()
_LIVE_NAMES = ("last_ack_ns", "rtt_us", "srtt_us", "ev_rtt_us", "flaps", "state")
_LIVE_FIELDS = [(struct.Struct("=" + dict(wire.PathLive.LAYOUT)[f]), _LIVE_AT[f]) for f in _LIVE_NAMES]
_Live = collections.namedtuple("_Live", _LIVE_NAMES)
_SLOT_AT = wire.Slots.offsets()["slot"]
_PATH_WEIGHT = wire.Path.offsets()["weight"]
_PATH_EV = wire.Path.offsets()["ev"]
_U16, _U32, _U64 = struct.Struct("=H"), struct.Struct("=I"), struct.Struct("=Q")
_CE_AT = wire.PathCong.offsets()["ce_echoes"]
_LOSS_AT = wire.PathCong.offsets()["loss_echoes"]
_MTU = struct.Struct(wire.PathMtu.fmt())


def _optional_map(dp: Datapath, name: str):
    """A map a datapath loaded before it existed lacks: None."""
    try:
        return dp.map(name)
    except MrcError:
        return None


def _echoes(raw: bytes | None, at: int) -> int:
    """How often the peer echoed CE (at _CE_AT) or loss (_LOSS_AT) for this
    path (bpf/congest.h); 0 from a datapath whose entries are shorter."""
    return _U64.unpack_from(raw, at)[0] if raw and len(raw) >= at + 8 else 0


def _path_mtu(raw: bytes | None, now_ns: int) -> int | None:
    """The path MTU an ICMP reported (bpf/pmtu.h) while in force."""
    if not raw:
        return None
    mtu, _icmps, s = _MTU.unpack_from(raw)
    age_s = (now_ns // 1_000_000_000 - s) % (1 << 32)
    return mtu if mtu and age_s <= wire.MRC_PMTU_AGE_S else None


def snapshot(cfg: cfgmod.Config, dp: Datapath | None = None, peers: set[str] | None = None) -> dict:
    """The instance's snapshot; `peers` (names) limits the per-peer part to
    those peers, and their maps are the only per-peer ones read."""
    if peers is not None:
        unknown = sorted(peers - {p.name for p in cfg.peers})
        if unknown:
            raise InputError(f"no peer named {', '.join(unknown)} in the config "
                             f"(peers: {', '.join(p.name for p in cfg.peers)})")
    own = dp is None
    if own:
        dp = Datapath(Instance(cfg.overlay_device))
    try:
        return _snapshot(cfg, dp, peers)
    finally:
        if own:
            dp.close()


def _ev_maps(dp: Datapath) -> dict:
    """What the agent's EV map learnt (agent/evmap.py writes evmap.json):
    per peer name and plane, its state, gateway and each port's hops."""
    try:
        return json.loads((dp.inst.run_dir / "evmap.json").read_text())
    except (OSError, ValueError):
        return {}


def _snapshot(cfg: cfgmod.Config, dp: Datapath, only: set[str] | None = None) -> dict:
    now_ns = time.monotonic_ns()
    stats_m, cnt_m = dp.map("mrc_path_stats"), _optional_map(dp, "mrc_path_cnt")
    paths_m, admin_m, live_m = dp.map("mrc_paths"), dp.map("mrc_admin"), dp.map("mrc_live")
    peers_m, seq_m = dp.map("mrc_peers"), dp.map("mrc_peer_seq")
    inst_state = dp.inst.read()
    ev_maps = _ev_maps(dp)
    mtu_m = _optional_map(dp, "mrc_path_mtu")
    cong_m = _optional_map(dp, "mrc_path_cong")
    # indices, not the count: live membership leaves holes (assign_indices)
    n_peers = max((p.index for p in cfg.peers), default=-1) + 1
    # One batch read per map for all peers, then per map per peer for its
    # paths: thousands of peers, not one system call per counter.
    pents = peers_m.lookup_range(0, n_peers)
    seqs = seq_m.lookup_range(0, n_peers)
    path_maps = [stats_m, cnt_m, paths_m, admin_m, live_m, mtu_m, cong_m]
    # every peer: each per-path map read once and sliced per peer (a read
    # per map per peer was 28,000 system calls at 4,096 peers)
    whole = None
    if only is None:
        end = max((dp.path_idx(p.index, 0) + len(p.paths) for p in cfg.peers), default=0)
        whole = [m.read_raw(0, end) if m is not None else b"" for m in path_maps]
    peers = []
    for peer in cfg.peers:
        if only is not None and peer.name not in only:
            continue
        pent = wire.Peer.unpack(pents[peer.index]) if peer.index < len(pents) else wire.Peer()
        seq = wire.PeerSeq.unpack(seqs[peer.index]) if peer.index < len(seqs) else wire.PeerSeq()
        first, n = dp.path_idx(peer.index, 0), len(peer.paths)
        if whole is None:
            rows = [m.read_range(first, n) if m is not None else [] for m in path_maps]
        else:
            rows = [m.split(raw[first * m.entry_size:(first + n) * m.entry_size]) if m is not None else []
                    for m, raw in zip(path_maps, whole)]
        hot, cold, ents, admins, lives, mtus, congs = rows
        step = (stats_m.value_size + 7) & ~7
        remote = {dev: str(addr) for dev, addr in peer.underlay.items()}
        paths = []
        for path in peer.paths:
            i = path.id
            st = wire.PathCounters.of([hot[i][c * step:c * step + stats_m.value_size]
                                       for c in range(len(hot[i]) // step)],
                                      cold[i] if i < len(cold) else None)
            # the fields of the entries it shows, not the entries unpacked
            # (MACs and addresses made into text, per path)
            weight = _U32.unpack_from(ents[i], _PATH_WEIGHT)[0]
            wire_ev = _U16.unpack_from(ents[i], _PATH_EV)[0]
            admin = wire.unpack_u32(admins[i])
            live = _Live(*(st_.unpack_from(lives[i], at)[0] for st_, at in _LIVE_FIELDS))
            age_ms = (now_ns - live.last_ack_ns) / 1e6 if live.last_ack_ns else None
            paths.append({
                "id": path.id,
                "plane": path.plane.device,
                "ev": path.ev,
                "wire_ev": wire_ev,
                "remote": remote[path.plane.device],
                "state": _state_name(wire.effective_state(admin, live.state)),
                "weight": weight,
                "tx_packets": st.tx_packets,
                "tx_bytes": st.tx_bytes,
                "tx_steered": st.tx_steered,
                "tx_hedged": st.tx_hedged,
                "rx_packets": st.rx_packets,
                "rx_bytes": st.rx_bytes,
                "rx_ooo": st.rx_ooo,
                "rx_dup": st.rx_dup,
                "rx_late": st.rx_late,
                "rx_ce": st.rx_ce,
                "rx_lost_units": st.rx_lost_units,
                "rx_lost_segs": st.rx_lost_segs,
                "slot_share": None,
                "probes_rx": st.probes_rx,
                "rtt_us": live.rtt_us or None,
                "srtt_us": live.srtt_us or None,
                "evidence_age_ms": round(age_ms, 3) if age_ms is not None else None,
                # path health (bpf/judge.h, bpf/evidence.h): send-to-evidence delay, relapses
                "evidence_delay_ms": round(live.ev_rtt_us / 1000, 3) if live.ev_rtt_us else None,
                "flaps": live.flaps,
                "mtu": _path_mtu(mtus[i] if i < len(mtus) else None, now_ns),
                "ecn_echoes": _echoes(congs[i] if i < len(congs) else None, _CE_AT),
                "loss_echoes": _echoes(congs[i] if i < len(congs) else None, _LOSS_AT),
            })
        peers.append({
            "name": peer.name,
            "overlay": str(peer.overlay),
            "overlays": [str(a) for a in peer.overlays],
            "prefixes": [str(n) for n in peer.prefixes],
            "spray": wire.SprayMode(pent.spray_mode).label
            if pent.spray_mode in wire.SprayMode._value2member_map_ else peer.spray,
            "spray_config": peer.spray,
            "flowlet_gap_us": pent.flowlet_gap_us or None,
            "weights_mode": cfgmod.weights_mode(cfg),
            "reorder": _reorder(dp, peer.index),
            "min_active": peer.min_active,
            "active_table": pent.table,
            "tx_psn": seq.psn,
            "rx_psn_max": seq.rx_psn_max,
            "paths": _with_slot_shares(dp, pent, peer.index, paths),
        })
        if peer.name in ev_maps:
            peers[-1]["ev_map"] = ev_maps[peer.name]
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
            "addresses": [str(a) for a in cfg.overlay_addresses],
            "prefixes": [str(n) for n in cfg.overlay_prefixes],
            "mtu": inst_state.get("mtu"),
            "udp_port": cfg.udp_port,
        },
        "planes": [{"device": p.device, "weight": p.weight,
                    "allow_underlay": _allow_underlay(dp, cfg, p.device),
                    "rx_hook": inst_state.get("rx_hooks", {}).get(p.device)} for p in cfg.planes],
        "auth": _auth(dp, cfg),
        "peers": peers,
        "drops": drops,
        "agent": {"pid": inst_state.get("agent_pid")},
        "health": _health(dp),
    }


def _allow_underlay(dp: Datapath, cfg: cfgmod.Config, device: str) -> list[str] | None:
    """The frames of a plane that reach the stack, as the datapath holds
    them (mrc_acl, bpf/acl.h): None = everything (no list), else what always
    passes, then the plane's rules."""
    import socket
    try:
        raw = dp.map("mrc_acl").lookup(wire.u32(socket.if_nametoindex(device)))
    except (OSError, MrcError):     # plane gone, or a datapath before issue #13.10
        return None
    if raw is None:
        return None
    rules = [cfgmod.acl_rule_text(r) for r in wire.Acl.unpack(raw).rules()]
    return [f"mrc udp/{cfg.udp_port} (configured peers)", "arp", "ipv6-nd"] + rules


def _auth(dp: Datapath, cfg: cfgmod.Config) -> dict:
    """Which peers the datapath authenticates (mrc_auth; never the key)."""
    peers = []
    try:
        m = dp.map("mrc_auth")
        for peer in cfg.peers:
            raw = m.lookup(wire.u32(peer.index))
            if raw and wire.AuthKey.unpack(raw).on:
                peers.append(peer.name)
    except MrcError:
        pass
    return {"peers": peers}


def _health(dp: Datapath) -> dict:
    """Datapath health counters (bpf/judge.h, bpf/evidence.h, bpf/hedge.h) and the agent's probe report."""
    out: dict = {}
    try:
        hs = wire.HealthStats.sum(dp.map("mrc_hstats").lookup_percpu(wire.u32(0)))
        out.update({n: getattr(hs, n) for n, _f in wire.HealthStats.LAYOUT})
    except Exception:   # an instance loaded before this map existed
        pass
    try:
        import json
        rep = json.loads((dp.inst.run_dir / "health.json").read_text())
        out["agent"] = {k: rep.get(k) for k in ("probes_sent", "probe_errors", "probes_deferred", "probe_budget",
                                                  "probes_generated", "probe_generator_planes",
                                                  "probe_generator_error", "peers_in_use", "probed_paths",
                                                  "planes_down", "events", "cpu_s", "uptime_s")}
    except (OSError, ValueError):
        pass
    return out
