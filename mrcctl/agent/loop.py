"""The long-running control-plane agent of one instance.

`mrcctl up` starts it in the background (`mrcctl agent -c FILE` runs it in
the foreground, for systemd); `mrcctl down` stops it. The datapath never
depends on it: forwarding and liveness judgement stay in the kernel, so a
crashed agent costs probes and events, not packets.

The agent is a single-threaded loop of periodic tasks. Subsystems register
with `Agent.add_task(name, period_s, fn)`; fn(now_monotonic) is called at
most once per period (or once per the seconds it returns, when it returns
a number: a task with nothing to watch waits longer) and its exceptions are
logged, never fatal. Readers
that want to sleep on a file descriptor (ring buffer, netlink) register with
`Agent.add_reader(fd, fn)`. A subsystem that keeps anything per peer
registers `Agent.on_peers(fn)`: when the peers change while the agent runs
(agent/members.py), fn(cfg, touched) is called with the new config and the
indices of the peers removed or added (a peer whose definition changed is
both): what it kept for those starts afresh, what it kept for the others
stays.
"""

from __future__ import annotations

import importlib
import logging
import os
import selectors
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Callable

from ..datapath import abi
from ..datapath.maps import Datapath
from ..errors import MrcError
from ..instance import config as cfgmod
from ..instance import reconcile
from ..instance.state import Instance, named_netns

log = logging.getLogger("mrc.agent")

ORPHAN_CHECK_S = 1.0


def _ifindex(dev: str) -> int:
    try:
        return socket.if_nametoindex(dev)
    except OSError:
        return 0


@dataclass
class Task:
    name: str
    period: float
    fn: Callable[[float], float | None]
    due: float = 0.0
    runs: int = 0
    errors: int = 0
    busy_s: float = field(default=0.0)


