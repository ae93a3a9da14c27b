"""Any traffic (issue #14.3) end to end: a dual-stack overlay between two
namespaces (overlay.address and peer[].overlay give an IPv4 and an IPv6
address), prefixes behind each peer (addresses on the peer's lo, served
there through overlay.prefixes), sha256-checked TCP over IPv6 and into both
families' prefixes, a plane blackholed during an IPv6 transfer, routes
following the config, and no neighbour discovery on the overlay.

Underlay IPv4 (the planes), overlay both families: inner IPv6 is what is new.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from lab import FAST_HEALTH, Lab, XFER

PLANES = 2
EVS = 4
HEALTH = FAST_HEALTH


def v6(i: int) -> str:
    return f"fd31::{i + 1}"


def prefix_addrs(i: int) -> tuple[str, str]:
    """An address of each family inside host i's prefixes (on its lo)."""
    return f"10.244.{i + 1}.1", f"fd00:{i + 1}::1"


def prefixes(i: int) -> str:
    return f'prefixes = ["10.244.{i + 1}.0/24", "fd00:{i + 1}::/64"]'


def dual_config(lab: Lab, i: int, peer_prefixes: bool = True, rx_hook: str | None = None) -> str:
    """The testbed's config of host i made dual-stack, with prefixes."""
    j = 1 - i
    text = lab.tb.mrc_config(i, evs=EVS, extra=HEALTH, rx_hook=rx_hook)
    text = text.replace(f'address = "{lab.overlay(i)}/24"',
                        f'address = ["{lab.overlay(i)}/24", "{v6(i)}/64"]\n{prefixes(i)}', 1)
    text = text.replace(f'overlay = "{lab.overlay(j)}"',
                        f'overlay = ["{lab.overlay(j)}", "{v6(j)}"]' +
                        (f"\n{prefixes(j)}" if peer_prefixes else ""), 1)
    return text


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with Lab(tmp_path_factory.mktemp("dualstack"), 2, PLANES, rates="500mbit", prefix="v6d") as lab:
        for i in lab.tb.hosts():
            lab.configs[i].write_text(dual_config(lab, i))
            a4, a6 = prefix_addrs(i)
            lab.tb.exec(i, ["sysctl", "-qw", "net.ipv6.conf.lo.disable_ipv6=0"])
            lab.tb.exec(i, ["ip", "addr", "add", f"{a4}/32", "dev", "lo"])
            lab.tb.exec(i, ["ip", "-6", "addr", "add", f"{a6}/128", "dev", "lo", "nodad"])
        lab.up()
        yield lab


@pytest.fixture(autouse=True)
def _clean(lab):
    yield
    lab.tb.clear_faults()


