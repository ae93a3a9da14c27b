"""The compiled BPF objects: where they are, loading them with shared maps,
and finding loaded programs again by id."""

from __future__ import annotations

import hashlib
import os
import threading
from contextlib import suppress
from pathlib import Path

from ..errors import MrcError, StepError
from . import abi
from . import libbpf
from .libbpf import BpfObject, LibbpfError, Map, Program

TX_PROG = "mrc_tx"
RX_PROG = "mrc_rx"
RX_TC_PROG = "mrc_rx_tc"     # the same receive steps at tc ingress (plane[].rx_hook)
MAP_NAMES = ("mrc_cfg", "mrc_peers", "mrc_slots", "mrc_paths", "mrc_live", "mrc_peer_seq",
             "mrc_path_stats", "mrc_drops", "mrc_peer_ip", "mrc_rx_peers", "mrc_events",
             "mrc_dedup", "mrc_hstats", "mrc_tx_flows", "mrc_rx_flows",
             "mrc_rx_win", "mrc_reorder", "mrc_flowlets", "mrc_path_delay",
             "mrc_ovl_owner", "mrc_probe_nonce", "mrc_admin", "mrc_rx_epoch",
             "mrc_probe_rl", "mrc_auth", "mrc_acl", "mrc_path_mtu", "mrc_path_cnt",
             "mrc_path_cong", "mrc_path_seq")   # issue 4: bpf/reorder.h, bpf/spray.h


# Maps sized by the sizing (struct mrc_sizing), and how: one entry per peer
# index, per (peer, path) index, or a multiple of the peers. Every other map
# keeps the size its definition compiles in. The definitions in bpf/*.h use
# the same formulas at the compiled default (tests/unit/test_wire.py).
PER_PEER = ("mrc_peers", "mrc_peer_seq", "mrc_tx_flows", "mrc_rx_flows", "mrc_rx_win", "mrc_reorder", "mrc_dedup",
            "mrc_rx_epoch", "mrc_auth")
PER_PATH = ("mrc_paths", "mrc_live", "mrc_admin", "mrc_path_stats", "mrc_path_cnt", "mrc_path_delay",
            "mrc_probe_nonce", "mrc_path_mtu", "mrc_path_cong", "mrc_path_seq")
# array maps indexed peer * k + i: their entries follow their peer when
# the peer capacity changes (carry_resized)
PEER_MULTIPLE = {"mrc_slots": 2, "mrc_probe_rl": abi.MRC_MAX_PLANES}


def map_entries(sizing: abi.Sizing, planes: int = abi.MRC_MAX_PLANES, flowlets: int | None = None) -> dict[str, int]:
    """max_entries of every sized map. `planes`: the configured planes,
    which bound the (plane, source) -> peer entries of mrc_rx_peers;
    `flowlets`: room in the flowlet cache (None: as compiled)."""
    out = {name: sizing.peers for name in PER_PEER}
    out.update({name: sizing.path_entries for name in PER_PATH})
    out.update({name: sizing.peers * k for name, k in PEER_MULTIPLE.items()})
    # (plane, source) entries: every configured plane's, and room for all
    # MRC_MAX_PLANES while that is cheap (up to 16,384 entries, 1.5 MiB),
    # so that adding a plane needs no new map
    out["mrc_rx_peers"] = max(sizing.peers * max(1, planes),
                              min(sizing.peers * abi.MRC_MAX_PLANES, 16384))
    # overlay addresses and prefixes: up to MRC_OVL_PER_PEER per peer (and as
    # many served here, in mrc_ovl_owner)
    out["mrc_peer_ip"] = sizing.peers * abi.MRC_OVL_PER_PEER
    out["mrc_ovl_owner"] = sizing.peers * abi.MRC_OVL_PER_PEER + abi.MRC_OVL_PER_PEER
    # a hash the kernel gives a power of two of buckets: sized just past
    # one (the default headroom over 4,096 x 32) it cost 2 MiB more; it
    # holds only the paths being probed, and the agent copes with a full
    # one, so room for all but a few percent of the paths is room enough
    n = sizing.path_entries
    floor = 1 << (n.bit_length() - 1)
    out["mrc_probe_nonce"] = floor if floor >= n - n // 16 else n
    if flowlets:
        out["mrc_flowlets"] = flowlets
    return out


