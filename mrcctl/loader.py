"""Bringing an instance up and down: load, fill maps, attach, undo.

`up` is a reconcile: it creates what is missing and leaves alone what is
already right, so running it twice with the same file changes nothing. On a
fresh instance any failure rolls back everything done so far and the error
names the step. `down` works from the state file and the config and
tolerates anything being half there.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import signal
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from . import agent as agentmod
from . import config as cfgmod
from . import topology, wire
from .errors import InputError, MrcError, StepError
from .libbpf import BpfObject, LibbpfError, Map, Program
from .state import Instance

TX_PROG = "mrc_tx"
RX_PROG = "mrc_rx"
MAP_NAMES = ("mrc_cfg", "mrc_peers", "mrc_slots", "mrc_paths", "mrc_live", "mrc_peer_seq",
             "mrc_path_stats", "mrc_drops", "mrc_peer_ip", "mrc_rx_peers", "mrc_events",
             "mrc_dedup", "mrc_hstats", "mrc_tx_flows",
             "mrc_rx_win", "mrc_reorder", "mrc_flowlets", "mrc_path_delay")   # issue 4: bpf/reorder.h, bpf/spray.h


def bpf_dir() -> Path:
    env = os.environ.get("MRC_BPF_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "bpf"


def object_paths() -> tuple[Path, Path]:
    d = bpf_dir()
    tx, rx = d / "tx.bpf.o", d / "rx.bpf.o"
    for p in (tx, rx):
        if not p.exists():
            raise MrcError(f"BPF object {p} is missing: build it with `make -C {d}`")
    return tx, rx


def objects_digest() -> str:
    h = hashlib.sha256()
    for p in object_paths():
        h.update(p.read_bytes())
    return h.hexdigest()


# ------------------------------------------------------------------ datapath handles

class Datapath:
    """The maps and programs of one running instance, found by BPF object id.

    Ids, not pins: `ip netns exec` gives each invocation a private mount
    namespace, so a bpffs mounted by one invocation is gone for the next,
    while ids are global and live as long as the attached programs (and the
    agent) hold the objects.
    """

    def __init__(self, inst: Instance):
        self.inst = inst
        self.state = inst.read()
        self._maps: dict[str, Map] = {}

    def exists(self) -> bool:
        return bool(self.state.get("map_ids"))

    def map(self, name: str) -> Map:
        m = self._maps.get(name)
        if m is None:
            mid = self.state.get("map_ids", {}).get(name)
            if mid is None:
                raise MrcError(f"{self.inst.overlay}: not up in this network namespace; run `mrcctl up` first")
            try:
                m = Map.from_id(mid)
            except OSError:
                raise MrcError(f"{self.inst.overlay}: the datapath is gone (map {name} id {mid} no longer "
                               "exists); run `mrcctl down` then `mrcctl up`") from None
            if m.name != name:
                m.close()
                raise MrcError(f"{self.inst.overlay}: map id {mid} is no longer {name}; run `mrcctl up`")
            self._maps[name] = m
        return m

    def program(self, name: str) -> Program:
        pid = self.state.get("prog_ids", {}).get(name)
        if pid is None:
            raise MrcError(f"{self.inst.overlay}: program {name} unknown; run `mrcctl up`")
        return Program.from_id(pid)

    def close(self):
        for m in self._maps.values():
            m.close()
        self._maps.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ------------------------------------------------------------------ planning

@dataclass
class PlaneRuntime:
    plane: cfgmod.Plane
    ifindex: int
    mac: bytes
    mtu: int
    local: dict[int, ipaddress.IPv4Address | ipaddress.IPv6Address]   # family -> address
    subnets: list


def preflight(cfg: cfgmod.Config, nl: topology.Netlink) -> tuple[list[PlaneRuntime], int]:
    """Everything that can be checked before changing anything."""
    planes = []
    for pl in cfg.planes:
        link = nl.link(pl.device)
        if link is None:
            raise InputError(f"plane {pl.device}: no such interface in this network namespace")
        addrs = nl.addresses(pl.device)
        local = {}
        for fam in (4, 6):
            if pl.address is not None:
                if pl.address.version == fam:
                    local[fam] = pl.address
                continue
            for a in addrs:
                if a.version == fam:
                    local[fam] = a.ip
                    break
        for peer in cfg.peers:
            remote = peer.underlay.get(pl.device)
            if remote is not None and remote.version not in local:
                raise InputError(f"plane {pl.device}: has no IPv{remote.version} address for peer "
                                 f"{peer.name} ({remote}); add one or set plane.address")
        for a in addrs:
            if a.version == 4 and a.network.overlaps(cfg.overlay_address.network):
                raise InputError(f"overlay.address: {cfg.overlay_address} overlaps the subnet {a.network} "
                                 f"of plane {pl.device}")
        planes.append(PlaneRuntime(pl, link["index"], nl.mac(pl.device), link.get("mtu"), local,
                                   [a.network for a in addrs]))
    need = cfg.overhead()
    smallest = min(p.mtu for p in planes)
    mtu = cfg.mtu if cfg.mtu is not None else smallest - need
    if mtu + need > smallest:
        raise InputError(f"overlay.mtu: {mtu} + {need} bytes of encapsulation exceeds the smallest "
                         f"plane MTU {smallest}")
    if mtu < 576:
        raise InputError(f"overlay.mtu: plane MTU {smallest} leaves only {mtu} bytes for the overlay "
                         "(at least 576 needed)")
    dev = nl.link(cfg.overlay_device)
    if dev is not None and not Instance(cfg.overlay_device).exists():
        raise InputError(f"overlay.device: {cfg.overlay_device} already exists and is not managed by mrc")
    return planes, mtu


# ------------------------------------------------------------------ map contents

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


def _path_known(dp: Datapath, idx: int) -> bool:
    raw = dp.map("mrc_live").lookup(wire.u32(idx))
    return raw is not None and wire.PathLive.unpack(raw).last_ack_ns != 0


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
    inner = {p: wire.build_slot_table([weights[i] for i in planes[p]], min(w, wire.MRC_SLOTS))
             for p, w in zip(order, pw)}
    sent = dict.fromkeys(order, 0)
    table = []
    for k in wire.build_slot_table(pw, n):
        p = order[k]
        table.append(planes[p][inner[p][sent[p] % len(inner[p])]])
        sent[p] += 1
    return table


def set_slots(dp: Datapath, peer: cfgmod.Peer, weights: list[int], flip: bool = True) -> int:
    """Write the idle slot table, then flip the peer to it (atomic for the
    datapath); returns the table written. flip=False leaves the flip to the
    caller (fill_maps flips together with a change of n_paths)."""
    peers_m, slots_m = dp.map("mrc_peers"), dp.map("mrc_slots")
    raw = peers_m.lookup(wire.u32(peer.index))
    cur = wire.Peer.unpack(raw) if raw else wire.Peer()
    idle = 1 - (cur.table & 1) if cur.n_paths else 0
    if sum(weights) == 0:
        weights = [1] * len(weights)
    total = sum(weights)
    # A whole number of weight rounds makes every path's share exact.
    n = (wire.MRC_SLOTS // total) * total if total <= wire.MRC_SLOTS else wire.MRC_SLOTS
    slots = slot_table(peer, weights, n)
    slots_m.update(wire.u32(wire.slots_idx(peer.index, idle)), wire.Slots.of(slots).pack())
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
    paths_m, live_m = dp.map("mrc_paths"), dp.map("mrc_live")
    for peer in peers if peers is not None else cfg.peers:
        weights, fallback = [], []
        for path in peer.paths:
            key = wire.path_key(peer.index, path.id)
            p = wire.Path.unpack(paths_m.lookup(key))
            lv = wire.PathLive.unpack(live_m.lookup(key))
            denied = p.admin == wire.PathState.DENIED
            fallback.append(0 if denied else max(p.weight, 0))
            weights.append(p.weight if not denied and lv.state == wire.PathState.GOOD else 0)
        if sum(weights) == 0:
            weights = fallback
        if sum(weights) == 0:
            weights = [1] * len(peer.paths)
        set_slots(dp, peer, weights)


def set_path_weights(dp: Datapath, peer: cfgmod.Peer, weights: dict[int, int]) -> None:
    """Store path id -> current weight in mrc_paths (see rebuild_slots)."""
    paths_m = dp.map("mrc_paths")
    for pid, w in weights.items():
        key = wire.path_key(peer.index, pid)
        ent = wire.Path.unpack(paths_m.lookup(key))
        if ent.weight != w:
            ent.weight = w
            paths_m.update(key, ent.pack())


# ------------------------------------------------------------------ up / down

class Loaded:
    """Freshly loaded programs and their shared maps (owned handles)."""

    def __init__(self, maps: dict[str, Map], tx: Program, rx: Program):
        self.maps, self.tx, self.rx = maps, tx, rx

    @property
    def map_ids(self) -> dict[str, int]:
        return {name: m.id for name, m in self.maps.items()}

    @property
    def prog_ids(self) -> dict[str, int]:
        return {TX_PROG: self.tx.id, RX_PROG: self.rx.id}

    def close(self) -> None:
        for h in (*self.maps.values(), self.tx, self.rx):
            h.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def load_objects(reuse: dict[str, Map] | None = None) -> Loaded:
    """Load tx.bpf.o and rx.bpf.o so they share one set of maps.

    The first object creates the maps unless `reuse` supplies them (the
    running instance's, so counters, PSNs and states survive a reload); the
    second object reuses the first's. A running map whose layout the new
    objects changed (an upgrade) is replaced by a fresh one: libbpf would
    adopt the old sizes and the verifier reject the new programs.
    """
    shared: dict[str, Map] = dict(reuse or {})
    progs = []
    for path, prog in zip(object_paths(), (TX_PROG, RX_PROG)):
        obj = BpfObject.open(str(path))
        try:
            for name in [n for n, m in shared.items() if obj.map_def(n) != m.definition]:
                shared.pop(name).close()
            for name, m in shared.items():
                obj.reuse_map(name, m.fd)
            try:
                obj.load()
            except LibbpfError as e:
                raise StepError(f"loading {path.name}", _load_error(e)) from None
            for name in MAP_NAMES:
                if name not in shared:
                    shared[name] = Map.from_id(obj.map(name).id)
            progs.append(Program.from_id(obj.program(prog).id))
        finally:
            obj.close()
    return Loaded(shared, *progs)


def _load_error(e: LibbpfError) -> str:
    """One line out of libbpf's multi-line failure: the errno, and the
    verifier's own words when it refused (the lines before "processed N
    insns"); MRC_LIBBPF_DEBUG=1 prints the whole log."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    cause = os.strerror(e.errno) if e.errno else lines[0]
    why = []
    for k, ln in enumerate(lines):
        if ln.startswith("processed ") and "insns" in ln:
            why = [x for x in lines[max(0, k - 3):k] if not x[:1].isdigit() and not x.startswith(";")]
            break
    return f"{cause}" + (f" (verifier: {'; '.join(why)})" if why else "")


def _running_maps(prior: dict) -> dict[str, Map]:
    found = {}
    for name, mid in prior.get("map_ids", {}).items():
        with suppress(OSError):
            m = Map.from_id(mid)
            if m.name == name:
                found[name] = m
            else:
                m.close()
    return found


_lock_depth: dict[str, tuple[int, int]] = {}


class _InstanceLock:
    """One `up`/`down` at a time per instance (flock; re-entrant, because a
    failed fresh `up` calls `down` to roll back). Lives outside the instance
    directory, which `down` removes."""

    def __init__(self, inst: Instance, timeout: float = 60):
        self.inst, self.timeout = inst, timeout

    def __enter__(self):
        import fcntl
        key = self.inst.key
        fd, depth = _lock_depth.get(key, (-1, 0))
        if depth == 0:
            d = self.inst.run_dir.parent.parent / "locks"
            d.mkdir(parents=True, exist_ok=True)
            fd = os.open(d / f"{key}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            deadline = time.monotonic() + self.timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        os.close(fd)
                        raise MrcError(f"{self.inst.overlay}: another mrcctl up/down has held this instance "
                                       f"for {self.timeout:g} s") from None
                    time.sleep(0.05)
        _lock_depth[key] = (fd, depth + 1)
        return self

    def __exit__(self, *exc):
        fd, depth = _lock_depth[self.inst.key]
        if depth == 1:
            del _lock_depth[self.inst.key]
            os.close(fd)        # releases the flock
        else:
            _lock_depth[self.inst.key] = (fd, depth - 1)


def up(cfg: cfgmod.Config, agent: bool = True) -> str:
    with _InstanceLock(Instance(cfg.overlay_device)):
        return _up(cfg, agent)


def _up(cfg: cfgmod.Config, agent: bool = True) -> str:
    inst = Instance(cfg.overlay_device)
    with topology.Netlink() as nl:
        prior = inst.read()
        planes, mtu = preflight(cfg, nl)
        digest = objects_digest()
        if prior and prior.get("config_digest") == cfg.digest and prior.get("objects_digest") == digest \
                and _attached(inst, cfg, nl, prior) and (not agent or agentmod.alive(prior.get("agent_pid"))):
            return f"{cfg.overlay_device}: already up, nothing changed"
        fresh = not prior
        # Hold the running programs for the whole operation: if a step fails
        # after new programs replaced them somewhere, rollback re-attaches
        # these, which must still exist.
        held = []
        for pid in prior.get("prog_ids", {}).values():
            with suppress(OSError):
                held.append(Program.from_id(pid))
        try:
            msg = _apply(cfg, inst, nl, planes, mtu, digest, prior)
            if agent:
                _ensure_agent(cfg, inst, restart=bool(prior) and prior.get("config_digest") != cfg.digest)
            _keep_config(inst, cfg)
            return msg
        except BaseException as e:
            if fresh:
                with suppress(Exception):
                    down(cfg)
                raise
            undone = _rollback(inst, nl, prior)
            if isinstance(e, MrcError):
                raise MrcError(f"{e}; {undone}", e.exit_code) from None
            raise
        finally:
            for h in held:
                h.close()


def _keep_config(inst: Instance, cfg: cfgmod.Config) -> None:
    """Keep the text of the configuration now running, so a failed upgrade
    can go back to it even when the operator edited the file in place."""
    with suppress(OSError):
        raw = Path(cfg.source).read_bytes()
        if hashlib.sha256(raw).hexdigest() == cfg.digest:
            tmp = inst.run_dir / "config.toml.tmp"
            tmp.write_bytes(raw)
            os.replace(tmp, inst.run_dir / "config.toml")


def _rollback(inst: Instance, nl: topology.Netlink, prior: dict) -> str:
    """Put a running instance back the way `prior` describes after a failed
    re-up: its configuration (from the kept copy), its programs (by id), its
    planes, routes and sysctls. Returns what was done, for the error line."""
    try:
        raw = (inst.run_dir / "config.toml").read_bytes()
        old = cfgmod.parse(raw, source=prior.get("config", "<previous>"))
        planes, mtu = preflight(old, nl)
        state = inst.read()
        state.update(prog_ids=prior.get("prog_ids", {}), map_ids=prior.get("map_ids", {}),
                     objects_digest=prior.get("objects_digest"))
        _apply(old, inst, nl, planes, mtu, prior.get("objects_digest"), state)
        return "rolled back to the running configuration"
    except Exception as e:  # noqa: BLE001 - report, the original error matters more
        inst.write({**inst.read(), "rollback_failed": str(e)})
        return f"rollback failed too ({e}); run `mrcctl down` then `mrcctl up`"


def _ensure_agent(cfg: cfgmod.Config, inst: Instance, restart: bool) -> None:
    state = inst.read()
    if agentmod.alive(state.get("agent_pid")):
        if not restart:
            return
        stop_agent(state)
    state["agent_pid"] = agentmod.spawn(cfg)
    inst.write(state)


def _programs_alive(state: dict) -> bool:
    for pid in state.get("prog_ids", {}).values():
        try:
            Program.from_id(pid).close()
        except OSError:
            return False
    return bool(state.get("prog_ids"))


def _attached(inst: Instance, cfg: cfgmod.Config, nl: topology.Netlink, prior: dict) -> bool:
    ids = prior.get("prog_ids", {})
    if not _programs_alive(prior):
        return False
    if ids.get(TX_PROG) != nl.tc_egress_prog_id(cfg.overlay_device):
        return False
    return all(nl.xdp_prog_id(p.device) == ids.get(RX_PROG) for p in cfg.planes)


def _step(name: str, fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except MrcError:
        raise
    except topology.TopologyError as e:
        raise StepError(name, str(e)) from None
    except OSError as e:
        raise StepError(name, e.strerror or str(e)) from None
    except Exception as e:  # netlink errors carry their own types
        raise StepError(name, str(e) or type(e).__name__) from None


def _apply(cfg, inst, nl, planes, mtu, digest, prior) -> str:
    state = dict(prior)
    state.update(overlay=cfg.overlay_device, config=cfg.source, config_digest=cfg.digest,
                 netns=inst.netns, planes=sorted(set(state.get("planes", [])) | {p.device for p in cfg.planes}))
    state.setdefault("rp_filter", {})
    inst.write(state)     # from here on `down` can find and undo everything

    loaded = None
    if prior.get("objects_digest") != digest or not _programs_alive(prior):
        loaded = _step("loading BPF programs", load_objects, _running_maps(prior))
        state.update(prog_ids=loaded.prog_ids, map_ids=loaded.map_ids, objects_digest=digest)
        inst.write(state)

    # A changed overlay.address replaces the old one rather than joining it;
    # removed first, as deleting a primary address takes its secondaries.
    if nl.index(cfg.overlay_device) is not None:
        for a in nl.addresses(cfg.overlay_device):
            if a.version == 4 and a != cfg.overlay_address:
                _step(f"removing the old overlay address {a}", nl.ipr.addr, "del",
                      index=nl.index(cfg.overlay_device), address=str(a.ip), prefixlen=a.network.prefixlen)
    _step("creating the overlay device", nl.create_overlay, cfg.overlay_device, mtu, cfg.overlay_address)
    overlay_ifindex = nl.index(cfg.overlay_device)
    # The spraying unit: smaller units, less reordering between planes.
    _step("setting gso_max_size", nl.ipr.link, "set", index=overlay_ifindex, gso_max_size=cfg.spray_unit())

    for rt in planes:
        key = f"net/ipv4/conf/{rt.plane.device}/rp_filter"
        if rt.plane.device not in state["rp_filter"]:
            state["rp_filter"][rt.plane.device] = topology.get_sysctl(key)
        # Decapsulated packets arrive on the plane with an overlay source that
        # routes via the overlay device: strict reverse-path filtering drops them.
        _step(f"setting rp_filter on {rt.plane.device}", topology.set_sysctl, key, "2")
    inst.write(state)

    wanted = [(p.plane.device, str(p.remote)) for peer in cfg.peers for p in peer.paths]
    macs = nl.resolve_neighbours(sorted(set(wanted)))

    with Datapath(inst) as dp:
        _step("filling the maps", fill_maps, dp, cfg, planes, overlay_ifindex, macs)
        rx = _step("opening the receive program", dp.program, RX_PROG)
        tx = _step("opening the transmit program", dp.program, TX_PROG)
        try:
            ours = {state["prog_ids"][RX_PROG], prior.get("prog_ids", {}).get(RX_PROG)}
            for rt in planes:
                dev = rt.plane.device
                cur = nl.xdp_prog_id(dev)
                if cur == state["prog_ids"][RX_PROG]:
                    continue      # adopted: an attachment is never redone
                if cur and cur not in ours and _prog_name(cur) != RX_PROG:
                    raise StepError(f"attaching XDP to {dev}", f"another XDP program "
                                    f"({_prog_name(cur) or '?'}, id {cur}) is attached; mrc does not replace it")
                _step(f"attaching XDP to {dev}", nl.attach_xdp, dev, rx.fd)
            if nl.tc_egress_prog_id(cfg.overlay_device) != state["prog_ids"][TX_PROG]:
                _step(f"attaching tc egress to {cfg.overlay_device}", nl.attach_tc_egress,
                      cfg.overlay_device, tx.fd, TX_PROG)
        finally:
            rx.close()
            tx.close()

    # Planes dropped from the config: detach our program, restore rp_filter.
    for dev in set(state["planes"]) - {p.device for p in cfg.planes}:
        _detach_plane(nl, dev, state)
    state["planes"] = [p.device for p in cfg.planes]

    routes = set(state.get("routes", []))
    want_routes = {f"{peer.overlay}/32" for peer in cfg.peers}
    for r in sorted(want_routes):
        _step(f"adding route {r}", nl.route_replace, r, cfg.overlay_device)
    for r in sorted(routes - want_routes):
        nl.route_delete(r, cfg.overlay_device)
    state["routes"] = sorted(want_routes)
    state["mtu"] = mtu
    state["up_at"] = time.time()
    inst.write(state)
    if loaded is not None:
        loaded.close()    # the attachments hold the programs, the programs the maps
    unresolved = [f"{d}->{a}" for (d, a), m in macs.items() if m is None]
    note = f" ({len(unresolved)} neighbours unresolved, kernel resolves them)" if unresolved else ""
    n_paths = sum(len(p.paths) for p in cfg.peers)
    return (f"{cfg.overlay_device}: up, {cfg.overlay_address} mtu {mtu}, {len(cfg.planes)} planes, "
            f"{len(cfg.peers)} peers, {n_paths} paths{note}")


def _detach_plane(nl: topology.Netlink, dev: str, state: dict) -> None:
    rx_id = state.get("prog_ids", {}).get(RX_PROG)
    cur = nl.xdp_prog_id(dev)
    if cur and (cur == rx_id or _prog_name(cur) == RX_PROG):
        nl.detach_xdp(dev)
    old = state.get("rp_filter", {}).pop(dev, None)
    if old is not None:
        with suppress(OSError):
            topology.set_sysctl(f"net/ipv4/conf/{dev}/rp_filter", old)


def _prog_name(prog_id: int) -> str | None:
    try:
        with Program.from_id(prog_id) as p:
            return p.name
    except OSError:
        return None


def stop_agent(state: dict) -> None:
    pid = state.get("agent_pid")
    if not agentmod.alive(pid):
        return
    with suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)
        # alive(), not kill(pid, 0): the agent's parent is gone, and until
        # init reaps it (over a second on some systems) it is a zombie.
        for _ in range(100):
            if not agentmod.alive(pid):
                return
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)


def down(cfg: cfgmod.Config | None = None, overlay: str | None = None) -> str:
    """Remove everything `up` created; works on half-configured or crashed instances."""
    overlay = overlay or cfg.overlay_device
    with _InstanceLock(Instance(overlay)):
        return _down(cfg, overlay)


def _down(cfg: cfgmod.Config | None, overlay: str) -> str:
    inst = Instance(overlay)
    state = inst.read()
    had_state = bool(state)
    removed = []
    stop_agent(state)
    with topology.Netlink() as nl:
        planes = set(state.get("planes", []))
        if cfg is not None:
            planes |= {p.device for p in cfg.planes}
        state.setdefault("prog_ids", {})
        for dev in sorted(planes):
            if nl.index(dev) is not None:
                _detach_plane(nl, dev, state)
        # Deleting the overlay device takes its clsact hook and routes with it.
        if nl.index(overlay) is not None and (state or inst.exists() or cfg is not None):
            nl.delete_link(overlay)
            removed.append(overlay)
    inst.remove()
    if not removed and not had_state:
        return f"{overlay}: nothing to remove"
    return f"{overlay}: down"