class Agent:
    def __init__(self, cfg: cfgmod.Config):
        self.cfg = cfg
        self.inst = Instance(cfg.overlay_device)
        self.dp = Datapath(self.inst)
        self.tasks: list[Task] = []
        self._peer_hooks: list[Callable[[cfgmod.Config, set[int]], None]] = []
        # what loading the config parsed, for the peers watcher's next load (agent/members.py)
        self.load_cache = cfgmod.LoadCache()
        self._entries: dict[int, tuple] = {}     # entries_of's cache, per peer: (token, entries, keys)
        # peers behind a gateway: peer index -> {plane ifindex: next hop};
        # written by the neighbours task, read by the EV map (agent/evmap.py)
        self.gateways: dict[int, dict[int, str]] = {}
        self.sel = selectors.DefaultSelector()
        self.stopping = False
        self.started = time.monotonic()
        self.orphaned = ""
        # A namespace `ip netns` named when we started and no longer does
        # was deleted: we are all that keeps it (and its devices) alive.
        self.named_ns = named_netns(self.inst.netns)
        self.add_task("orphan", ORPHAN_CHECK_S, self._check_orphan)

    # ------------------------------------------------------------ registration
    def add_task(self, name: str, period_s: float, fn: Callable[[float], float | None]) -> Task:
        t = Task(name, period_s, fn)
        self.tasks.append(t)
        return t

    def remove_task(self, t: Task) -> None:
        self.tasks.remove(t)

    def add_reader(self, fd: int, fn: Callable[[], None]) -> None:
        self.sel.register(fd, selectors.EVENT_READ, fn)

    def on_peers(self, fn: Callable[[cfgmod.Config, set[int]], None]) -> None:
        self._peer_hooks.append(fn)

    def set_peers(self, cfg: cfgmod.Config, touched: set[int]) -> None:
        """Work from `cfg`'s peers from now on (module docstring); the
        caller has applied them to the datapath."""
        self.cfg = cfg
        for i in touched:
            self._entries.pop(i, None)
        for fn in self._peer_hooks:
            fn(cfg, touched)

    def paths_end(self) -> int:
        """1 + the highest mrc_paths index of a configured path: how far a
        read of every path's entry must reach."""
        return max((self.dp.path_idx(p.index, 0) + len(p.paths) for p in self.cfg.peers), default=0)

    def path_entries(self):
        """(peer, path, key, mrc_paths entry) of every configured path the
        datapath holds, for the subsystems that copy or rewrite entries.
        An entry is unpacked again only when its bytes changed, so callers
        share it: they must not modify it (dataclasses.replace, then write)."""
        for peer, _token, ents, keys in self.peer_entries():
            for path in peer.paths:
                if path.id < len(ents):
                    yield peer, path, keys[path.id], ents[path.id]

    def peer_entries(self):
        """(peer, token, entries, keys) of every peer (entries_of)."""
        for peer in self.cfg.peers:
            yield (peer, *self.entries_of(peer))

    def entries_of(self, peer: cfgmod.Peer) -> tuple:
        """(token, entries, keys) of one peer: its mrc_paths entries, read in
        one system call and unpacked again only when their bytes changed
        (callers share them: they must not modify them), their map keys,
        and a token that stays equal while none of the entries changes, so
        a caller can skip a peer it has seen."""
        raws = self.dp.map("mrc_paths").lookup_range(self.dp.path_idx(peer.index, 0), len(peer.paths))
        # a hash of the peer's entries, not the bytes: kept for thousands
        # of peers
        token = hash(b"".join(raws))
        hit = self._entries.get(peer.index)
        if hit is None or hit[0] != token:
            keys = hit[2] if hit is not None else [self.dp.path_key(peer.index, p.id) for p in peer.paths]
            hit = self._entries[peer.index] = (token, [abi.Path.unpack(raw) for raw in raws], keys)
        return hit

    def _check_orphan(self, _now: float) -> None:
        """Exit when what the agent serves is gone without `down`: the
        overlay device was deleted (tear down the rest as `down` would) or
        the namespace was deleted (its devices go when we leave it)."""
        if self.named_ns and not named_netns(self.inst.netns):
            self.orphaned = "its network namespace was deleted"
        elif not _ifindex(self.cfg.overlay_device):
            self.orphaned = f"overlay device {self.cfg.overlay_device} was deleted"
        else:
            return
        log.warning("%s without `mrcctl down`: cleaning up and exiting", self.orphaned)
        self.stopping = True

    # ------------------------------------------------------------ the loop
    def stop(self, *_):
        self.stopping = True

    def run_due(self, now: float) -> None:
        """Run the tasks due at `now`; set when each is due next."""
        for t in list(self.tasks):      # a task may add or remove tasks (agent/members.py)
            if now >= t.due:
                t0 = time.monotonic()
                wait = None
                try:
                    wait = t.fn(now)
                except Exception:  # a task's bug must not stop probing
                    t.errors += 1
                    log.exception("task %s failed", t.name)
                t.runs += 1
                t.busy_s += time.monotonic() - t0
                t.due = now + (t.period if wait is None else wait)

    def run(self, duration: float | None = None) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        end = None if duration is None else time.monotonic() + duration
        while not self.stopping and (end is None or time.monotonic() < end):
            now = time.monotonic()
            self.run_due(now)
            due = min((t.due for t in self.tasks), default=now + 0.5)
            timeout = max(0.0, min(due - time.monotonic(), 0.5))
            for key, _ in self.sel.select(timeout):
                try:
                    key.data()
                except Exception:
                    log.exception("reader failed")
        self.close()

    def close(self) -> None:
        self.sel.close()
        self.dp.close()
        if self.orphaned:
            self._clean_up_orphan()

    def _clean_up_orphan(self) -> None:
        state = self.inst.read()
        if state.get("agent_pid") == os.getpid():
            state.pop("agent_pid")     # down() must not signal us
            self.inst.write(state)
        if self.named_ns and not named_netns(self.inst.netns):
            self.inst.remove()
            return
        try:
            reconcile.down(self.cfg)
        except Exception:
            log.exception("clean-up after %s failed", self.orphaned)


# Modules of this package that register agent subsystems with @subsystem
# when imported; their set-up runs in this order.
SUBSYSTEM_MODULES: list[str] = ["neighbours", "evmap", "metrics", "health", "weights", "members"]

# Subsystem set-up functions: each takes the Agent and registers tasks/readers.
_SUBSYSTEMS: list[Callable[[Agent], None]] = []


def build(cfg: cfgmod.Config, cache: cfgmod.LoadCache | None = None) -> Agent:
    """An agent with every subsystem registered. `cache`: what loading
    `cfg` parsed, for the peers watcher's next load."""
    for name in SUBSYSTEM_MODULES:
        importlib.import_module(f"{__package__}.{name}")
    agent = Agent(cfg)
    if cache is not None:
        agent.load_cache = cache
    try:
        for setup in _SUBSYSTEMS:
            setup(agent)
    except MrcError:
        if _ifindex(cfg.overlay_device):
            raise
        # deleted while we started: run() goes straight to the clean-up
        agent.orphaned = f"overlay device {cfg.overlay_device} was deleted"
        agent.stopping = True
    _release_startup_memory()
    return agent


def _release_startup_memory() -> None:
    """Give back to the system what reading the config and the maps took
    once: a 4,096-peer TOML document alone peaks at tens of MB, which the
    C allocator would otherwise keep for the agent's whole life."""
    import ctypes
    import gc
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):   # not glibc
        pass


def subsystem(fn: Callable[[Agent], None]) -> Callable[[Agent], None]:
    _SUBSYSTEMS.append(fn)
    return fn
