"""Where an instance keeps its state so later invocations find it.

An instance is one overlay device in one network namespace. Its record is a
JSON file under /run/mrc/instances/ns<netns inode>-<device>/: plain files on
the host's /run are visible to every `ip netns exec` invocation, whereas a
bpffs mounted by one such invocation lives only in that invocation's private
mount namespace. The record names the BPF programs and maps by their global
ids (see datapath.maps.Datapath), what `up` changed (sysctls, routes, planes) and
the agent's pid.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

RUN_DIR = Path(os.environ.get("MRC_RUN_DIR", "/run/mrc"))


def netns_id() -> int:
    """Inode of this process's network namespace: stable while it exists."""
    return os.stat("/proc/self/ns/net").st_ino


@dataclass
class Instance:
    overlay: str
    netns: int = field(default_factory=netns_id)

    @property
    def key(self) -> str:
        return f"ns{self.netns}-{self.overlay}"

    @property
    def run_dir(self) -> Path:
        return RUN_DIR / "instances" / self.key

    @property
    def state_file(self) -> Path:
        return self.run_dir / "state.json"

    def exists(self) -> bool:
        return self.state_file.exists()

    def read(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def write(self, state: dict) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        # one line: an indent makes json use its Python encoder, which took
        # tens of ms per write for the member records of 1,024 peers
        tmp.write_text(json.dumps(state, sort_keys=True))
        os.replace(tmp, self.state_file)

    def remove(self) -> None:
        shutil.rmtree(self.run_dir, ignore_errors=True)


def all_instances() -> list[str]:
    d = RUN_DIR / "instances"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


NETNS_DIR = Path("/run/netns")


def named_netns(ino: int) -> bool:
    """Is network namespace `ino` one that `ip netns` names (as far as this
    process's mount namespace shows /run/netns)?"""
    return ino in _inodes(NETNS_DIR.glob("*"))


def _inodes(paths) -> set[int]:
    out = set()
    for p in paths:
        try:
            out.add(p.stat().st_ino)
        except OSError:     # deleted while we looked
            pass
    return out


def live_netns() -> set[int]:
    """Inodes of every network namespace that still exists: named ones and
    those some process is in."""
    return _inodes(NETNS_DIR.glob("*")) | _inodes(Path("/proc").glob("[0-9]*/ns/net"))


def stale_instances() -> list[str]:
    """Records whose network namespace is gone: nothing of theirs exists any
    more (devices and programs went with the namespace), only the files."""
    live = live_netns()
    out = []
    for key in all_instances():
        ns, _, _dev = key.partition("-")
        if ns.startswith("ns") and ns[2:].isdigit() and int(ns[2:]) not in live:
            out.append(key)
    return out


def remove_stale() -> list[str]:
    """Delete the records stale_instances() names; returns their keys."""
    keys = stale_instances()
    for key in keys:
        shutil.rmtree(RUN_DIR / "instances" / key, ignore_errors=True)
    return keys
