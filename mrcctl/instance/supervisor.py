"""The agent as a process: start it, tell whether it runs, stop it.

The agent is started by module name (`python -m mrcctl agent`), never
imported from here: the instance layer must not depend on the agent, which
depends on it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import suppress

from . import config as cfgmod
from .state import Instance


def spawn(cfg: cfgmod.Config) -> int:
    """Start `mrcctl agent` for this config in the background; returns its pid.

    It inherits this process's network namespace, which is the instance's.
    """
    logdir = Instance(cfg.overlay_device).run_dir
    logdir.mkdir(parents=True, exist_ok=True)
    logf = open(logdir / "agent.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "mrcctl", "agent", "-c", cfg.source],
                            stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                            start_new_session=True, close_fds=True, cwd="/")
    logf.close()
    return proc.pid


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"agent" in f.read()
    except OSError:
        return False


def ensure(cfg: cfgmod.Config, inst: Instance, restart: bool) -> None:
    state = inst.read()
    if alive(state.get("agent_pid")):
        if not restart:
            return
        stop(state)
    state["agent_pid"] = spawn(cfg)
    inst.write(state)


def stop(state: dict) -> None:
    pid = state.get("agent_pid")
    if not alive(pid):
        return
    with suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)
        # alive(), not kill(pid, 0): the agent's parent is gone, and until
        # init reaps it (over a second on some systems) it is a zombie.
        for _ in range(100):
            if not alive(pid):
                return
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)


