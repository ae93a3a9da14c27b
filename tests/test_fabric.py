"""The routed leaf-spine testbed (mrcctl fabric) with real namespaces and packets.

Each test builds its own fabric under a short prefix ("fb{pid}{letter}") and
removes it. Checks are on delivered packets, not on what the code says it did.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from mrcctl.lab import fabric as fbmod  # noqa: E402
from mrcctl.lab import testbed as tbmod  # noqa: E402
from mrcctl.lab.fabric import Fabric  # noqa: E402

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)"),
    pytest.mark.skipif(shutil.which("ip") is None or shutil.which("tc") is None, reason="needs iproute2"),
]

EVS = list(range(49152, 49168))
PORT = 4794


def _prefix(tag: str) -> str:
    return f"fb{os.getpid() % 10000}{tag}"


@pytest.fixture(scope="module")
def fabric():
    fb = Fabric(hosts=4, planes=2, spines=2, leaves=2, ipv6=True, prefix=_prefix("m"))
    fb.up()
    try:
        yield fb
    finally:
        fb.down()
    assert tbmod.list_namespaces(fb.prefix) == []


RECV = textwrap.dedent("""
    import collections, json, socket, sys, time
    s = socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((sys.argv[1], int(sys.argv[2])))
    s.settimeout(0.5)
    print("ready", flush=True)
    got = collections.Counter()
    deadline = time.monotonic() + float(sys.argv[3])
    while time.monotonic() < deadline:
        try:
            data, addr = s.recvfrom(2048)
        except socket.timeout:
            continue
        if data == b"end":
            break
        got[addr[1]] += 1
    print(json.dumps(got))
""")

SEND = textwrap.dedent("""
    import socket, sys, time
    src, dst, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    fam = socket.AF_INET6 if ':' in src else socket.AF_INET
    for ev in map(int, sys.argv[5].split(',')):
        s = socket.socket(fam, socket.SOCK_DGRAM)
        s.bind((src, ev))
        for _ in range(n):
            s.sendto(b"x" * 64, (dst, port))
            time.sleep(0.0005)
        s.close()
    time.sleep(0.2)
    e = socket.socket(fam, socket.SOCK_DGRAM)
    for _ in range(5):
        e.sendto(b"end", (dst, port))
