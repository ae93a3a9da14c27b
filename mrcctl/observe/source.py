"""Where `top`, the exporter and the demo get their data: snapshots of one
instance with its maps kept open between samples, and the tail of its
events log."""

from __future__ import annotations

import json
import os
import time
from collections import deque
from pathlib import Path

from ..datapath.maps import Datapath
from ..errors import MrcError
from ..instance import config as cfgmod
from ..instance.events import events_path
from ..instance.state import Instance
from .snapshot import snapshot


class Source:
    """Snapshots of one instance, with its Datapath kept open between samples.

    `netns` is the inode of the instance's network namespace when the caller
    lives elsewhere (the demo reads a testbed host from the root namespace;
    map ids are global, so only the state-file lookup needs it).
    """

    def __init__(self, cfg: cfgmod.Config, netns: int | None = None):
        self.cfg = cfg
        self.inst = Instance(cfg.overlay_device) if netns is None else Instance(cfg.overlay_device, netns)
        self.events = EventTail(events_path(self.inst))
        self._dp = None
        self._retry_at = 0.0
        self._last_error = ""

    def snapshot(self) -> dict:
        if self._dp is None:
            now = time.monotonic()
            if now < self._retry_at:
                # reopening costs syscalls and file reads: at most once a second
                raise MrcError(self._last_error or f"{self.cfg.overlay_device}: not up (retrying)")
            self._retry_at = now + 1.0
            self._dp = Datapath(self.inst)
        try:
            snap = snapshot(self.cfg, self._dp)
            self._last_error = ""
            return snap
        except Exception as e:
            # `down`/`up` underneath us: reopen by the (new) state file next time
            self.close()
            self._last_error = str(e) if isinstance(e, MrcError) else \
                f"cannot read the snapshot: {type(e).__name__}: {e}"
            raise

    def close(self) -> None:
        if self._dp is not None:
            self._dp.close()
            self._dp = None


class EventTail:
    """Follows the instance's events.jsonl (written by the agent) incrementally.

    Keeps the most recent events parsed and a count of every line seen
    (the rotated previous file included), so each refresh costs one stat()
    when nothing happened. A missing file is simply "no events yet"; after a
    rotation (a new inode) reading starts at the new file's beginning and the
    count goes on.
    """

    def __init__(self, path: Path, keep: int = 50):
        self.path = Path(path)
        self.recent: deque[dict] = deque(maxlen=keep)
        self.count = 0
        self._ino = None
        self._off = 0
        self._partial = b""
        try:
            with open(self.path.with_suffix(".jsonl.1"), "rb") as f:
                self.count = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
        except OSError:
            pass

    def poll(self, max_bytes: int = 8 << 20) -> None:
        try:
            st = os.stat(self.path)
        except OSError:
            return
        if st.st_ino != self._ino or st.st_size < self._off:
            self._ino, self._off, self._partial = st.st_ino, 0, b""
        if st.st_size == self._off:
            return
        try:
            with open(self.path, "rb") as f:
                f.seek(self._off)
                data = f.read(max_bytes)
        except OSError:
            return
        self._off += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        self.count += len(lines)
        for line in lines[-self.recent.maxlen:]:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict):
                self.recent.append(ev)
