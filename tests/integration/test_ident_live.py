"""State that follows a peer, one writer per field (issue #13 items 3, 4),
on three hosts running the real mrcctl, agent and datapath:

- `mrcctl path deny/allow` in a loop while h0's agent probes, follows
  neighbours, adapts weights and retires a blackholed plane: the final
  state, the event log and the traffic agree;
- `up` with the [[peer]] blocks swapped keeps h1's denial on h1 and gives
  none of it to h2; both still carry sha256-checked TCP;
- a peer that restarts (`down`, `up`: its PSNs start at 0 again) is not
  judged against its old window: no late packets, one resync.
"""

from __future__ import annotations

import json
import time

import pytest
from lab import Lab

EVS = 2
PLANES = 2
EXTRA = '[weights]\nmode = "adaptive"\n[health]\nprobe_interval_ms = 10'


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with Lab(tmp_path_factory.mktemp("ident"), hosts=3, planes=PLANES, prefix="muid", evs=EVS,
             extra=EXTRA) as lb:
        lb.up()
        yield lb


def events(lab: Lab, i: int, since: float = 0.0) -> list[dict]:
    out = lab.mrcctl(i, "events", "--json").stdout
    return [e for e in map(json.loads, out.splitlines()) if e["time"] >= since]


def peer_paths(lab: Lab, i: int, peer: int, plane: int | None = None) -> list[dict]:
    paths = lab.paths(i, f"h{peer}")
    if plane is None:
        return paths
    return [p for p in paths if p["plane"] == lab.tb.dev(i, peer, plane)]


def same_bytes(sent: dict, got: dict) -> bool:
    return sent["sha256"] == got["sha256"] and sent["bytes"] == got["bytes"] > 0


def test_deny_loop_against_a_running_agent(lab):
    """Every deny and allow lands while the agent works on the same paths:
    probes (10 ms), neighbour refreshes, adaptive weights under a TCP
    stream, and a probe-loss retirement of h1's other plane. The last word
    is a deny, and it holds: in the maps, in the event log, and on the
    wire."""
    spec = f"h1/{lab.tb.dev(0, 1, 0)}"
    t0 = time.time()
    recv = lab.start_receiver(1, port=5601, timeout=90)
    send = lab.start_sender(0, 1, "96M", port=5601, timeout=90)
    rounds = 12
    for k in range(rounds):
        if k == rounds // 2:
            lab.tb.blackhole(0, 1, peer=1)      # h0's agent retires h1's plane 1 on probe loss
        lab.mrcctl(0, "path", "deny", spec)
        lab.mrcctl(0, "path", "allow", spec)
    lab.mrcctl(0, "path", "deny", spec)
    lab.tb.blackhole(0, 1, peer=1, on=False)
    s, r = lab.result(send, 120), lab.result(recv, 120)
    assert same_bytes(s, r)
    time.sleep(2.5)     # agent tasks (slots, neighbours, weights) run again on the final state
    denied = peer_paths(lab, 0, 1, plane=0)
    assert len(denied) == EVS and all(p["state"] == "DENIED" for p in denied), denied
    ops = [e for e in events(lab, 0, t0) if e["source"] == "operator"]
    for p in denied:
        mine = [e["reason"] for e in ops if e["peer"] == "h1" and e["path"] == p["id"]]
        assert mine == ["denied", "allowed"] * rounds + ["denied"], (p["id"], mine)
    # the slot tables the agent rebuilt leave the denied paths out: no unit goes there
    before = {p["id"]: p["tx_packets"] for p in denied}
    s, r = lab.transfer(0, 1, "8M", port=5602)
    assert same_bytes(s, r)
    assert {p["id"]: p["tx_packets"] for p in peer_paths(lab, 0, 1, plane=0)} == before
    lab.mrcctl(0, "path", "allow", "h1/all")


def test_up_with_peers_swapped_keeps_state_with_its_peer(lab):
    spec = f"h1/{lab.tb.dev(0, 1, 1)}"
    lab.mrcctl(0, "path", "deny", spec)
    lab.write_config(0, peers=[2, 1], evs=EVS, extra=EXTRA)
    lab.mrcctl(0, "up")
    h1 = peer_paths(lab, 0, 1)
    assert [p["state"] for p in h1 if p["plane"] == lab.tb.dev(0, 1, 1)] == ["DENIED"] * EVS, h1
    assert all(p["state"] == "GOOD" for p in h1 if p["plane"] == lab.tb.dev(0, 1, 0)), h1
    assert all(p["state"] != "DENIED" for p in peer_paths(lab, 0, 2)), "h1's denial passed to h2"
    for src, dst, port in ((0, 1, 5611), (0, 2, 5612), (1, 0, 5613), (2, 0, 5614)):
        s, r = lab.transfer(src, dst, "8M", port=port)
        assert same_bytes(s, r), (src, dst)
    before = {p["id"]: p["tx_packets"] for p in peer_paths(lab, 0, 1, plane=1)}
    s, r = lab.transfer(0, 1, "8M", port=5615)
    assert {p["id"]: p["tx_packets"] for p in peer_paths(lab, 0, 1, plane=1)} == before
    lab.mrcctl(0, "path", "allow", "h1/all")


def test_restarted_peer_is_not_judged_against_its_old_window(lab):
    """h1 sends enough to move h0's window for it well past 4096 PSNs,
    then restarts from PSN 0 with a new epoch: h0 starts a new window
    (one resync) instead of counting h1's new packets late."""
    s, r = lab.transfer(1, 0, "16M", port=5621)
    assert same_bytes(s, r)

    def reorder() -> dict:
        return next(p for p in lab.status(0)["peers"] if p["name"] == "h1")["reorder"]

    before = reorder()
    assert before["rx_packets"] > 8192, before
    lab.mrcctl(1, "down")
    lab.mrcctl(1, "up")
    s, r = lab.transfer(1, 0, "8M", port=5622)
    assert same_bytes(s, r)
    after = reorder()
    assert after["late"] - before["late"] == 0, (before, after)
    assert after["resync"] - before["resync"] == 1, (before, after)
