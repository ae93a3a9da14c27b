"""Agent subsystem: the peers dir, watched and applied.

When the config has a [peers] dir, the agent watches it (inotify through
ctypes: no cost at all while nothing changes; where inotify is missing, a
look at the directory every POLL_S) and applies what changed to the running
instance with instance/members.apply: a file added is a peer added, a file
removed a peer removed, an edited one re-added. The agent is the applier
while it runs because it owns mrc_paths and the slot tables (bpf/mrc.h);
`mrcctl peer add/remove` write the file and wait for the record to show it.

After a change every subsystem follows the new peer list in place
(Agent.set_peers): what it kept for the peers removed or added starts
afresh, what it kept for the others (probe records, learned weights, next
hops) stays, and the agent never stops probing or judging. Should a
subsystem fail to follow, the agent starts itself again on the new list
(exec, same pid), as a start would. The datapath forwards throughout,
and the other peers' maps are not touched. The files are read again after
every change, but only those whose bytes changed are parsed again
(config.LoadCache). A file that does not validate
is logged and recorded (`peer list` shows it); nothing of it is applied.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import sys
import time

from ..errors import MrcError
from ..instance import config as cfgmod
from ..instance import members
from . import loop as agentmod

log = logging.getLogger("mrc.members")

POLL_S = 1.0
# inotify(7)
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF = 0x400, 0x800
WATCH_MASK = (IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_ATTRIB
              | IN_DELETE_SELF | IN_MOVE_SELF)
# a burst of events (a ConfigMap update swaps a symlink and deletes a
# directory) is read to its end before the directory is
SETTLE_S = 0.005


def _inotify(path: str) -> int | None:
    """An inotify descriptor watching `path`, or None where there is none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            return None
        if libc.inotify_add_watch(fd, os.fsencode(path), WATCH_MASK) < 0:
            os.close(fd)
            return None
        return fd
    except (AttributeError, OSError):
        return None


def _signature(d: str):
    """What a poll compares: names, sizes and times of the peer files."""
    out = []
    try:
        for e in os.scandir(d):
            st = e.stat()
            out.append((e.name, st.st_size, st.st_mtime_ns, st.st_ino))
    except OSError:
        return None
    return sorted(out)


def _outside_peers(cfg: cfgmod.Config) -> cfgmod.Config:
    return dataclasses.replace(cfg, peers=(), digest="", file_digest="", source="", peer_errors=())


class Watcher:
    def __init__(self, agent: agentmod.Agent):
        self.agent = agent
        cfg = agent.cfg
        self.dir = str(cfgmod.peers_dir_path(cfg))
        self.fd = _inotify(self.dir)
        self.sig = _signature(self.dir)
        self.warned = ""
        self.cache = agent.load_cache
        if self.fd is not None:
            agent.add_reader(self.fd, self._on_event)
        else:
            log.info("no inotify for %s: looking every %g s", self.dir, POLL_S)
            agent.add_task("peers-poll", POLL_S, self._poll)
        self.check()       # what changed while no agent looked

    def _drain(self) -> None:
        while True:
            try:
                if not os.read(self.fd, 65536):
                    return
            except BlockingIOError:
                return

    def _on_event(self) -> None:
        self._drain()
        time.sleep(SETTLE_S)
        self._drain()
        self.check()

    def _poll(self, _now: float) -> None:
        sig = _signature(self.dir)
        if sig != self.sig:
            self.sig = sig
            self.check()

    def check(self) -> None:
        """Load the config again; apply what changed among the peers."""
        agent = self.agent
        # the files as this agent loaded them, and the instance runs them:
        # nothing to do (at its start after a change, which it applied
        # itself), and no parse of thousands of peer files to find that out
        rec = members.record_of(agent.inst.read())
        if cfgmod.digest_on_disk(agent.cfg) == agent.cfg.digest == rec.get("digest"):
            return
        try:
            new = cfgmod.load(agent.cfg.source, cache=self.cache)
        except cfgmod.ConfigError as e:
            msg = str(e)
            log.error("peers not applied: %s", msg)
            members.note_error(agent.inst, msg)
            return
        if _outside_peers(new) != _outside_peers(agent.cfg) and self.warned != new.file_digest:
            self.warned = new.file_digest
            log.warning("%s changed beyond its peers: only the peers are applied live, "
                        "run `mrcctl up` for the rest", agent.cfg.source)
        new = _with_running_settings(agent.cfg, new)
        before = members.record_of(agent.inst.read())["peers"].keys()
        try:
            change, took = members.apply(new)
        except MrcError as e:
            log.error("peers not applied: %s", e)
            members.note_error(agent.inst, str(e))
            # peers applied before the one that failed stay: work from them
            if members.record_of(agent.inst.read())["peers"].keys() != before:
                self.restart()
            return
        new = change.cfg or members.bind(new)
        touched = _touched(agent.cfg, new, change)
        if not change and not touched and {p.name for p in new.peers} == {p.name for p in agent.cfg.peers}:
            agent.cfg = dataclasses.replace(agent.cfg, digest=new.digest, file_digest=new.file_digest)
            return
        t0 = time.monotonic()
        try:
            agent.set_peers(new, touched)
        except Exception:
            log.exception("peers: %s in %.1f ms; the agent could not follow them in place: "
                          "starting it again on them", change.describe(), took * 1000)
            self.restart()
        log.info("peers: %s in %.1f ms; the agent follows them in %.1f ms", change.describe(), took * 1000,
                 (time.monotonic() - t0) * 1000)

    def restart(self) -> None:
        for h in logging.getLogger().handlers:
            h.flush()
        agent = self.agent
        agent.sel.close()
        agent.dp.close()
        os.execv(sys.executable, sys.orig_argv)


def _touched(old: cfgmod.Config, new: cfgmod.Config, change: members.Change) -> set[int]:
    """Indices whose peer is not the same before and after: removed,
    added, or (should the record and the agent disagree) moved."""
    out = {i for _ov, i, _n in change.removed} | {p.index for p in change.added}
    before = {p.overlay: p.index for p in old.peers}
    after = {p.overlay: p.index for p in new.peers}
    for ov, i in before.items():
        if after.get(ov) != i:
            out.add(i)
    for ov, i in after.items():
        if before.get(ov) != i:
            out.add(i)
    return out


def _with_running_settings(running: cfgmod.Config, new: cfgmod.Config) -> cfgmod.Config:
    """The new peers with everything else as it runs: a change to the rest of
    the file waits for `up`."""
    return dataclasses.replace(running, peers=new.peers, digest=new.digest, file_digest=new.file_digest)


@agentmod.subsystem
def setup(agent: agentmod.Agent) -> None:
    if agent.cfg.peers_dir is not None:
        agent.members = Watcher(agent)
