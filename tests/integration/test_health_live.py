"""Path health under a busy host, end to end (issue #11.3): no fault at all,
one CPU-bound TCP transfer over 4 unshaped direct planes while
`mrcctl status --json` runs 4 times a second on the sender (what `mrcctl top`
does) and a CPU-bound neighbour runs beside them. This host's CPU delays
the evidence of every path: a common-mode delay, not a path failure, so no
path may be retired."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from lab import UDPSEQ, XFER, Lab

PLANES = 4
# 8 EVs per plane: 32 paths share the reverse stream's echoes, so each path
# hears back seldom - on main before the measured threshold this retired
# healthy paths in 3 of 4 runs (with 4 EVs: 1 of 3)
EVS_TOP = 8
# a CPU-bound loop that ends itself after 15 s
HOG = "import time\nend = time.monotonic() + 15\nwhile time.monotonic() < end:\n    pass\n"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    # default [health] (dead_after 20 ms): what a new user runs
    with Lab(tmp_path_factory.mktemp("health"), 2, PLANES, prefix="hl1", evs=EVS_TOP) as lab:
        lab.up()
        yield lab


def test_cpu_bound_transfer_with_top_retires_nothing(lab):
    recv = lab.start_receiver(1, 5301, timeout=30)
    # unpaced, as much as the CPUs carry; longer than the observation
    send = lab.tb.popen(0, [sys.executable, XFER, "send", "--to", lab.overlay(1), "--port", "5301",
                            "--bytes", "64M", "--repeat", "400", "--seed", "3", "--timeout", "30"],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stop = threading.Event()
    polls = []

    def top(i):
        while not stop.is_set():
            t = time.monotonic()
            lab.mrcctl(i, "status", "--json", check=False)
            polls.append(t)
            stop.wait(max(0.0, 0.25 - (time.monotonic() - t)))

    # and a neighbour that wants a whole CPU (another job on the host),
    # bounded: beside it the evidence of random paths came 30+ ms late, and
    # a path's own decaying peak retired one in 1 run of 4 (bpf/judge.h,
    # judge_cov_peak)
    hog = subprocess.Popen([sys.executable, "-c", HOG])
    try:
        time.sleep(1.0)                     # connected, window open
        t0 = time.time()
        tx0 = sum(p["tx_packets"] for p in lab.paths(0))
        pollers = [threading.Thread(target=top, args=(0,), daemon=True)]
        for p in pollers:
            p.start()
        time.sleep(8.0)
        stop.set()
        for p in pollers:
            p.join(10)
        tx1 = sum(p["tx_packets"] for p in lab.paths(0))
        assert send.poll() is None, "the transfer ended before the observation did"
    finally:
        hog.kill()
        hog.wait(10)
        for p in (send, recv):
            if p.poll() is None:
                p.kill()
            p.communicate(timeout=10)
    # top really ran, back to back: each call takes 0.3-0.6 s of CPU on a
    # 2-core VM under this load (CI's clean runs made 14 calls in 8 s)
    assert len(polls) >= 8
    assert tx1 - tx0 > 100_000              # the transfer really ran (wire packets)
    dead = [e for e in lab.events(0, t0) + lab.events(1, t0) if e["new"] == "ASSUMED_BAD"]
    assert dead == [], f"{len(dead)} healthy paths retired: {dead[:4]}"
    assert all(p["state"] == "GOOD" for i in (0, 1) for p in lab.paths(i))


# ------------------------------------------------------------------ one-way UDP (issue #11.4)

UDP_MBIT, UDP_SIZE, UDP_SECS, FAULT_AT = 400, 1400, 3.0, 1.2


@pytest.fixture
def oneway(tmp_path):
    # 4 x 500 Mbit/s planes; feedback frames come from the tc receive hook
    extra = "[health]\ndead_after_ms = 4\n"
    with Lab(tmp_path, 2, PLANES, rates="500mbit", prefix="hl2", evs=1, rx_hook="tc",
             extra=extra) as lab:
        lab.up()
        yield lab


def test_one_way_udp_failover_loses_little(oneway):
    """One-way UDP at 400 Mbit/s over 4 x 500 Mbit/s planes, no reverse
    data at all; one plane blackholed both ways mid-stream. The receiver's
    feedback frames give the sender's judge evidence of every path, so the
    dead plane is retired by the datapath within a few ms: the datagrams
    lost (sequence numbers in the payload) are at most ~10 ms of that
    plane's share."""
    lab = oneway
    ready = lab.tmp / "udp-ready"
    recv = lab.tb.popen(1, [sys.executable, UDPSEQ, "recv", lab.overlay(1), "5400",
                            str(UDP_SECS + 3), str(ready)], stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 10
    while not ready.exists():
        assert recv.poll() is None and time.monotonic() < deadline, recv.stderr.read()
        time.sleep(0.02)
    t_start = time.time()
    send = lab.tb.popen(0, [sys.executable, UDPSEQ, "send", lab.overlay(1), "5400", str(UDP_MBIT),
                            str(UDP_SECS), str(UDP_SIZE)], stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(FAULT_AT)
        lab.tb.blackhole(0, 1, both=True)
        s_out, s_err = send.communicate(timeout=UDP_SECS + 20)
        r_out, r_err = recv.communicate(timeout=UDP_SECS + 20)
    finally:
        lab.tb.clear_faults()
        for p in (send, recv):
            if p.poll() is None:
                p.kill()
    s = json.loads(s_out.strip().splitlines()[-1])
    r = json.loads(r_out.strip().splitlines()[-1])
    share_pps = s["pps"] / PLANES
    lost = max(0, r["missing"] - s["send_failed"])   # refused by the sender's socket: never sent
    lost_ms = lost / share_pps * 1000
    print(f"one-way UDP: sent {s['sent']}, received {r['received']}, lost {lost} "
          f"= {lost_ms:.1f} ms of the dead plane's share")
    assert r["received"] > 0.9 * s["sent"]
    dead = [e for e in lab.events(0, t_start) if e["new"] == "ASSUMED_BAD"]
    plane = lab.tb.dev(0, 1, 1)
    # retired by the datapath's judge (feedback frames), not the agent's probes
    assert {e["plane"] for e in dead} == {plane}
    assert all(e["reason"] == "dead" for e in dead), dead
    assert lost_ms <= 10, f"lost {lost} datagrams = {lost_ms:.1f} ms of the plane's share"


# ------------------------------------------------------------------ few paths, light traffic

@pytest.fixture(params=["xdp", "tc"])
def sparse(request, tmp_path):
    with Lab(tmp_path, 2, 2, prefix="hl3", evs=1, extra="[health]\ndead_after_ms = 10\n",
             rx_hook=request.param) as lab:
        lab.hook = request.param
        lab.up()
        yield lab


def test_two_paths_light_traffic_blackhole(sparse):
    """The sibling evidence is as sparse as it gets: 2 paths, a TCP flow
    paced at 1 MB/s (delayed ACKs: few echoes). A blackholed plane is still
    retired quickly - by the datapath's judge or the agent's probes,
    whichever is first (measured: mostly the probes, ~100-130 ms: the judge
    runs when a unit is about to leave on the path, and TCP stalled by the
    loss sends none there) - only that plane, and the transfer completes
    intact."""
    lab = sparse
    recv = lab.start_receiver(1, 5500, timeout=30)
    send = lab.tb.popen(0, [sys.executable, XFER, "send", "--to", lab.overlay(1), "--port", "5500",
                            "--bytes", "3M", "--seed", "5", "--timeout", "30", "--max-rate", "1M"],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)
        t0 = time.time()
        lab.tb.blackhole(0, 1)
        end = time.monotonic() + 3
        while time.monotonic() < end:
            dead = [e for e in lab.events(0, t0) if e["new"] == "ASSUMED_BAD"]
            if dead:
                break
            time.sleep(0.05)
        s, r = Lab.result(send, 60), Lab.result(recv, 60)
    finally:
        lab.tb.clear_faults()
        for p in (send, recv):
            if p.poll() is None:
                p.kill()
    assert s["sha256"] == r["sha256"] and s["bytes"] == r["bytes"]
    assert [e["plane"] for e in dead] == [lab.tb.dev(0, 1, 1)]
    after_ms = (dead[0]["time"] - t0) * 1000
    print(f"two paths, 1 MB/s, {lab.hook}: retired ({dead[0]['reason']}) {after_ms:.0f} ms after the fault")
    assert after_ms < 500
