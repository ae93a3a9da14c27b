"""Bringing an instance up and down: load, fill maps, attach, undo.

`up` is a reconcile: it creates what is missing and leaves alone what is
already right, so running it twice with the same file changes nothing. On a
fresh instance any failure rolls back everything done so far and the error
names the step. `down` works from the state file and the config and
tolerates anything being half there.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from contextlib import suppress
from pathlib import Path

from ..datapath import netdev
from ..datapath.libbpf import Program
from ..datapath.maps import Datapath
from ..datapath.objects import (RX_PROG, RX_TC_PROG, TX_PROG, Loaded, load_objects, objects_digest,
                                prog_name, programs_alive, resized, running_maps)
from ..errors import MrcError, StepError
from . import config as cfgmod
from . import members, supervisor, topology
from .fill import fill_maps
from .lock import InstanceLock
from .preflight import preflight
from .state import Instance, all_instances, remove_stale


def up(cfg: cfgmod.Config, agent: bool = True) -> str:
    with InstanceLock(Instance(cfg.overlay_device)):
        stale = remove_stale()
        # indices follow the running instance's (peers added live keep theirs)
        cfg = members.bind(cfg)
        msg = _up(cfg, agent)
    if stale:
        msg += f" (removed {len(stale)} stale instance record(s) of deleted namespaces: {', '.join(stale)})"
    return msg


def _up(cfg: cfgmod.Config, agent: bool = True) -> str:
    inst = Instance(cfg.overlay_device)
    prior = inst.read()
    # A fresh instance: its programs start verifying now, while preflight
    # and netlink's import run (a re-up keeps its order: the running maps
    # are carried over after the agent stopped writing them).
    preload = None if prior else _Preload.start(cfg)
    try:
        return _up_with(cfg, agent, inst, prior, preload)
    finally:
        if preload is not None:
            preload.discard()


def _up_with(cfg: cfgmod.Config, agent: bool, inst: Instance, prior: dict,
             preload: "_Preload | None") -> str:
    with topology.Netlink() as nl:
        planes, mtu = preflight(cfg, nl)
        digest = objects_digest()
        if prior and prior.get("config_digest") == cfg.digest and prior.get("objects_digest") == digest \
                and _attached(inst, cfg, nl, prior) and (not agent or supervisor.alive(prior.get("agent_pid"))):
            return f"{cfg.overlay_device}: already up, nothing changed"
        fresh = not prior
        # Hold the running programs for the whole operation: if a step fails
        # after new programs replaced them somewhere, rollback re-attaches
        # these, which must still exist.
        held = []
        for pid in prior.get("prog_ids", {}).values():
            with suppress(OSError):
                held.append(Program.from_id(pid))
        # One writer at a time: the loader writes every field of mrc_paths
        # and the slot tables, which the agent's tasks rewrite afterwards
        # (bpf/mrc.h); the agent stops while the maps are filled and
        # ensure() below starts it again.
        had_agent = supervisor.alive(prior.get("agent_pid"))
        supervisor.stop(prior)
        try:
            msg = _apply(cfg, inst, nl, planes, mtu, digest, prior, neigh_wait=_neigh_wait(agent),
                         preload=preload)
            if agent:
                supervisor.ensure(cfg, inst, restart=bool(prior) and prior.get("config_digest") != cfg.digest)
            _keep_config(inst, cfg)
            return msg
        except BaseException as e:
            if fresh:
                with suppress(Exception):
                    down(cfg)
                raise
            undone = _rollback(inst, nl, prior, had_agent)
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


def _rollback(inst: Instance, nl: topology.Netlink, prior: dict, agent: bool = False) -> str:
    """Put a running instance back the way `prior` describes after a failed
    re-up: its configuration (from the kept copy), its programs (by id), its
    planes, routes and sysctls. Returns what was done, for the error line."""
    try:
        raw = (inst.run_dir / "config.toml").read_bytes()
        # with the peers its directory holds now: those that ran, or the
        # change of the directory is what the agent applies next
        old = members.bind(cfgmod.with_peers_dir(cfgmod.parse(raw, source=prior.get("config", "<previous>"))))
        planes, mtu = preflight(old, nl)
        state = inst.read()
        state.update(prog_ids=prior.get("prog_ids", {}), map_ids=prior.get("map_ids", {}),
                     objects_digest=prior.get("objects_digest"))
        _apply(old, inst, nl, planes, mtu, prior.get("objects_digest"), state, neigh_wait=_neigh_wait(agent))
        if agent:
            supervisor.ensure(old, inst, restart=False)
        return "rolled back to the running configuration"
    except Exception as e:  # noqa: BLE001 - report, the original error matters more
        inst.write({**inst.read(), "rollback_failed": str(e)})
        return f"rollback failed too ({e}); run `mrcctl down` then `mrcctl up`"


def _attached(inst: Instance, cfg: cfgmod.Config, nl: topology.Netlink, prior: dict) -> bool:
    ids = prior.get("prog_ids", {})
    if not programs_alive(prior):
        return False
    if ids.get(TX_PROG) != nl.tc_egress_prog_id(cfg.overlay_device):
        return False
    hooks = prior.get("rx_hooks", {})
    for p in cfg.planes:
        hook = hooks.get(p.device)
        if hook != rx_hook_of(p, nl):
            return False
        if hook == "tc" and nl.tc_ingress_prog_id(p.device) != ids.get(RX_TC_PROG):
            return False
        if hook == "xdp" and nl.xdp_prog_id(p.device) != ids.get(RX_PROG):
            return False
    return True


def units_cross_whole(hooks: dict[str, str], hops: dict, kind=topology.link_kind) -> bool:
    """Does every unit reach the peer's TCP as the one skb it left as?
    Only over veth planes received at tc ingress (hooks: device -> hook)
    toward on-link peers (hops: (device, peer address) -> (ifindex, next
    hop), topology.Netlink.poke_neighbours). A NIC under a vlan or macvlan
    plane segments every unit (no NIC offloads a tunnel on mrc's port), so
    may a routed hop (the fabric testbed's shaped links do; a real switch
    carries wire packets only), and TCP then takes it segment by segment,
    as with XDP (docs/benchmarks/receive-hook.md)."""
    return bool(hooks) and all(h == "tc" and kind(d) == "veth" for d, h in hooks.items()) and \
        all(hop == addr for (_, addr), (_, hop) in hops.items())


def rx_hook_of(plane: cfgmod.Plane, nl: topology.Netlink | None = None) -> str:
    """The receive hook a plane gets: its rx_hook, "auto" decided by the device."""
    return plane.rx_hook if plane.rx_hook != "auto" else topology.auto_rx_hook(plane.device)


def _needed(hooks: dict[str, str]) -> set[str]:
    """The programs to load for these receive hooks: only those attached
    somewhere (verifying the other receive program would double the
    receive object's share of `up`)."""
    return {TX_PROG} | {RX_TC_PROG if h == "tc" else RX_PROG for h in hooks.values()}


class _Preload:
    """A fresh instance's programs and maps, loading in a thread from the
    start of `up`: verifying them is most of its time and needs nothing of
    the host but the planes' link kinds (their hooks). take() waits for
    them where `up` loads; discard() frees what was not taken (a failed
    preflight changed nothing)."""

    @classmethod
    def start(cls, cfg: cfgmod.Config) -> "_Preload | None":
        try:
            digest = objects_digest()
        except MrcError:
            return None     # reported after preflight's findings, which come first
        return cls(cfg, digest)

    def __init__(self, cfg: cfgmod.Config, digest: str):
        self.hooks = {p.device: rx_hook_of(p) for p in cfg.planes}
        self.digest = digest
        self._result: Loaded | None = None
        self._error: BaseException | None = None
        verifying = threading.Event()
        self._thread = threading.Thread(target=self._run, name="preload", daemon=True,
                                        args=(cfg.sizing(), len(cfg.planes), _needed(self.hooks), verifying,
                                              cfg.flowlet_room()))
        self._thread.start()
        # Until the kernel has the programs the loader runs Python (opening
        # the objects, making the maps): let it have the GIL for those few
        # ms, or this thread's imports delay the verification by more.
        verifying.wait(1.0)

    def _run(self, sizing, n_planes: int, needed: set[str], verifying: threading.Event, flowlets: int) -> None:
        try:
            self._result = load_objects({}, sizing, n_planes, needed, verifying, flowlets)
        except BaseException as e:  # noqa: BLE001 - raised by take()
            self._error = e
        finally:
            verifying.set()

    def take(self) -> Loaded:
        self._thread.join()
        if self._error is not None:
            e, self._error = self._error, None
            raise e
        r, self._result = self._result, None
        return r

    def discard(self) -> None:
        self._thread.join()
        if self._result is not None:
            self._result.close()
            self._result = None


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


# How long `up` waits for neighbours the kernel has not resolved yet. With
# the agent none: `up` asks before the programs verify and takes what has
# been answered by then; a path still without a MAC is sent through
# bpf_redirect_neigh (the kernel resolves it) and the agent's neighbour
# task, whose first round runs as it starts, writes the MAC. Without the
# agent nothing would write it later.
NEIGH_WAIT_S = 1.5


def _neigh_wait(agent: bool) -> float:
    return 0.0 if agent else NEIGH_WAIT_S


def _apply(cfg, inst, nl, planes, mtu, digest, prior, neigh_wait: float = NEIGH_WAIT_S,
           preload: _Preload | None = None) -> str:
    state = dict(prior)
    state.update(overlay=cfg.overlay_device, config=cfg.source, config_digest=cfg.digest,
                 file_digest=cfg.file_digest,
                 netns=inst.netns, planes=sorted(set(state.get("planes", [])) | {p.device for p in cfg.planes}))
    state.setdefault("rp_filter", {})
    inst.write(state)     # from here on `down` can find and undo everything

    wanted = sorted({(p.plane.device, str(p.remote)) for peer in cfg.peers for p in peer.paths})
    hops = _step("resolving neighbours", nl.poke_neighbours, wanted)

    loaded = None
    # Only the programs attached somewhere outlive `up` (the kernel frees an
    # unattached one when the loader lets go), so a plane moving to the
    # other hook needs that program loaded again.
    hooks = {rt.plane.device: rx_hook_of(rt.plane, nl) for rt in planes}
    needed = _needed(hooks)
    if preload is not None and (preload.hooks, preload.digest) == (hooks, digest) and not prior.get("map_ids"):
        loaded = _step("loading BPF programs", preload.take)
        state.update(prog_ids=loaded.prog_ids, map_ids=loaded.map_ids, objects_digest=digest)
        inst.write(state)
    else:
        # The maps are sized for the config (more peers or paths than they
        # have room for: new maps, their entries carried over,
        # objects.load_objects).
        sizing = cfg.sizing()
        running = running_maps(prior)
        if prior.get("objects_digest") != digest or not programs_alive(prior) or \
                not needed <= set(prior.get("prog_ids", {})) or \
                resized(running, sizing, len(cfg.planes), cfg.flowlet_room()):
            loaded = _step("loading BPF programs", load_objects, running, sizing, len(cfg.planes), needed,
                           flowlets=cfg.flowlet_room())
            state.update(prog_ids=loaded.prog_ids, map_ids=loaded.map_ids, objects_digest=digest)
            inst.write(state)
        else:
            for m in running.values():
                m.close()

    # A changed overlay.address replaces the old one rather than joining it;
    # removed first, as deleting a primary address takes its secondaries.
    if nl.index(cfg.overlay_device) is not None:
        for a in nl.addresses(cfg.overlay_device):
            if a not in cfg.overlay_addresses:
                _step(f"removing the old overlay address {a}", nl.ipr.addr, "del",
                      index=nl.index(cfg.overlay_device), address=str(a.ip), prefixlen=a.network.prefixlen)
    _step("creating the overlay device", nl.create_overlay, cfg.overlay_device, mtu, cfg.overlay_addresses)
    overlay_ifindex = nl.index(cfg.overlay_device)
    # The spraying unit: smaller units, less reordering between planes,
    # unless the units cross every plane whole (config.spray_unit).
    _step("setting gso_max_size", nl.ipr.link, "set", index=overlay_ifindex,
          gso_max_size=cfg.spray_unit(whole_units=units_cross_whole(hooks, hops)))

    for rt in planes:
        key = f"net/ipv4/conf/{rt.plane.device}/rp_filter"
        if rt.plane.device not in state["rp_filter"]:
            state["rp_filter"][rt.plane.device] = topology.get_sysctl(key)
        # Decapsulated packets arrive on the plane with an overlay source that
        # routes via the overlay device: strict reverse-path filtering drops them.
        _step(f"setting rp_filter on {rt.plane.device}", topology.set_sysctl, key, "2")
    # A unit crosses a virtual link whole (a veth hands the skb over
    # unsegmented), and a peer whose plane decapsulates at tc ingress hands
    # it on whole: an inner UDP_SEGMENT unit then keeps its UDP-tunnel GSO
    # type and the receiving UDP socket drops it (only bpf-next can clear
    # that type, BPF_F_ADJ_ROOM_DECAP_L4_UDP). Without the feature on the
    # sending plane the kernel segments such units here, each wire packet
    # with the MRC header (numbered by IP ID, mrc.h MRC_F_IPID); TCP units
    # still leave whole. Restored at down.
    state.setdefault("udp_gso", {})
    for rt in planes:
        dev = rt.plane.device
        if dev not in state["udp_gso"] and topology.link_kind(dev) and \
                netdev.feature(dev, topology.UDP_GSO_FEATURE):
            state["udp_gso"][dev] = True
            inst.write(state)     # `down` must know what to restore
            _step(f"turning {topology.UDP_GSO_FEATURE} off on {dev}", netdev.set_feature,
                  dev, topology.UDP_GSO_FEATURE, False)
    # Inner IPv6 is delivered on the plane it arrived on (decap keeps the
    # device): a plane with IPv6 disabled would drop it. Restored at down.
    state.setdefault("disable_ipv6", {})
    if 6 in cfg.overlay_families():
        for rt in planes:
            key = f"net/ipv6/conf/{rt.plane.device}/disable_ipv6"
            if topology.get_sysctl(key) not in (None, "0"):
                state["disable_ipv6"].setdefault(rt.plane.device, topology.get_sysctl(key))
                _step(f"enabling IPv6 on {rt.plane.device}", topology.set_sysctl, key, "0")
    _tune_min_rtt(cfg, inst, state)
    inst.write(state)

    macs = _step("resolving neighbours", nl.resolve_neighbours, wanted, neigh_wait, hops)

    with Datapath(inst) as dp:
        _step("filling the maps", fill_maps, dp, cfg, planes, overlay_ifindex, macs)
        progs = {name: _step(f"opening {name}", dp.program, name) for name in sorted(needed)}
        try:
            state["rx_hooks"] = {}
            for rt in planes:
                hook = hooks[rt.plane.device]
                state["rx_hooks"][rt.plane.device] = hook
                inst.write(state)     # `down` must know which hook to undo
                if hook == "tc":
                    _attach_rx_tc(nl, rt.plane.device, progs[RX_TC_PROG].fd, state)
                else:
                    _attach_rx_xdp(nl, rt.plane.device, progs[RX_PROG].fd, state, prior)
            if nl.tc_egress_prog_id(cfg.overlay_device) != state["prog_ids"][TX_PROG]:
                _step(f"attaching tc egress to {cfg.overlay_device}", nl.attach_tc_egress,
                      cfg.overlay_device, progs[TX_PROG].fd, TX_PROG)
        finally:
            for p in progs.values():
                p.close()
        # the record names the programs that stay: the attached ones
        state["prog_ids"] = {k: v for k, v in state["prog_ids"].items() if k in needed}

    # Planes dropped from the config: detach our program, restore rp_filter.
    for dev in set(state["planes"]) - {p.device for p in cfg.planes}:
        _detach_plane(nl, dev, state)
    state["planes"] = [p.device for p in cfg.planes]

    # Each peer's overlay addresses and prefixes go through the overlay
    # device (tx then finds the peer by longest prefix, bpf/peer.h).
    routes = set(state.get("routes", []))
    want_routes = {str(net) for peer in cfg.peers for net in peer.owned()}
    failed = _step("adding routes", nl.routes_replace, sorted(want_routes), cfg.overlay_device, cfg.rto_min_ms)
    if failed:
        r, err = failed[0]
        raise StepError(f"adding route {r}", os.strerror(err) + (f" (and {len(failed) - 1} more)"
                                                                 if len(failed) > 1 else ""))
    for r in sorted(routes - want_routes):
        nl.route_delete(r, cfg.overlay_device)
    state["routes"] = sorted(want_routes)
    # every peer entry was written with epoch 0: the instance's new one
    members.note(state, cfg, {p.index: 0 for p in cfg.peers})
    state["mtu"] = mtu
    state["up_at"] = time.time()
    inst.write(state)
    if loaded is not None:
        loaded.close()    # the attachments hold the programs, the programs the maps
    unresolved = [f"{d}->{a}" for (d, a), m in macs.items() if m is None]
    note = f" ({len(unresolved)} neighbours unresolved, kernel resolves them)" if unresolved else ""
    n_paths = sum(len(p.paths) for p in cfg.peers)
    return (f"{cfg.overlay_device}: up, {cfg.overlay_address} mtu {mtu}, {len(cfg.planes)} planes, "
            f"{len(cfg.peers)} peers, {n_paths} paths{note}{few_evs_note(cfg, hops)}")


# EVs per plane that spread a peer behind gateways over a fabric's ECMP
# paths without the EV map: docs/fabric.md, "How many EVs" (8 and 16 alike
# there, 4 far less).
ROUTED_EVS = 8


def few_evs_note(cfg: cfgmod.Config, hops: dict) -> str:
    """With the EV map off, a hint for peers reached through a gateway (a
    routed plane: a leaf switch hashes each EV onto one of its uplinks) with
    fewer than ROUTED_EVS EVs per plane: a few EVs often share one uplink
    and leave another idle (scripts/bench_evs.py: one connection moved 0.61x
    the capacity with 4 EVs per plane, 0.72x with 8, 0.83x with 16; the EV
    map, on by default, spreads 4 evenly: 0.91x). hops: (plane device, peer
    address) -> (ifindex, next hop)."""
    if cfg.ev_map.mode != "off":
        return ""
    routed = {a for (_, a), (_, hop) in hops.items() if hop != a}
    few = [p for p in cfg.peers if p.evs_per_plane < ROUTED_EVS and any(str(x.remote) in routed for x in p.paths)]
    if not few:
        return ""
    who = f"peer {few[0].name}" if len(few) == 1 else f"{len(few)} peers ({few[0].name}, ...)"
    return (f"; note: {who} behind gateways with {few[0].evs_per_plane} EVs per plane: ECMP may hash one "
            f"connection's EVs onto few of the fabric's links (evs_per_plane, docs/fabric.md)")


MIN_RTT_WLEN = "net/ipv4/tcp_min_rtt_wlen"


def _tuning_here(inst: Instance) -> list[Instance]:
    """The other instances of this network namespace whose `up` set
    tcp_min_rtt_wlen (their records hold the value to restore)."""
    out = []
    for key in all_instances():
        ns, _, dev = key.partition("-")
        if ns == f"ns{inst.netns}" and dev != inst.overlay:
            other = Instance(dev, inst.netns)
            if "tcp_min_rtt_wlen" in other.read():
                out.append(other)
    return out


def _tune_min_rtt(cfg: cfgmod.Config, inst: Instance, state: dict) -> None:
    """net.ipv4.tcp_min_rtt_wlen as overlay.tcp_min_rtt_wlen says. The
    sysctl is the namespace's, for every TCP connection in it: the value
    found is recorded (the first instance's, where another one here set
    it already) and the last instance to go down puts it back."""
    if cfg.tcp_min_rtt_wlen is None:
        _untune_min_rtt(inst, state)
        return
    if "tcp_min_rtt_wlen" not in state:
        others = _tuning_here(inst)
        state["tcp_min_rtt_wlen"] = (others[0].read().get("tcp_min_rtt_wlen") if others
                                     else topology.get_sysctl(MIN_RTT_WLEN))
        inst.write(state)     # `down` must know what to restore
    _step("setting net.ipv4.tcp_min_rtt_wlen", topology.set_sysctl, MIN_RTT_WLEN,
          str(cfg.tcp_min_rtt_wlen), missing_ok=True)


def _untune_min_rtt(inst: Instance, state: dict) -> None:
    if "tcp_min_rtt_wlen" not in state:
        return
    found = state.pop("tcp_min_rtt_wlen")
    if found is not None and not _tuning_here(inst):
        with suppress(OSError):
            topology.set_sysctl(MIN_RTT_WLEN, found, missing_ok=True)


def _attach_rx_xdp(nl: topology.Netlink, dev: str, fd: int, state: dict, prior: dict) -> None:
    _detach_rx_tc(nl, dev, state)        # the plane may have had the other hook
    ours = {state["prog_ids"][RX_PROG], prior.get("prog_ids", {}).get(RX_PROG)}
    cur = nl.xdp_prog_id(dev)
    if cur == state["prog_ids"][RX_PROG]:
        return      # adopted: an attachment is never redone
    if cur and cur not in ours and prog_name(cur) != RX_PROG:
        raise StepError(f"attaching XDP to {dev}", f"another XDP program "
                        f"({prog_name(cur) or '?'}, id {cur}) is attached; mrc does not replace it")
    _step(f"attaching XDP to {dev}", nl.attach_xdp, dev, fd)


def _attach_rx_tc(nl: topology.Netlink, dev: str, fd: int, state: dict) -> None:
    """tc ingress in mrc's filter slot. Another XDP program on the plane
    (the fabric testbed's XDP_PASS on leaf ports, an operator's) stays: it
    runs before tc ingress and mrc's frames pass it."""
    _detach_rx_xdp(nl, dev, state)
    if nl.tc_ingress_prog_id(dev) != state["prog_ids"][RX_TC_PROG]:
        _step(f"attaching tc ingress to {dev}", nl.attach_tc_ingress, dev, fd, RX_TC_PROG)


def _detach_rx_xdp(nl: topology.Netlink, dev: str, state: dict) -> None:
    cur = nl.xdp_prog_id(dev)
    if cur and (cur == state.get("prog_ids", {}).get(RX_PROG) or prog_name(cur) == RX_PROG):
        nl.detach_xdp(dev)


def _detach_rx_tc(nl: topology.Netlink, dev: str, state: dict) -> None:
    cur = nl.tc_ingress_prog_id(dev)
    if cur and (cur == state.get("prog_ids", {}).get(RX_TC_PROG) or prog_name(cur) == RX_TC_PROG):
        nl.detach_tc_ingress(dev)


def _detach_plane(nl: topology.Netlink, dev: str, state: dict) -> None:
    _detach_rx_xdp(nl, dev, state)
    _detach_rx_tc(nl, dev, state)
    state.get("rx_hooks", {}).pop(dev, None)
    old = state.get("rp_filter", {}).pop(dev, None)
    if old is not None:
        with suppress(OSError):
            topology.set_sysctl(f"net/ipv4/conf/{dev}/rp_filter", old)
    old = state.get("disable_ipv6", {}).pop(dev, None)
    if old is not None:
        with suppress(OSError):
            topology.set_sysctl(f"net/ipv6/conf/{dev}/disable_ipv6", old)
    if state.get("udp_gso", {}).pop(dev, None):
        with suppress(Exception):     # the device may be gone
            netdev.set_feature(dev, topology.UDP_GSO_FEATURE, True)


def down(cfg: cfgmod.Config | None = None, overlay: str | None = None) -> str:
    """Remove everything `up` created; works on half-configured or crashed instances."""
    overlay = overlay or cfg.overlay_device
    with InstanceLock(Instance(overlay)):
        return _down(cfg, overlay)


def _down(cfg: cfgmod.Config | None, overlay: str) -> str:
    inst = Instance(overlay)
    state = inst.read()
    had_state = bool(state)
    removed = []
    supervisor.stop(state)
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
    _untune_min_rtt(inst, state)
    inst.remove()
    if not removed and not had_state:
        return f"{overlay}: nothing to remove"
    return f"{overlay}: down"

