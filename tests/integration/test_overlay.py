"""Foundation: a sprayed overlay between namespaces, real TCP, real programs."""

from __future__ import annotations

import json
import pytest

from lab import Lab


def shares(paths):
    total = sum(p["tx_packets"] for p in paths)
    assert total > 0
    return [p["tx_packets"] / total for p in paths]


@pytest.fixture(scope="module")
def lab2(tmp_path_factory):
    with Lab(tmp_path_factory.mktemp("lab2"), hosts=2, planes=4, evs=4) as lab:
        lab.up(settle=True)
        yield lab


def test_ping_over_overlay(lab2):
    r = lab2.tb.exec(0, ["ping", "-c", "3", "-i", "0.2", "-W", "1", lab2.overlay(1)], check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def sprayed(p) -> int:
    """What the spray table sent on a path: retransmissions go to the
    freshest path and a suspect path's hedged copy to its partner, both on
    top of the path's share (a CI run: path 0 at 9.2 % of 16 paths)."""
    return p["tx_packets"] - p["tx_steered"] - p["tx_hedged"]


def test_64mib_transfer_sprayed_over_16_paths(lab2):
    before = {p["id"]: sprayed(p) for p in lab2.paths(0)}
    send, recv = lab2.transfer(0, 1, "64M")
    assert recv["bytes"] == send["bytes"] == 64 << 20
    assert recv["sha256"] == send["sha256"]
    assert not recv["reset"]
    after = lab2.paths(0)
    assert len(after) == 16
    delta = [{"tx_packets": sprayed(p) - before[p["id"]]} for p in after]
    for i, share in enumerate(shares(delta)):
        assert 0.03 <= share <= 0.09, f"path {i} carried {share:.1%}"
    # the receiver counted what the sender sprayed, per path
    rx = lab2.paths(1)
    assert all(p["rx_packets"] > 0 for p in rx)
    assert sum(p["rx_packets"] for p in rx) >= sum(d["tx_packets"] for d in delta)


def test_status_json_fields(lab2):
    snap = lab2.status(0)
    peer = snap["peers"][0]
    assert peer["name"] == "h1"
    for p in peer["paths"]:
        for key in ("id", "plane", "ev", "state", "tx_packets", "tx_bytes", "rx_packets", "rx_bytes"):
            assert key in p
        assert p["state"] == "GOOD"
    assert [p["ev"] for p in peer["paths"]] == list(range(49152, 49168))


def test_status_table_is_readable(lab2):
    out = lab2.mrcctl(0, "status").stdout
    assert "peer h1" in out and "GOOD" in out


def test_up_twice_is_a_noop(lab2):
    before = lab2.mrcctl(0, "status", "--json")
    links = lab2.tb.exec(0, ["ip", "-j", "link", "show"]).stdout
    xdp = [lab2.tb.exec(0, ["ip", "-j", "link", "show", dev]).stdout for dev in lab2.tb.planes(0, 1)]
    r = lab2.mrcctl(0, "up")
    assert "nothing changed" in r.stdout
    assert lab2.tb.exec(0, ["ip", "-j", "link", "show"]).stdout == links
    assert [lab2.tb.exec(0, ["ip", "-j", "link", "show", dev]).stdout for dev in lab2.tb.planes(0, 1)] == xdp
    assert json.loads(before.stdout)["peers"][0]["paths"][0]["ev"] == 49152


def test_weighted_planes_3_1_1_1(tmp_path):
    with Lab(tmp_path, hosts=2, planes=4, evs=4, weights=[3, 1, 1, 1], prefix="mw") as lab:
        lab.up(settle=True)
        send, recv = lab.transfer(0, 1, "32M")
        assert recv["sha256"] == send["sha256"]
        # what the spray table sent: retransmissions go to the freshest path,
        # a suspect path's hedged copy to its partner on the next plane
        per_plane = {}
        for p in lab.paths(0):
            per_plane[p["plane"]] = per_plane.get(p["plane"], 0) + sprayed(p)
        total = sum(per_plane.values())
        got = [per_plane[d] / total for d in lab.tb.planes(0, 1)]
        want = [0.5, 1 / 6, 1 / 6, 1 / 6]
        for g, w in zip(got, want):
            assert abs(g - w) <= 0.05, (got, want)


def test_ipv6_underlay(tmp_path):
    with Lab(tmp_path, hosts=2, planes=4, evs=4, ipv6=True, prefix="m6") as lab:
        lab.up()
        send, recv = lab.transfer(0, 1, "64M")
        assert recv["sha256"] == send["sha256"] and recv["bytes"] == 64 << 20
        paths = lab.paths(0)
        assert all(":" in p["remote"] for p in paths)
        assert all(p["tx_packets"] > 0 for p in paths)


def test_three_hosts_a_talks_to_b_and_c(tmp_path):
    with Lab(tmp_path, hosts=3, planes=2, evs=2, prefix="m3") as lab:
        lab.up()
        rb = lab.start_receiver(1, 5001)
        rc = lab.start_receiver(2, 5002)
        sb = lab.start_sender(0, 1, "16M", 5001, seed=2)
        sc = lab.start_sender(0, 2, "16M", 5002, seed=3)
        res = [lab.result(p) for p in (sb, rb, sc, rc)]
        assert res[0]["sha256"] == res[1]["sha256"]
        assert res[2]["sha256"] == res[3]["sha256"]
        assert res[0]["sha256"] != res[2]["sha256"]
        snap = lab.status(0)
        assert {p["name"] for p in snap["peers"]} == {"h1", "h2"}
        for peer in snap["peers"]:
            assert all(p["tx_packets"] > 0 for p in peer["paths"])
        # one instance per namespace, all named mrc0, none sees another's maps
        b, c = lab.status(1), lab.status(2)
        assert [p["name"] for p in b["peers"]] == ["h0", "h2"]
        assert [p["name"] for p in c["peers"]] == ["h0", "h1"]
        rx_b = sum(p["rx_bytes"] for p in b["peers"][0]["paths"])
        rx_c = sum(p["rx_bytes"] for p in c["peers"][0]["paths"])
        assert sum(p["rx_bytes"] for p in b["peers"][1]["paths"]) < 1 << 20   # nothing from h2
        assert rx_b >= 16 << 20 and rx_c >= 16 << 20
        assert rx_b < 2 * (16 << 20) and rx_c < 2 * (16 << 20)


def _mrc_leftovers(lab, i):
    tb = lab.tb
    left = []
    links = json.loads(tb.exec(i, ["ip", "-j", "-d", "link", "show"]).stdout)
    for link in links:
        if link["ifname"].startswith("mrc"):
            left.append(f"link {link['ifname']}")
        if link.get("xdp"):
            left.append(f"xdp on {link['ifname']}")
    for dev in tb.planes(i, 1 - i if lab.tb.n_hosts == 2 else 0):
        for where in ("egress", "ingress"):
            f = tb.exec(i, ["tc", "filter", "show", "dev", dev, where]).stdout
            if "mrc" in f:
                left.append(f"tc {where} filter on {dev}")
    routes = tb.exec(i, ["ip", "route", "show"]).stdout
    if "172.31." in routes:
        left.append(f"routes: {routes}")
    return left


def test_down_leaves_nothing(tmp_path):
    baseline = _prog_ids()
    with Lab(tmp_path, hosts=2, planes=2, evs=2, prefix="md") as lab:
        lab.up()
        ours = _prog_ids() - baseline
        # mrc_tx and the planes' receive program on each host (the other
        # hook's program is freed once `up` lets go of it), and an agent's
        # mrc_ctl once it has asked for a retirement
        assert 4 <= len(ours) <= 6
        for i in (0, 1):
            r = lab.mrcctl(i, "down")
            assert "down" in r.stdout
            assert _mrc_leftovers(lab, i) == []
        # gone from the kernel, not just detached (nothing holds them any more)
        assert not (ours & _prog_ids())
        assert _instance_dirs(lab) == []            # no instance record left
        r = lab.mrcctl(0, "status", check=False)
        assert r.returncode != 0 and "not up" in r.stderr
        assert lab.mrcctl(0, "down").stdout.strip().endswith("nothing to remove")


def _instance_dirs(lab):
    from mrcctl.instance.state import RUN_DIR
    netns = {lab.tb.exec(i, ["stat", "-L", "-c", "%i", "/proc/self/ns/net"]).stdout.strip() for i in (0, 1)}
    d = RUN_DIR / "instances"
    return [p for p in d.iterdir() if any(p.name.startswith(f"ns{n}-") for n in netns)] if d.exists() else []


def _prog_ids() -> set[int]:
    from mrcctl.datapath.libbpf import LibbpfError, Program, prog_ids
    found = set()
    for pid in prog_ids():
        try:
            with Program.from_id(pid) as p:
                if p.name.startswith("mrc_"):
                    found.add(pid)
        except LibbpfError:
            pass          # unloaded meanwhile
    return found


def test_agent_restores_a_wrong_neighbour_mac(lab2):
    """The agent keeps each path's destination MAC equal to the kernel's neighbour entry."""
    import time

    from mrcctl.agent import neighbours
    from mrcctl.datapath import abi as wire
    from mrcctl.datapath.libbpf import Map
    from mrcctl.instance.state import Instance

    ino = int(lab2.tb.exec(0, ["stat", "-L", "-c", "%i", "/proc/self/ns/net"]).stdout)
    state = Instance("mrc0", netns=ino).read()
    key = wire.DEFAULT_SIZING.path_key(0, 0)
    with Map.from_id(state["map_ids"]["mrc_paths"]) as paths:
        good = wire.Path.unpack(paths.lookup(key))
        assert good.dmac == lab2.tb.mac(1, 0, 0)
        paths.update(key, wire.replace(good, dmac="02:00:00:00:de:ad").pack())
        # no neighbour event tells the agent of a map written behind its
        # back: its periodic full check (FULL_S) puts the MAC back
        deadline = time.monotonic() + neighbours.FULL_S + 3
        while time.monotonic() < deadline:
            if wire.Path.unpack(paths.lookup(key)).dmac == good.dmac:
                break
            time.sleep(0.1)
        assert wire.Path.unpack(paths.lookup(key)).dmac == good.dmac
