"""The compiled BPF objects: where they are, loading them with shared maps,
and finding loaded programs again by id."""

from __future__ import annotations

import hashlib
import os
from contextlib import suppress
from pathlib import Path

from ..errors import MrcError, StepError
from . import abi
from .libbpf import BpfObject, LibbpfError, Map, Program

TX_PROG = "mrc_tx"
RX_PROG = "mrc_rx"
RX_TC_PROG = "mrc_rx_tc"     # the same receive steps at tc ingress (plane[].rx_hook)
MAP_NAMES = ("mrc_cfg", "mrc_peers", "mrc_slots", "mrc_paths", "mrc_live", "mrc_peer_seq",
             "mrc_path_stats", "mrc_drops", "mrc_peer_ip", "mrc_rx_peers", "mrc_events",
             "mrc_dedup", "mrc_hstats", "mrc_tx_flows",
             "mrc_rx_win", "mrc_reorder", "mrc_flowlets", "mrc_path_delay",
             "mrc_ovl_owner", "mrc_probe_nonce", "mrc_admin", "mrc_rx_epoch",
             "mrc_probe_rl", "mrc_auth", "mrc_acl", "mrc_path_mtu")   # issue 4: bpf/reorder.h, bpf/spray.h


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


class Loaded:
    """Freshly loaded programs and their shared maps (owned handles)."""

    def __init__(self, maps: dict[str, Map], tx: Program, rx: Program, rx_tc: Program):
        self.maps, self.tx, self.rx, self.rx_tc = maps, tx, rx, rx_tc

    @property
    def map_ids(self) -> dict[str, int]:
        return {name: m.id for name, m in self.maps.items()}

    @property
    def prog_ids(self) -> dict[str, int]:
        return {TX_PROG: self.tx.id, RX_PROG: self.rx.id, RX_TC_PROG: self.rx_tc.id}

    def close(self) -> None:
        for h in (*self.maps.values(), self.tx, self.rx, self.rx_tc):
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
    for path, names in zip(object_paths(), ((TX_PROG,), (RX_PROG, RX_TC_PROG))):
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
            progs += [Program.from_id(obj.program(n).id) for n in names]
        finally:
            obj.close()
    return Loaded(shared, *progs)


CTL_PROG = "mrc_ctl"


def load_ctl(maps: dict[str, Map]) -> Program:
    """Load the mrc_ctl program (bpf/ctl.bpf.c) onto running maps: how
    the agent changes state the datapath owns without writing it itself.
    Never attached: the caller's handle is the only one holding it."""
    path = bpf_dir() / "ctl.bpf.o"
    if not path.exists():
        raise MrcError(f"BPF object {path} is missing: build it with `make -C {path.parent}`")
    obj = BpfObject.open(str(path))
    try:
        for name, m in maps.items():
            if obj.map_def(name) is not None:
                obj.reuse_map(name, m.fd)
        try:
            obj.load()
        except LibbpfError as e:
            raise StepError(f"loading {path.name}", _load_error(e)) from None
        return Program.from_id(obj.program(CTL_PROG).id)
    finally:
        obj.close()


def ctl_retire(prog: Program, peer: int, path: int) -> bool:
    """GOOD -> ASSUMED_BAD by the datapath's compare-and-swap; False if the
    path was not GOOD (another writer got there first, or it is bad)."""
    req = abi.CtlReq(op=abi.CtlOp.RETIRE, peer=peer, path=path).pack()
    ret, _, _ = prog.test_run(req.ljust(64, b"\0"), out_size=128)
    if ret not in (XDP_PASS, XDP_DROP):
        raise MrcError(f"mrc_ctl refused retiring path {path} of peer {peer} (verdict {ret})")
    return ret == XDP_PASS


XDP_DROP, XDP_PASS = 1, 2


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
