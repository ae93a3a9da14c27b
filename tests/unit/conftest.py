"""Fixtures for the datapath unit tests.

bpf_objects: builds bpf/*.bpf.o once per session (make -C bpf).
bpffs:       a private bpffs mounted under /run/mrc-test for the session.
dp:          tx.bpf.o and rx.bpf.o loaded with one fresh pin root per test
             (so they share fresh maps), configured with one peer.
rx_hook:     xdp / tc: with it, dp.run_rx() runs mrc_rx or mrc_rx_tc.
veth:        a throwaway veth pair (a second real ifindex for XDP test_run).

The BPF tests need root (BPF_PROG_LOAD, mount); they skip otherwise.
Helpers and constants live in unit_dp.py, frame builders in unit_pkt.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from unit_dp import BPF_DIR, RX_HOOKS, Datapath, TX_OBJ, RX_OBJ, need_root  # noqa: E402


@pytest.fixture(scope="session")
def bpf_objects():
    need_root()
    if not shutil.which("clang"):
        pytest.skip("clang not installed")
    r = subprocess.run(["make", "-C", str(BPF_DIR)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"make -C bpf failed:\n{r.stdout}\n{r.stderr}")
    return TX_OBJ, RX_OBJ


@pytest.fixture(scope="session")
def bpffs():
    need_root()
    base = Path("/run/mrc-test")
    base.mkdir(parents=True, exist_ok=True)
    mnt = base / f"unit-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "bpf", "bpf", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        mnt.rmdir()
        pytest.skip(f"cannot mount bpffs: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        try:
            mnt.rmdir()
        except OSError:
            pass


@pytest.fixture(params=RX_HOOKS)
def rx_hook(request):
    """Runs a test once per receive program (XDP mrc_rx, tc mrc_rx_tc): a
    module of receive tests says `pytestmark = pytest.mark.usefixtures("rx_hook")`
    and its dp.run_rx() goes to that hook."""
    return request.param


@pytest.fixture
def dp(bpf_objects, bpffs, request):
    root = bpffs / f"t{uuid.uuid4().hex[:12]}"
    root.mkdir()
    d = Datapath(root)
    if "rx_hook" in request.fixturenames:
        d.rx_hook = request.getfixturevalue("rx_hook")
    d.configure()
    try:
        yield d
    finally:
        d.close()
        for f in root.iterdir():
            f.unlink()
        root.rmdir()


@pytest.fixture
def veth():
    """A throwaway veth pair in this netns (a second real ifindex for XDP
    test_run's ingress_ifindex). Yields the first end's ifindex."""
    need_root()
    name = f"mrcut{os.getpid() % 100000}"
    peer = name + "p"
    r = subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", peer],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot create veth: {r.stderr.strip()}")
    try:
        yield int(Path(f"/sys/class/net/{name}/ifindex").read_text())
    finally:
        subprocess.run(["ip", "link", "del", name], check=False)