def sizing_of(maps: dict[str, Map]) -> abi.Sizing:
    """The sizing of a running datapath, from its maps' sizes."""
    return abi.Sizing.of_maps(maps["mrc_peers"].max_entries, maps["mrc_paths"].max_entries)


def resized(maps: dict[str, Map], sizing: abi.Sizing, planes: int, flowlets: int | None = None) -> bool:
    """Would these running maps be sized otherwise for this sizing?"""
    want = map_entries(sizing, planes, flowlets)
    return any(m.max_entries != want[name] for name, m in maps.items() if name in want)


SIZING_SECTION = ".rodata.sizing"


def _apply_sizing(obj: BpfObject, sizing: abi.Sizing, entries: dict[str, int] | None) -> None:
    if not obj.set_section(SIZING_SECTION, sizing.pack()):
        raise MrcError(f"BPF object {obj.path} has no {SIZING_SECTION}: rebuild it with `make -C bpf`")
    for name, n in (entries or {}).items():
        if obj.map_def(name) is not None:
            obj.set_max_entries(name, n)


def bpf_dir() -> Path:
    env = os.environ.get("MRC_BPF_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "bpf"


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


# which object holds which programs (object_paths() order)
OBJECT_PROGS = ((TX_PROG,), (RX_PROG, RX_TC_PROG))
ALL_PROGS = frozenset(n for names in OBJECT_PROGS for n in names)


class Loaded:
    """Freshly loaded programs and their shared maps (owned handles).
    `progs`: the programs that were loaded, by name; one left out (the
    receive hook no plane uses) is None as an attribute."""

    def __init__(self, maps: dict[str, Map], progs: dict[str, Program]):
        self.maps, self.progs = maps, progs

    @property
    def tx(self) -> Program | None:
        return self.progs.get(TX_PROG)

    @property
    def rx(self) -> Program | None:
        return self.progs.get(RX_PROG)

    @property
    def rx_tc(self) -> Program | None:
        return self.progs.get(RX_TC_PROG)

    @property
    def map_ids(self) -> dict[str, int]:
        return {name: m.id for name, m in self.maps.items()}

    @property
    def prog_ids(self) -> dict[str, int]:
        return {name: p.id for name, p in self.progs.items()}

    def close(self) -> None:
        for h in (*self.maps.values(), *self.progs.values()):
            h.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def load_objects(reuse: dict[str, Map] | None = None, sizing: abi.Sizing | None = None,
                 planes: int = abi.MRC_MAX_PLANES, programs=None,
                 verifying: threading.Event | None = None, flowlets: int | None = None) -> Loaded:
    """Load tx.bpf.o and rx.bpf.o so they share one set of maps, sized for
    `sizing` (default: as compiled) and `planes` planes; of their programs
    only those in `programs` (default: all).

    Verifying is most of `up`'s time (each receive program >100k
    instructions): a program no plane attaches is not loaded at all, and
    the objects are verified at the same time, one thread each (the
    kernel verifies both at once on two CPUs; libbpf's calls release the
    GIL). For that the shared maps exist first: missing ones are created
    by a load of tx.bpf.o with no program in it.

    The maps are `reuse`'s where it supplies them (the running instance's,
    so counters, PSNs and states survive a reload). A running map whose
    layout or size the new objects changed (an upgrade, more peers or
    paths) is replaced by a fresh one: libbpf would adopt the old sizes and
    the verifier reject the new programs, or the programs index past the
    old map's end. The entries of a map that only changed size move to the
    new one (carry_resized), so peers that stay keep their state.

    `verifying` is set when the programs are handed to the kernel: from
    then on this call holds no GIL until they are verified.
    """
    sizing = sizing or abi.DEFAULT_SIZING
    programs = ALL_PROGS if programs is None else frozenset(programs)
    if not programs <= ALL_PROGS:
        raise MrcError(f"no such BPF program: {', '.join(sorted(programs - ALL_PROGS))}")
    entries = map_entries(sizing, planes, flowlets)
    shared: dict[str, Map] = dict(reuse or {})
    resized: dict[str, Map] = {}
    old_sizing = sizing_of(shared) if {"mrc_peers", "mrc_paths"} <= shared.keys() else None
    opened: list[tuple[Path, BpfObject, tuple[str, ...]]] = []
    progs: dict[str, Program] = {}

    def opened_object(path: Path, keep: tuple[str, ...], all_names: tuple[str, ...]) -> BpfObject:
        obj = BpfObject.open(str(path))
        try:
            _apply_sizing(obj, sizing, entries)
            for n in all_names:
                # (an object without it, e.g. one built before it existed,
                # fails only if it is needed: obj.program() below)
                if n not in keep and obj.has_program(n):
                    obj.set_autoload(n, False)
        except BaseException:
            obj.close()
            raise
        return obj

    def load(path: Path, obj: BpfObject) -> None:
        try:
            obj.load()
        except LibbpfError as e:
            raise StepError(f"loading {path.name}", _load_error(e)) from None

    try:
        for path, names in zip(object_paths(), OBJECT_PROGS):
            keep = tuple(n for n in names if n in programs)
            if keep:
                opened.append((path, opened_object(path, keep, names), keep))
        tx_path = object_paths()[0]
        # the first object's definitions decide which running maps stay
        # (every object declares every shared map, bpf/maps.h)
        with opened_object(tx_path, (), OBJECT_PROGS[0]) as maker:
            for name in [n for n, m in shared.items() if maker.map_def(n) != m.definition]:
                old = shared.pop(name)
                want = maker.map_def(name)
                # same type, key, value and flags: only max_entries may differ
                if (want is not None and want[:3] == old.definition[:3] and want[4:] == old.definition[4:]
                        and old_sizing is not None):
                    resized[name] = old
                else:
                    old.close()
            if any(n not in shared for n in MAP_NAMES):
                for name, m in shared.items():
                    maker.reuse_map(name, m.fd)
                load(tx_path, maker)        # maps only: no program to verify
                for name in MAP_NAMES:
                    if name not in shared:
                        shared[name] = Map.from_id(maker.map(name).id)
        for _path, obj, _keep in opened:
            for name, m in shared.items():
                if obj.map_def(name) is not None:
                    obj.reuse_map(name, m.fd)
        errors: list[BaseException] = []

        def run(path: Path, obj: BpfObject) -> None:
            try:
                load(path, obj)
            except BaseException as e:  # noqa: BLE001 - raised by the caller
                errors.append(e)
        threads = [threading.Thread(target=run, args=(p, o), name=f"load {p.name}") for p, o, _ in opened[1:]]
        for t in threads:
            t.start()
        if verifying is not None:
            verifying.set()
        try:
            if opened:
                run(opened[0][0], opened[0][1])
        finally:
            for t in threads:
                t.join()
        if errors:
            raise errors[0]
        for _path, obj, keep in opened:
            for n in keep:
                progs[n] = Program.from_id(obj.program(n).id)
        for name, old in resized.items():
            carry_resized(name, old, shared[name], old_sizing, sizing)
    except BaseException:
        for h in (*progs.values(), *(m for n, m in shared.items() if (reuse or {}).get(n) is not m)):
            h.close()
        raise
    finally:
        for _path, obj, _keep in opened:
            obj.close()
        for old in resized.values():
            old.close()
    return Loaded(shared, progs)


def carry_resized(name: str, old: Map, new: Map, old_sz: abi.Sizing, new_sz: abi.Sizing) -> None:
    """Copy a resized array map's entries to where the new sizing puts
    them: per-peer entries stay at their peer index, per-path ones move to
    (peer, path) under the new stride; what no longer fits is dropped (the
    config has fewer peers or paths, and `up` fills what it has). Hash maps
    are the loader's to refill, the flowlet cache starts empty."""
    if old.map_type not in (libbpf.BPF_MAP_TYPE_ARRAY, libbpf.BPF_MAP_TYPE_PERCPU_ARRAY):
        return
    peers = min(old_sz.peers, new_sz.peers)
    if name in PER_PATH:
        stride = min(old_sz.stride, new_sz.stride)
        vals = old.read_range(0, old.max_entries)
        keys, out = [], []
        for peer in range(peers):
            base = peer << old_sz.path_shift
            for pid in range(stride):
                v = vals[base + pid]
                if any(v):
                    keys.append(abi.u32(new_sz.path_idx(peer, pid)))
                    out.append(v)
    else:
        k = PEER_MULTIPLE.get(name, 1)
        vals = old.read_range(0, min(old.max_entries, peers * k))
        keys = [abi.u32(i) for i, v in enumerate(vals) if any(v)]
        out = [v for v in vals if any(v)]
    new.update_batch(keys, out)


CTL_PROG = "mrc_ctl"


def _load_on_maps(file: str, maps: dict[str, Map], take):
    """Load bpf/<file> onto the running maps it shares with them and return
    take(obj) (the handles the caller keeps) before the object closes."""
    path = bpf_dir() / file
    if not path.exists():
        raise MrcError(f"BPF object {path} is missing: build it with `make -C {path.parent}`")
    obj = BpfObject.open(str(path))
    try:
        _apply_sizing(obj, sizing_of(maps), None)
        for name, m in maps.items():
            if obj.map_def(name) is not None:
                obj.reuse_map(name, m.fd)
        try:
            obj.load()
        except LibbpfError as e:
            raise StepError(f"loading {path.name}", _load_error(e)) from None
        return take(obj)
    finally:
        obj.close()


def load_ctl(maps: dict[str, Map]) -> Program:
    """Load the mrc_ctl program (bpf/ctl.bpf.c) onto running maps: how
    the agent changes state the datapath owns without writing it itself.
    Never attached: the caller's handle is the only one holding it."""
    return _load_on_maps("ctl.bpf.o", maps, lambda obj: Program.from_id(obj.program(CTL_PROG).id))


def ctl_retire(prog: Program, peer: int, path: int) -> bool:
    """GOOD -> ASSUMED_BAD by the datapath's compare-and-swap; False if the
    path was not GOOD (another writer got there first, or it is bad)."""
    req = abi.CtlReq(op=abi.CtlOp.RETIRE, peer=peer, path=path).pack()
    ret, _, _ = prog.test_run(req.ljust(64, b"\0"), out_size=128)
    if ret not in (XDP_PASS, XDP_DROP):
        raise MrcError(f"mrc_ctl refused retiring path {path} of peer {peer} (verdict {ret})")
    return ret == XDP_PASS


XDP_DROP, XDP_PASS = 1, 2
XDP_REDIRECT = 4

PROBE_GEN_PROG = "mrc_probe_gen"


def load_probe_gen(maps: dict[str, Map]) -> tuple[Program, Map]:
    """Load the probe generator (bpf/probe_gen.bpf.c) with the running
    instance's mrc_auth (it signs probes with the peers' keys): its
    program and its own mrc_probe_out, which the agent fills before each
    run. Never attached."""
    return _load_on_maps("probe_gen.bpf.o", maps, lambda obj: (
        Program.from_id(obj.program(PROBE_GEN_PROG).id), Map.from_id(obj.map("mrc_probe_out").id)))


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


def running_maps(prior: dict) -> dict[str, Map]:
    """The maps a state record names that still exist under those names."""
    found = {}
    for name, mid in prior.get("map_ids", {}).items():
        with suppress(OSError):
            m = Map.from_id(mid)
            if m.name == name:
                found[name] = m
            else:
                m.close()
    return found


def programs_alive(state: dict) -> bool:
    for pid in state.get("prog_ids", {}).values():
        try:
            Program.from_id(pid).close()
        except OSError:
            return False
    return bool(state.get("prog_ids"))


def prog_name(prog_id: int) -> str | None:
    try:
        with Program.from_id(prog_id) as p:
            return p.name
    except OSError:
        return None