def transfer(lab: Lab, src: int, dst: int, to: str, nbytes: str, port: int,
             fault=None, max_rate: str | None = None) -> dict:
    """A sha256-checked TCP transfer from host src to address `to` on host
    dst; fault() runs once data flows. Returns the receiver's result."""
    ready = lab.tmp / f"ready-{port}"
    ready.unlink(missing_ok=True)
    recv = lab.tb.popen(dst, [sys.executable, XFER, "recv", "--bind", to, "--port", str(port),
                              "--timeout", "40", "--ready-file", str(ready)],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 10
    while not ready.exists():
        assert recv.poll() is None and time.monotonic() < end, recv.stderr.read() if recv.stderr else ""
        time.sleep(0.02)
    cmd = [sys.executable, XFER, "send", "--to", to, "--port", str(port), "--bytes", nbytes,
           "--seed", str(port), "--timeout", "40"]
    if max_rate:
        cmd += ["--max-rate", max_rate]
    send = lab.tb.popen(src, cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if fault:
            base = tx_packets(lab, src)
            end = time.monotonic() + 15
            while tx_packets(lab, src) < base + 500:
                assert time.monotonic() < end, "transfer did not start"
                time.sleep(0.05)
            fault()
        s, r = Lab.result(send, 60), Lab.result(recv, 60)
    finally:
        for p in (send, recv):
            if p.poll() is None:
                p.kill()
    assert s["bytes"] == r["bytes"] == int(nbytes.rstrip("M")) << 20
    assert s["sha256"] == r["sha256"] and not r["reset"]
    return r


def tx_packets(lab: Lab, i: int) -> int:
    return sum(p["tx_packets"] for p in lab.paths(i))


def drops(lab: Lab, i: int) -> dict:
    return lab.status(i)["drops"]


def test_ipv6_overlay_transfer(lab):
    """TCP over the IPv6 overlay (fd31::1 -> fd31::2), sprayed over every
    path of both planes; the receiver's peer is the IPv6 address."""
    before = {p["id"]: p["tx_packets"] for p in lab.paths(0)}
    bad0 = drops(lab, 1)["rx_bad_inner"]
    r = transfer(lab, 0, 1, v6(1), "24M", 5601)
    assert r["peer"] == v6(0)
    moved = [p["tx_packets"] - before[p["id"]] for p in lab.paths(0)]
    assert len(moved) == PLANES * EVS and all(m > 0 for m in moved), moved
    assert drops(lab, 1)["rx_bad_inner"] == bad0
    snap = lab.status(0)
    assert snap["overlay"]["addresses"] == [f"{lab.overlay(0)}/24", f"{v6(0)}/64"]
    assert snap["peers"][0]["overlays"] == [lab.overlay(1), v6(1)]
    assert snap["peers"][0]["prefixes"] == ["10.244.2.0/24", "fd00:2::/64"]
    text = lab.mrcctl(0, "status").stdout
    assert f"{v6(0)}/64" in text and "fd00:1::/64" in text


@pytest.mark.parametrize("family", [4, 6])
def test_transfer_into_a_prefix_behind_the_peer(lab, family):
    """An address inside h1's prefix (on its lo), not an overlay address:
    h0 routes the prefix through mrc0, mrc_tx finds h1 by longest prefix,
    h1 accepts the destination (overlay.prefixes), and the answers, sourced
    from the prefix, pass h0's owner check (peer[].prefixes)."""
    to = prefix_addrs(1)[0 if family == 4 else 1]
    route = lab.tb.exec(0, ["ip", "-j", "route", "get", to]).stdout
    assert json.loads(route)[0]["dev"] == "mrc0"
    src_refused = drops(lab, 0)["rx_inner_src"]
    r = transfer(lab, 0, 1, to, "8M", 5610 + family)
    assert r["peer"] == (lab.overlay(0) if family == 4 else v6(0))
    assert drops(lab, 0)["rx_inner_src"] == src_refused


def test_blackholed_plane_during_an_ipv6_transfer(lab):
    """Failover for IPv6 too: plane 1 blackholed while an IPv6 transfer runs;
    its paths are retired and the transfer completes intact."""
    seen = {}

    def fault():
        lab.tb.blackhole(0, 1)
        dev = lab.tb.dev(0, 1, 1)
        end = time.monotonic() + 3
        while time.monotonic() < end:
            states = [p["state"] for p in lab.paths(0) if p["plane"] == dev]
            if all(s == "ASSUMED_BAD" for s in states):
                break
            time.sleep(0.1)
        seen["states"] = states

    transfer(lab, 0, 1, v6(1), "24M", 5620, fault=fault, max_rate="16M")
    assert seen["states"] == ["ASSUMED_BAD"] * EVS


def test_no_neighbour_discovery_on_the_overlay(lab):
    """IFF_NOARP holds for IPv6: the peer's IPv6 overlay address needs no
    neighbour solicitation (its neighbour entry is NOARP, never INCOMPLETE
    or FAILED), the overlay has no link-local address to solicit from, and
    IPv6 on the overlay's far end stays off."""
    lab.tb.exec(0, ["ping", "-6", "-c", "2", "-i", "0.2", "-W", "1", v6(1)])
    neigh = json.loads(lab.tb.exec(0, ["ip", "-6", "-j", "neigh", "show", "nud", "all", "dev", "mrc0"])
                       .stdout or "[]")
    assert all(set(n.get("state", [])) <= {"NOARP", "PERMANENT", "NONE"} for n in neigh), neigh
    assert any(n["dst"] == v6(1) and "NOARP" in n.get("state", []) for n in neigh), neigh
    addrs = json.loads(lab.tb.exec(0, ["ip", "-6", "-j", "addr", "show", "dev", "mrc0"]).stdout)
    assert [a["local"] for a in addrs[0]["addr_info"]] == [v6(0)]
    assert lab.tb.exec(0, ["sysctl", "-n", "net.ipv6.conf.mrc0p.disable_ipv6"]).stdout.strip() == "1"
    mtu = json.loads(lab.tb.exec(0, ["ip", "-j", "link", "show", "mrc0"]).stdout)[0]["mtu"]
    assert mtu >= 1280


def test_prefix_routes_follow_the_config(lab):
    """up installs a route on the overlay per peer address and prefix, both
    families; a prefix dropped from the config loses its route at the next
    up, and comes back with it."""
    def routes():
        out = []
        for fam in ("-4", "-6"):
            out += [r["dst"] for r in json.loads(lab.tb.exec(0, ["ip", fam, "-j", "route", "show", "dev", "mrc0"])
                                                 .stdout or "[]")]
        return set(out)

    assert {"10.244.2.0/24", "fd00:2::/64", "172.31.0.2", "fd31::2"} <= routes()
    lab.configs[0].write_text(dual_config(lab, 0, peer_prefixes=False))
    try:
        lab.mrcctl(0, "up")
        now = routes()
        assert "10.244.2.0/24" not in now and "fd00:2::/64" not in now and "fd31::2" in now
    finally:
        lab.configs[0].write_text(dual_config(lab, 0))
        lab.mrcctl(0, "up")
    assert {"10.244.2.0/24", "fd00:2::/64"} <= routes()


def test_ipv6_transfer_through_the_tc_receive_hook(lab):
    """The same over mrc_rx_tc (whole GSO units at tc ingress, decap_tc
    switching skb->protocol to IPv6): intact, both directions' prefixes."""
    try:
        for i in lab.tb.hosts():
            lab.configs[i].write_text(dual_config(lab, i, rx_hook="tc"))
            lab.mrcctl(i, "up")
        assert {p["rx_hook"] for p in lab.status(1)["planes"]} == {"tc"}
        gso0 = lab.status(1)["health"]["rx_gso_units"]
        transfer(lab, 0, 1, v6(1), "16M", 5630)
        transfer(lab, 1, 0, prefix_addrs(0)[1], "8M", 5631)
        assert lab.status(1)["health"]["rx_gso_units"] > gso0     # whole units arrived
    finally:
        for i in lab.tb.hosts():
            lab.configs[i].write_text(dual_config(lab, i))
            lab.mrcctl(i, "up")


def test_ipv6_transfer_authenticated(lab):
    """With a cluster key every IPv6 unit carries a MAC over both inner IPv6
    addresses (every GSO segment repeats it): a transfer arrives intact and
    no frame is refused for its MAC."""
    key = lab.tmp / "cluster.key"
    key.write_text("00112233445566778899aabbccddeeff\n")
    key.chmod(0o600)
    try:
        for i in lab.tb.hosts():
            lab.configs[i].write_text(dual_config(lab, i) + f'\n[security]\nkey_file = "{key}"\n')
            lab.mrcctl(i, "up")
        bad = drops(lab, 1)["rx_bad_mac"] + drops(lab, 1)["rx_no_mac"]
        transfer(lab, 0, 1, v6(1), "16M", 5640)
        transfer(lab, 0, 1, prefix_addrs(1)[1], "4M", 5641)
        assert drops(lab, 1)["rx_bad_mac"] + drops(lab, 1)["rx_no_mac"] == bad
        assert lab.status(0)["overlay"]["mtu"] == 1500 - 56 - 8
    finally:
        for i in lab.tb.hosts():
            lab.configs[i].write_text(dual_config(lab, i))
            lab.mrcctl(i, "up")


SMALL = 1400           # a narrow leaf-spine link: overlay 1344 >= IPv6's 1280


def test_ipv6_tcp_over_a_narrow_link_learns_the_path_mtu(tmp_path):
    """A leaf-spine link narrower than the planes under an IPv6 transfer:
    mrc_rx records the ICMP the leaf sends for our frames, mrc_tx answers
    the inner IPv6 sender with ICMPv6 "packet too big" (tx_too_big), its
    stack lowers the route's MTU to the overlay size those paths carry and
    TCP goes on at that size, intact."""
    with Lab(tmp_path, 2, 1, prefix="v6pm", fabric=dict(spines=2, leaves=2)) as lab:
        for i in lab.tb.hosts():
            j = 1 - i
            text = lab.tb.mrc_config(i, evs=8)
            text = text.replace(f'address = "{lab.overlay(i)}/24"',
                                f'address = ["{lab.overlay(i)}/24", "{v6(i)}/64"]', 1)
            text = text.replace(f'overlay = "{lab.overlay(j)}"', f'overlay = ["{lab.overlay(j)}", "{v6(j)}"]', 1)
            lab.configs[i].write_text(text)
        lab.up(settle=True)
        spines = lab.spines(0, 0, 1)
        evs = list(spines)
        across = [ev for ev, s in spines.items() if s == 1]      # the link leaf 0 - spine 1
        assert 0 < len(across) < len(evs), "some EVs, not all, must cross the narrow link"
        lab.tb.link_mtu(0, 0, 1, SMALL)
        before = drops(lab, 0)
        transfer(lab, 0, 1, v6(1), "16M", 5650)
        after = drops(lab, 0)
        assert after["rx_pmtu"] > before["rx_pmtu"] and after["tx_too_big"] > before["tx_too_big"]
        assert after["tx_too_big_drop"] == before["tx_too_big_drop"]
        route = lab.tb.exec(0, ["ip", "-6", "route", "get", v6(1)]).stdout
        assert f"mtu {SMALL - 56}" in route, route
