"""The instance's EV event log: every path state change, from the datapath
(relayed by the agent), the agent itself and the operator.

JSON lines in events.jsonl under the instance's run dir, rotated at
EVENTS_MAX_BYTES with one old file kept; `mrcctl events` reads it, `top`
and the exporter follow it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ..datapath import abi as wire
from . import config as cfgmod
from .state import Instance

EVENTS_FILE = "events.jsonl"
EVENTS_MAX_BYTES = 4 * 1024 * 1024


def events_path(inst: Instance) -> Path:
    return inst.run_dir / EVENTS_FILE


class EventLog:
    """Append-only JSON lines, one event per line, rotated by size."""

    def __init__(self, path: Path, max_bytes: int = EVENTS_MAX_BYTES):
        self.path = path
        self.max_bytes = max_bytes
        path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, rec: dict) -> None:
        line = json.dumps(rec, sort_keys=True) + "\n"
        try:
            if self.path.stat().st_size + len(line) > self.max_bytes:
                os.replace(self.path, self.path.with_suffix(".jsonl.1"))
        except FileNotFoundError:
            pass
        # O_APPEND: the CLI (deny/allow) and the agent may both write
        with open(self.path, "a") as f:
            f.write(line)


def event_record(cfg: cfgmod.Config, peer_idx: int, path_id: int, old: int, new: int,
                 reason: str, source: str, ts: float | None = None, age_us: int | None = None) -> dict:
    peer = cfg.peer_at(peer_idx)
    path = peer.paths[path_id] if peer is not None and path_id < len(peer.paths) else None
    rec = {
        "time": ts if ts is not None else time.time(),
        "peer": peer.name if peer else str(peer_idx),
        "path": path_id,
        "plane": path.plane.device if path else None,
        "ev": path.ev if path else None,
        "old": _state_name(old),
        "new": _state_name(new),
        "reason": reason,
        "source": source,
    }
    if age_us is not None:
        rec["age_us"] = age_us
    return rec


def _state_name(s: int) -> str:
    try:
        return wire.PathState(s).name
    except ValueError:
        return str(s)


def read_events(inst: Instance) -> list[dict]:
    out = []
    for p in (events_path(inst).with_suffix(".jsonl.1"), events_path(inst)):
        try:
            with open(p) as f:
                for line in f:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        continue   # a line cut by a crash
        except FileNotFoundError:
            continue
    return out


def format_event(e: dict) -> str:
    t = time.strftime("%H:%M:%S", time.localtime(e["time"])) + f".{int(e['time'] * 1000) % 1000:03d}"
    where = f"{e['peer']}/{e['path']}"
    if e.get("plane"):
        where += f" ({e['plane']} ev {e['ev']})"
    dead = e.get("reason") == wire.EvReason.DEAD.label
    extra = f"  evidence age {e['age_us'] / 1000:.1f} ms" if dead and "age_us" in e else ""
    return f"{t}  {where:<24} {e['old']:>11} -> {e['new']:<11} {e['reason']} [{e['source']}]{extra}"
