"""Hundreds of configured peers (issue #14.1): one real peer among 299
configured but absent ones, past the 64 peers the maps once held; then an
upgrade in place to more peers than the maps have room for, which resizes
them and keeps what the real peer's state was."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lab import Lab

from mrcctl.datapath import libbpf

PLANES = 2
EVS = 4
ABSENT_NET = 210      # absent peers' underlay: 10.(210 + plane).0.0/16, routed on-link on h0


def absent(lab: Lab, n: int) -> str:
    out = []
    for p in range(PLANES):
        lab.tb.exec(0, ["ip", "route", "replace", f"10.{ABSENT_NET + p}.0.0/16", "dev", lab.tb.dev(0, 1, p)])
    for k in range(n):
        out += ["[[peer]]", f'name = "idle{k}"', f'overlay = "172.31.{1 + k // 250}.{k % 250 + 1}"',
                f"evs_per_plane = {EVS}", "[peer.underlay]"]
        out += [f'{lab.tb.dev(0, 1, p)} = "10.{ABSENT_NET + p}.{k // 250}.{k % 250 + 1}"' for p in range(PLANES)]
        out.append("")
    return "\n".join(out)


def map_sizes(lab: Lab) -> dict[str, int]:
    ino = os.stat(f"/run/netns/{lab.tb.ns(0)}").st_ino
    state = json.loads(Path(f"/run/mrc/instances/ns{ino}-mrc0/state.json").read_text())
    out = {}
    for name, mid in state["map_ids"].items():
        with libbpf.Map.from_id(mid) as m:
            out[name] = (mid, m.max_entries)
    return out


def h1(snap: dict) -> dict:
    return next(p for p in snap["peers"] if p["name"] == "h1")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with Lab(tmp_path_factory.mktemp("scale"), hosts=2, planes=PLANES, evs=EVS, prefix="scl") as lab:
        lab.up(hosts=[1])
        yield lab


def test_300_peers_carry_a_transfer_and_resize_in_place(lab):
    base = lab.tb.mrc_config(0, evs=EVS)
    lab.configs[0].write_text(base + "\n" + absent(lab, 299))
    out = lab.mrcctl(0, "up", timeout=120).stdout
    assert "300 peers" in out, out
    sizes = map_sizes(lab)
    # 2 x 4 paths, room for 32 (16,384 path slots / 320 peers)
    assert sizes["mrc_peers"][1] == 320 and sizes["mrc_paths"][1] == 320 * 32
    send, recv = lab.transfer(0, 1, "16M", port=5311)
    assert recv["bytes"] == send["bytes"] == 16 << 20 and recv["sha256"] == send["sha256"]
    snap = lab.status(0)
    assert len(snap["peers"]) == 300
    peer = h1(snap)
    assert sum(p["tx_packets"] for p in peer["paths"]) > (16 << 20) // 9000
    lab.mrcctl(0, "path", "deny", "h1/3")
    psn, tx = peer["tx_psn"], {p["id"]: p["tx_packets"] for p in peer["paths"]}

    # 360 peers: more than the 320 the maps hold. `up` recreates them and
    # moves every entry: h1's PSNs, counters and the operator's denial stay.
    lab.configs[0].write_text(base + "\n" + absent(lab, 359))
    out = lab.mrcctl(0, "up", timeout=120).stdout
    assert "360 peers" in out, out
    after = map_sizes(lab)
    assert after["mrc_peers"][1] == 384 and after["mrc_peers"][0] != sizes["mrc_peers"][0]
    assert after["mrc_cfg"][0] == sizes["mrc_cfg"][0]          # not resized: the same map
    peer = h1(lab.status(0))
    assert peer["tx_psn"] >= psn
    assert all(p["tx_packets"] >= tx[p["id"]] for p in peer["paths"])
    assert [p["id"] for p in peer["paths"] if p["state"] == "DENIED"] == [3]
    before3 = next(p["tx_packets"] for p in peer["paths"] if p["id"] == 3)
    send, recv = lab.transfer(0, 1, "16M", port=5312)
    assert recv["bytes"] == send["bytes"] == 16 << 20 and recv["sha256"] == send["sha256"]
    peer = h1(lab.status(0))
    assert next(p["tx_packets"] for p in peer["paths"] if p["id"] == 3) == before3   # still denied