""")


def _delivered(fb: Fabric, src: int, dst: int, plane: int, evs: list[int], n: int = 10,
               family: int = 4) -> dict[int, int]:
    """Datagrams from src to dst on plane p that arrived, by source port (EV).
    The end marker comes from an ephemeral port that may take either spine;
    a receiver timeout bounds the wait when it is lost."""
    dst_addr = fb.host_addr(dst, plane, family)
    recv = fb.popen(dst, [sys.executable, "-c", RECV, dst_addr, str(PORT), "8"],
                    stdout=subprocess.PIPE, text=True)
    assert recv.stdout.readline().strip() == "ready"
    fb.exec(src, [sys.executable, "-c", SEND, fb.host_addr(src, plane, family), dst_addr, str(PORT),
                  str(n), ",".join(map(str, evs))], timeout=30)
    out, _ = recv.communicate(timeout=15)
    got = {int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()}
    return {ev: got.get(ev, 0) for ev in evs}


def test_layout_names_and_addresses_are_deterministic():
    fb = Fabric(hosts=6, planes=2, spines=3, leaves=2, ipv6=True, prefix="fbnames")
    assert [fb.leaf_of(i) for i in range(6)] == [0, 0, 0, 1, 1, 1]
    assert fb.planes(0) == ["p0", "p1"] and fb.dev(0, 4, 1) == "p1"
    assert fb.host_addr(4, 1) == "10.101.4.2" and fb.gateway(4, 1) == "10.101.4.1"
    assert fb.host_addr(4, 1, 6) == "fd01:1:4::2" and fb.gateway(4, 1, 6) == "fd01:1:4::1"
    assert fb.link_addr(1, 1, 2, "spine") == "10.151.18.2"
    assert fb.leaf_ns(1, 0) == "fbnames-p1l0" and fb.spine_ns(0, 2) == "fbnames-p0s2"
    lay = fb.layout()
    assert len(lay["links"]) == 2 * 2 * 3 and len(lay["namespaces"]) == 6 + 2 * (2 + 3)
    cfg = fb.mrc_config(0, evs=8)
    assert cfg.count("[[plane]]") == 2 and cfg.count("[[peer]]") == 5
    assert 'p1 = "10.101.5.2"' in cfg
    with pytest.raises(tbmod.TestbedError):
        Fabric(hosts=2, leaves=3)
    with pytest.raises(tbmod.TestbedError):
        fb.link_blackhole(0, 0, 3)
    with pytest.raises(tbmod.TestbedError):
        fb.link_blackhole(0, 0, 0, direction="sideways")


def test_every_host_reaches_every_other_on_every_plane(fabric):
    for p in range(fabric.n_planes):
        for j in (1, 2, 3):
            assert fabric.ping(0, j, p), f"h0 -> h{j} plane {p} (IPv4)"
            assert fabric.ping(0, j, p, family=6), f"h0 -> h{j} plane {p} (IPv6)"
    # the hop count shows the spine in between across leaves, not within one
    tr = fabric.exec(0, ["ping", "-c", "1", "-W", "1", fabric.host_addr(2, 0)]).stdout
    assert "ttl=61" in tr
    tr = fabric.exec(0, ["ping", "-c", "1", "-W", "1", fabric.host_addr(1, 0)]).stdout
    assert "ttl=63" in tr


def test_evs_spread_over_the_spines_and_same_leaf_crosses_none(fabric):
    spines = fabric.ev_spines(0, 0, 2, EVS)
    assert set(spines.values()) == {0, 1}, spines
    with pytest.raises(tbmod.TestbedError):
        fabric.ev_spines(0, 0, 2, EVS, family=6)
    assert fabric.ev_spines(0, 0, 1, EVS[:2]) == {EVS[0]: None, EVS[1]: None}
    assert fabric.evs_across(0, 1, 0, 0, 1, EVS) == []


def test_gray_link_failure_drops_exactly_the_evs_the_kernel_hashes_onto_it(fabric):
    family = 4
    plane, spine = 1, 1
    dead = fabric.evs_across(plane, 0, spine, 0, 2, EVS, family=family)
    assert 0 < len(dead) < len(EVS)
    fabric.link_blackhole(plane, 0, spine, direction="up")
    try:
        st = fabric.link_status(plane, 0, spine)
        assert st["up"]["faults"] == ["blackhole"] and st["up"]["state"] == "UP"
        assert st["down"]["faults"] == []
        got = _delivered(fabric, 0, 2, plane, EVS, family=family)
        assert {ev for ev, n in got.items() if n == 0} == set(dead), got
        assert all(got[ev] == 10 for ev in EVS if ev not in dead), got
        # the other direction of the same link still carries traffic
        back = fabric.evs_across(plane, 0, spine, 2, 0, EVS, family=family)
        assert back
        got = _delivered(fabric, 2, 0, plane, back, family=family)
        assert all(n == 10 for n in got.values()), got
    finally:
        fabric.link_blackhole(plane, 0, spine, on=False)
    assert all(n == 10 for n in _delivered(fabric, 0, 2, plane, dead, family=family).values())


def test_gray_link_failure_over_ipv6_drops_some_evs_and_spares_the_rest(fabric):
    fabric.link_blackhole(0, 1, 0, direction="down")
    try:
        got = _delivered(fabric, 0, 2, 0, EVS, family=6)
    finally:
        fabric.link_blackhole(0, 1, 0, on=False)
    assert set(got.values()) == {0, 10}, got
    assert all(n == 10 for n in _delivered(fabric, 0, 2, 0, EVS, family=6).values())


def test_link_loss_rate_carrier_and_clear(fabric):
    fabric.link_loss(0, 1, 0, 30, direction="down")
    fabric.set_link_rate(0, 1, 0, "100mbit")
    fabric.link_carrier(0, 1, 1, False)
    st = fabric.status()
    link = {(x["plane"], x["leaf"], x["spine"]): x["live"] for x in st["links"]}
    assert link[(0, 1, 0)]["down"]["faults"] == ["loss 30%"]
    assert link[(0, 1, 0)]["up"]["faults"] == []
    assert link[(0, 1, 1)]["up"]["state"] == "DOWN"
    q = fabric.router_exec(fabric.leaf_ns(0, 1), ["tc", "qdisc", "show", "dev", "s0"]).stdout
    assert "tbf" in q and "100Mbit" in q
    fabric.clear_faults()
    fabric.set_link_rate(0, 1, 0, None)
    st = fabric.status()
    assert all(not e["faults"] and e["state"] == "UP" for x in st["links"] for e in x["live"].values())


def test_cross_traffic_runs_through_the_chosen_link_and_stops(fabric):
    def tx_bytes(ns, dev):
        out = fabric.router_exec(ns, ["ip", "-s", "-j", "link", "show", "dev", dev]).stdout
        return json.loads(out)[0]["stats64"]["tx"]["bytes"]

    ns, other = fabric.leaf_ns(1, 1), fabric.leaf_ns(1, 0)
    before, before_other = tx_bytes(ns, "s1"), tx_bytes(other, "s1")
    proc = fabric.cross_traffic(1, 1, 1, "50mbit", 1.0, direction="up")
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0
    got = json.loads(out)
    sent, moved = got["bytes"], tx_bytes(ns, "s1") - before
    assert 5_500_000 < sent <= moved, (sent, moved)
    assert got["lost_percent"] < 1 and got["received_packets"] == got["packets"] - got["lost_packets"], got
    assert tx_bytes(other, "s1") - before_other < 100_000
    with pytest.raises(tbmod.TestbedError):
        fabric.cross_traffic(1, 1, 1, "50mbit", 5000)


def test_attach_finds_the_fabric_again(fabric):
    again = fbmod.attach(fabric.prefix)
    assert isinstance(again, Fabric)
    assert again.layout() == fabric.layout()


def test_a_rate_limited_marker_marks_only_while_the_link_is_overloaded(fabric):
    """The phantom queue (bpf/ecn_mark.bpf.c) drains at 100 Mbit/s: ECN-capable
    traffic below that passes unmarked, traffic above it is marked, and
    traffic that is not ECN-capable is never marked but fills the queue."""
    fabric.link_ecn_mark(1, 1, 1, direction="up", rate="100mbit")
    try:
        def run(rate: str, ecn: bool) -> dict:
            before = fabric.ecn_marks(1, 1, 1)
            proc = fabric.cross_traffic(1, 1, 1, rate, 1.0, direction="up", ecn=ecn)
            _, err = proc.communicate(timeout=20)
            assert proc.returncode == 0, err
            after = fabric.ecn_marks(1, 1, 1)
            return {k: after[k] - before[k] for k in after}

        below = run("50mbit", ecn=True)
        # the stream sends GSO bursts: the odd one overfills the phantom queue
        assert below["seen"] > 3000 and below["marked"] < 0.1 * below["seen"], below
        above = run("200mbit", ecn=True)
        assert above["marked"] > 0.8 * above["seen"], above
        plain = run("200mbit", ecn=False)
        assert plain["seen"] > 10000 and plain["marked"] == 0, plain
    finally:
        fabric.link_ecn_mark(1, 1, 1, on=False, direction="up")
    with pytest.raises(tbmod.TestbedError):
        fabric.ecn_marks(1, 1, 1)
