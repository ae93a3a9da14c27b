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
import os
import time
from pathlib import Path

import pytest

from lab import FAST_HEALTH, Lab
from mrcctl.datapath import libbpf

PLANES = 2
EVS = 2
HEALTH = FAST_HEALTH


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


def state(lab: Lab, i: int) -> dict:
    ino = os.stat(f"/run/netns/{lab.tb.ns(i)}").st_ino
    return json.loads(Path(f"/run/mrc/instances/ns{ino}-mrc0/state.json").read_text())


PROG = {"xdp": "mrc_rx", "tc": "mrc_rx_tc"}


def loaded(lab: Lab, i: int) -> set[str]:
    """The programs that use host i's maps, but the agent's mrc_ctl."""
    return set(libbpf.programs_using(state(lab, i)["map_ids"]["mrc_cfg"])) - {"mrc_ctl"}


def test_hook_attached_and_shown(lab):
    other = PROG["tc" if lab.hook == "xdp" else "xdp"]
    for i in lab.tb.hosts():
        # the hook no plane uses: its program was never loaded (verified)
        assert set(state(lab, i)["prog_ids"]) == {"mrc_tx", PROG[lab.hook]}
        assert loaded(lab, i) == {"mrc_tx", PROG[lab.hook]}, other
        snap = lab.status(i)
        assert [p["rx_hook"] for p in snap["planes"]] == [lab.hook] * PLANES
        for p in snap["planes"]:
            xdp, tc = rx_prog(lab, i, p["device"])
            assert (bool(xdp), bool(tc)) == ((True, False) if lab.hook == "xdp" else (False, True))
        assert lab.hook in lab.mrcctl(i, "status").stdout
        # the spraying unit: whole 64 KiB units where tc takes them whole
        # from a veth, 64 KiB / planes where XDP sees them segment by segment
        link = json.loads(lab.tb.exec(i, ["ip", "-j", "-d", "link", "show", "dev", "mrc0"]).stdout)[0]
        assert link["gso_max_size"] == (65536 if lab.hook == "tc" else 65536 // PLANES)


# A GSO unit carries at most 64 KiB, so no skb holds more wire PSNs than this.
MAX_PSNS_PER_SKB = (64 << 10) // 1000 + 1


def kernel_losses(lab: Lab, src: int, dst: int) -> int:
    """skbs the kernel lost between src's mrc_tx and dst's receive hook:
    src's plane qdiscs (clsact's count is mrc's own verdicts, not losses)
    and devices on transmit, dst's plane devices on receive (a busy CPU's
    backlog overflows even on an unshaped veth)."""
    total = 0
    for dev in lab.tb.planes(src, dst):
        total += sum(lab.qdisc_counter(src, dev, "drops", kind)
                     for kind in ("pfifo", "pfifo_fast", "tbf", "noqueue"))
        total += lab.link_stats(src, dev)["tx"]["dropped"]
    for dev in lab.tb.planes(dst, src):
        total += lab.link_stats(dst, dev)["rx"]["dropped"]
    return total


def test_transfer_every_wire_packet_counted(lab):
    before = [lab.status(i) for i in lab.tb.hosts()]
    lost0 = kernel_losses(lab, 0, 1)
    s, r = lab.transfer(0, 1, "128M", port=5301)
    assert s["sha256"] == r["sha256"] and s["bytes"] == r["bytes"] == 128 << 20
    after = [lab.status(i) for i in lab.tb.hosts()]
    lost = kernel_losses(lab, 0, 1) - lost0

    def total(snap, key):
        return sum(p[key] for peer in snap["peers"] for p in peer["paths"])
    sent = total(after[0], "tx_packets") - total(before[0], "tx_packets")
    got = total(after[1], "rx_packets") - total(before[1], "rx_packets")
    drops = {k: v - before[1]["drops"][k] for k, v in after[1]["drops"].items()
             if v != before[1]["drops"][k]}
    # Every PSN the sender used arrived once, except those in skbs the
    # kernel lost on the way (with tc an skb is a whole unit of many PSNs)
    # and frames mrc_rx refused, counted, as another plane's path: one in
    # 96,896 in a CI run, from a steered retransmission that read
    # ack_max_path twice while a receive CPU rewrote it (fixed in mrc_tx;
    # 0 such drops in 8 failover trials since, 2 of 12 trials before).
    stray = drops.get("rx_wrong_plane", 0)
    assert sent - lost * MAX_PSNS_PER_SKB - stray <= got <= sent, (sent, got, lost, drops)
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


def test_re_up_with_the_other_hook_loads_its_program(lab):
    """A plane moving to the other hook needs that program, which the
    running instance never loaded: re-up loads it (keeping the running
    maps) and the one no plane uses any more is gone."""
    other = "tc" if lab.hook == "xdp" else "xdp"
    before = state(lab, 1)["map_ids"]
    cfg = lab.configs[1]
    text = cfg.read_text()
    try:
        cfg.write_text(text.replace(f'rx_hook = "{lab.hook}"', f'rx_hook = "{other}"'))
        lab.mrcctl(1, "up")
        assert state(lab, 1)["map_ids"] == before
        assert set(state(lab, 1)["prog_ids"]) == {"mrc_tx", PROG[other]}
        assert loaded(lab, 1) == {"mrc_tx", PROG[other]}
        devs = [p["device"] for p in lab.status(1)["planes"]]
        want = [True, False] if other == "xdp" else [False, True]
        assert [[bool(x) for x in rx_prog(lab, 1, d)] for d in devs] == [want] * PLANES
        s, r = lab.transfer(0, 1, "8M", port=5303)
        assert s["sha256"] == r["sha256"]
    finally:
        cfg.write_text(text)
        lab.mrcctl(1, "up")
    assert loaded(lab, 1) == {"mrc_tx", PROG[lab.hook]}


def test_down_removes_the_receive_program(lab):
    devs = [p["device"] for p in lab.status(1)["planes"]]
    lab.mrcctl(1, "down")
    try:
        assert [rx_prog(lab, 1, d) for d in devs] == [(0, 0)] * PLANES
    finally:
        lab.up([1])
    assert all(any(rx_prog(lab, 1, d)) for d in devs)
