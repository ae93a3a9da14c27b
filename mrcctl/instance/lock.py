"""One `up`/`down` at a time per instance."""

from __future__ import annotations

import fcntl
import os
import time

from ..errors import MrcError
from .state import Instance

_depth: dict[str, tuple[int, int]] = {}


class InstanceLock:
    """One `up`/`down` at a time per instance (flock; re-entrant, because a
    failed fresh `up` calls `down` to roll back). Lives outside the instance
    directory, which `down` removes."""

    def __init__(self, inst: Instance, timeout: float = 60):
        self.inst, self.timeout = inst, timeout

    def __enter__(self):
        key = self.inst.key
        fd, depth = _depth.get(key, (-1, 0))
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
        _depth[key] = (fd, depth + 1)
        return self

    def __exit__(self, *exc):
        fd, depth = _depth[self.inst.key]
        if depth == 1:
            del _depth[self.inst.key]
            os.close(fd)        # releases the flock
        else:
            _depth[self.inst.key] = (fd, depth - 1)

