"""An agent whose instance disappears without `mrcctl down` (issue #13.6).

The overlay device deleted by hand: the agent notices, tears down what is
left (XDP on the planes, the record) as `down` would, and exits. Records of
namespaces that no longer exist are removed by the next `up` anywhere.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from lab import Lab

RUN = Path("/run/mrc/instances")


@pytest.fixture
def lab(tmp_path):
    with Lab(tmp_path, 2, 2, prefix=f"or{os.getpid() % 1000}", evs=2) as lab:
        yield lab


def record(lab: Lab, i: int) -> Path:
    return RUN / f"ns{os.stat(f'/run/netns/{lab.tb.ns(i)}').st_ino}-mrc0"


def wait_gone(pid: int, path: Path, timeout: float = 8.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not os.path.exists(f"/proc/{pid}") and not path.exists():
            return True
        time.sleep(0.1)
    return False


def test_overlay_device_deleted_by_hand(lab):
    lab.up([0])
    rec = record(lab, 0)
    pid = json.loads((rec / "state.json").read_text())["agent_pid"]
    assert os.path.exists(f"/proc/{pid}")
    lab.tb.exec(0, ["ip", "link", "del", "mrc0"])
    assert wait_gone(pid, rec), "agent still running or record left after mrc0 was deleted"
    for dev in lab.tb.planes(0, 1):
        link = lab.tb.exec(0, ["ip", "-j", "link", "show", "dev", dev]).stdout
        assert "xdp" not in json.loads(link)[0], f"XDP left on {dev}"
    # and the instance can simply be brought up again
    lab.up([0])
    assert lab.status(0)["peers"]


def test_up_removes_records_of_deleted_namespaces(lab):
    ghost = RUN / "ns4026599999-mrc0"       # no such namespace
    ghost.mkdir(parents=True, exist_ok=True)
    (ghost / "state.json").write_text(json.dumps({"agent_pid": 0}))
    try:
        out = lab.mrcctl(0, "up").stdout
        assert not ghost.exists()
        assert "ns4026599999-mrc0" in out and "stale" in out
    finally:
        if ghost.exists():
            (ghost / "state.json").unlink()
            ghost.rmdir()
