"""The two receive hooks end to end (plane[].rx_hook = "xdp" | "tc"): the
program each attaches, a sha256-checked TCP transfer, every wire packet the
sender counted counted again by the receiver, a blackholed plane retired and
brought back by probes (with tc, probes are answered by bpf_redirect), and
`down` leaving no receive program behind.

With XDP on a veth plane the sender's veth loses TSO, so the receiver sees
one wire segment per packet; with tc ingress whole GSO units arrive and
mrc_rx_tc accounts each of their wire PSNs (health.rx_gso_units/segs).
"""

from __future__ import annotations

import json
import time

import pytest

from lab import Lab

PLANES = 2
EVS = 2
HEALTH = """[health]
dead_after_ms = 10
probe_interval_ms = 20
recover_probes = 3
"""


@pytest.fixture(scope="module", params=["xdp", "tc"])
def lab(request, tmp_path_factory):
    hook = request.param
    with Lab(tmp_path_factory.mktemp(f"rxhook-{hook}"), 2, PLANES, prefix=f"mth{hook[0]}",
             evs=EVS, extra=HEALTH, rx_hook=hook) as lab:
        lab.hook = hook
        lab.up()
        yield lab


@pytest.fixture(autouse=True)
def _clean(lab):
    yield
    lab.tb.clear_faults()


def rx_prog(lab: Lab, i: int, dev: str) -> tuple[int, int]:
    """(XDP program id, tc ingress program id) on host i's dev."""
    link = json.loads(lab.tb.exec(i, ["ip", "-j", "-d", "link", "show", "dev", dev]).stdout)[0]
    xdp = ((link.get("xdp") or {}).get("prog") or {}).get("id", 0)
    cp = lab.tb.exec(i, ["tc", "-j", "filter", "show", "dev", dev, "ingress"], check=False)
    tc = next((f["options"]["prog"]["id"] for f in json.loads(cp.stdout or "[]")
               if ((f.get("options") or {}).get("prog") or {}).get("id")), 0)
    return xdp, tc


def test_hook_attached_and_shown(lab):
    for i in lab.tb.hosts():
        snap = lab.status(i)
        assert [p["rx_hook"] for p in snap["planes"]] == [lab.hook] * PLANES
        for p in snap["planes"]:
            xdp, tc = rx_prog(lab, i, p["device"])
            assert (bool(xdp), bool(tc)) == ((True, False) if lab.hook == "xdp" else (False, True))
        assert lab.hook in lab.mrcctl(i, "status").stdout


def test_transfer_every_wire_packet_counted(lab):
    before = [lab.status(i) for i in lab.tb.hosts()]
    s, r = lab.transfer(0, 1, "128M", port=5301)
    assert s["sha256"] == r["sha256"] and s["bytes"] == r["bytes"] == 128 << 20
    after = [lab.status(i) for i in lab.tb.hosts()]

    def total(snap, key):
        return sum(p[key] for peer in snap["peers"] for p in peer["paths"])
    sent = total(after[0], "tx_packets") - total(before[0], "tx_packets")
    got = total(after[1], "rx_packets") - total(before[1], "rx_packets")
    # every PSN the sender used arrived once (no plane drops unshaped)
    assert got == sent, (sent, got)
    units = after[1]["health"]["rx_gso_units"] - before[1]["health"]["rx_gso_units"]
    segs = after[1]["health"]["rx_gso_segs"] - before[1]["health"]["rx_gso_segs"]
    if lab.hook == "tc":
        # the sender's veth kept TSO: units arrive whole, several segments each
        assert units > 0 and segs > 2 * units, (units, segs)
    else:
        assert units == segs == 0


def _paths_state(lab: Lab, plane: int) -> list[str]:
    dev = lab.tb.dev(0, 1, plane)
    return [p["state"] for p in lab.paths(0) if p["plane"] == dev]


def _wait(lab: Lab, plane: int, want: str, timeout: float = 6) -> list[str]:
    end = time.monotonic() + timeout
    while True:
        got = _paths_state(lab, plane)
        if got == [want] * EVS or time.monotonic() > end:
            return got
        time.sleep(0.1)


def test_blackhole_failover_and_probe_recovery(lab):
    recv = lab.start_receiver(1, 5302, timeout=60)
    send = lab.start_sender(0, 1, "64M", 5302, timeout=60)
    try:
        time.sleep(0.5)
        lab.tb.blackhole(0, 1)
        assert _wait(lab, 1, "ASSUMED_BAD") == ["ASSUMED_BAD"] * EVS
        s, r = Lab.result(send, 90), Lab.result(recv, 90)
    finally:
        for p in (send, recv):
            if p.poll() is None:
                p.kill()
    assert s["sha256"] == r["sha256"] and s["bytes"] == r["bytes"]
    # probes (answered by the peer's receive hook) bring the plane back
    lab.tb.blackhole(0, 1, on=False)
    assert _wait(lab, 1, "GOOD") == ["GOOD"] * EVS


def test_down_removes_the_receive_program(lab):
    devs = [p["device"] for p in lab.status(1)["planes"]]
    lab.mrcctl(1, "down")
    try:
        assert [rx_prog(lab, 1, d) for d in devs] == [(0, 0)] * PLANES
    finally:
        lab.up([1])
    assert all(any(rx_prog(lab, 1, d)) for d in devs)
