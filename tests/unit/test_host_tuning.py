"""net.ipv4.tcp_min_rtt_wlen, the one namespace-wide TCP setting `up`
changes (overlay.tcp_min_rtt_wlen): set by every instance that asks for
it, the value found first restored when the last of them goes down. Run
in a namespace of the test's own against its real sysctl, with the
instance records in a directory of the test's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# each step: (overlay device, "up" with overlay.tcp_min_rtt_wlen W (None:
# "keep") or "down"); prints the sysctl after it
STEPS = """
import json, sys, types
from mrcctl.instance import reconcile
from mrcctl.instance.state import Instance
for dev, op, w in json.loads(sys.argv[1]):
    inst = Instance(dev)
    state = inst.read()
    if op == "up":
        reconcile._tune_min_rtt(types.SimpleNamespace(tcp_min_rtt_wlen=w), inst, state)
        inst.write(state)
    else:
        reconcile._untune_min_rtt(inst, state)
        inst.remove()
    print(open("/proc/sys/net/ipv4/tcp_min_rtt_wlen").read().strip())
"""


@pytest.fixture
def ns(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    name = f"mrctune-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def run(ns: str, tmp: Path, steps: list) -> list[str]:
    cp = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", STEPS, json.dumps(steps)],
                        capture_output=True, text=True, cwd=REPO, timeout=60,
                        env=dict(os.environ, MRC_RUN_DIR=str(tmp / "run")))
    assert cp.returncode == 0, cp.stderr
    return cp.stdout.split()


def test_the_last_instance_down_restores_what_the_first_found(ns, tmp_path):
    # a namespace starts with the kernel's 300 s
    assert run(ns, tmp_path, [
        ("mrcA", "up", 0),        # sets it, records 300
        ("mrcB", "up", 0),        # finds 0 (A's), must record A's 300
        ("mrcA", "down", None),   # B still runs: stays 0
        ("mrcB", "down", None),   # the last: 300 again
    ]) == ["0", "0", "0", "300"]


def test_either_order_of_down_and_a_re_up_keep_the_first_value(ns, tmp_path):
    assert run(ns, tmp_path, [
        ("mrcA", "up", 0),
        ("mrcB", "up", 2),        # the last up's value holds
        ("mrcB", "down", None),
        ("mrcA", "up", 0),        # a re-up records nothing new
        ("mrcA", "down", None),
    ]) == ["0", "2", "2", "0", "300"]


def test_keep_leaves_the_host_value_and_a_switch_to_keep_restores_it(ns, tmp_path):
    assert run(ns, tmp_path, [
        ("mrcA", "up", None),     # "keep": untouched, nothing recorded
        ("mrcA", "up", 7),
        ("mrcA", "up", None),     # the config now says keep: put back
        ("mrcA", "down", None),
    ]) == ["300", "7", "300", "300"]
