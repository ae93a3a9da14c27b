"""Next hops asked of the kernel in one batch (topology.next_hops): what the
agent and `up` use to put a gateway's MAC on every frame toward a peer
behind it; and the peers' routes added in one batch (routes_replace), the
same routes iproute2 gives one `ip route replace` each. Real routes in a namespace of the
test's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mrcctl.datapath import netdev

NS = f"nh{os.getpid() % 10000}"
ASK = """
import json, socket, sys
from mrcctl.instance import topology
qs = json.loads(sys.stdin.read())
idx = socket.if_nametoindex("va")
got = topology.next_hops([(idx, q) for q in qs])
print(json.dumps([got[(idx, q)] for q in qs]))
"""


def ip(*args: str) -> None:
    subprocess.run(["ip", "-n", NS, *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def ns():
    subprocess.run(["ip", "netns", "add", NS], check=True)
    try:
        ip("link", "add", "va", "type", "veth", "peer", "name", "vb")
        ip("link", "set", "va", "up")
        ip("link", "set", "vb", "up")
        ip("addr", "add", "10.77.0.1/24", "dev", "va")
        ip("addr", "add", "fd77::1/64", "dev", "va", "nodad")
        ip("route", "add", "10.78.0.0/16", "via", "10.77.0.254", "dev", "va")
        ip("-6", "route", "add", "fd78::/48", "via", "fd77::fe", "dev", "va")
        # a gateway on another family (RTA_VIA): IPv4 peers behind an IPv6 next hop
        ip("route", "add", "10.79.0.0/16", "via", "inet6", "fd77::fd", "dev", "va")
        yield NS
    finally:
        subprocess.run(["ip", "netns", "del", NS], check=False)


def ask(queries: list[str]) -> list[str]:
    r = subprocess.run(["ip", "netns", "exec", NS, sys.executable, "-c", ASK], input=json.dumps(queries),
                       capture_output=True, text=True, check=True, cwd=os.path.dirname(os.path.dirname(
                           os.path.dirname(os.path.abspath(__file__)))))
    return json.loads(r.stdout)


def test_the_gateway_of_a_routed_peer_and_the_peer_itself_on_link(ns):
    assert ask(["10.77.0.9", "10.78.3.4", "fd77::9", "fd78::1:4", "10.79.0.1"]) == \
        ["10.77.0.9", "10.77.0.254", "fd77::9", "fd77::fe", "fd77::fd"]


def test_an_address_without_a_route_is_its_own_next_hop(ns):
    # no default route in this namespace: the kernel refuses, the answer is the address
    assert ask(["10.99.0.1", "10.78.0.1", "fd99::1"]) == ["10.99.0.1", "10.77.0.254", "fd99::1"]


def test_more_lookups_than_one_send_all_answered_in_order(ns):
    n = netdev.RTNL_BATCH * 2 + 17
    queries = [f"10.{77 + k % 2 * 1}.{k // 250}.{k % 250 + 1}" for k in range(n)]
    want = ["10.77.0.254" if q.startswith("10.78.") else q for q in queries]
    assert ask(queries) == want


REPLACE = """
import json, sys
from mrcctl.instance import topology
dev, rto, dsts = json.loads(sys.stdin.read())
with topology.Netlink() as nl:
    print(json.dumps(nl.routes_replace(dsts, dev, rto)))
"""


def ip_replace(dev: str, rto: int, dsts: list[str]) -> None:
    """The same routes by iproute2, one `ip route replace` each: the reference."""
    lock = f" rto_min {rto}ms" if rto else ""   # iproute2 locks it
    cmds = "".join(f"route replace {d} dev {dev} proto static{'' if ':' in d else ' scope link'}{lock}\n"
                   for d in dsts)
    subprocess.run(["ip", "-n", NS, "-batch", "-"], input=cmds, text=True, check=True)


def replace(dev: str, rto: int, dsts: list[str]) -> list:
    r = subprocess.run(["ip", "netns", "exec", NS, sys.executable, "-c", REPLACE],
                       input=json.dumps([dev, rto, dsts]), capture_output=True, text=True, check=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    return json.loads(r.stdout)


def routes_on(dev: str) -> list[str]:
    out = []
    for fam in ("-4", "-6"):
        r = subprocess.run(["ip", "-n", NS, "-d", fam, "route", "show", "dev", dev], check=True,
                           capture_output=True, text=True)
        out += [ln for ln in r.stdout.splitlines() if "fe80" not in ln]
    return out


@pytest.mark.parametrize("rto", [200, 0])
def test_routes_added_in_one_batch_are_the_routes_added_one_at_a_time(ns, rto):
    dsts = [f"172.31.{k // 250}.{k % 250 + 1}/32" for k in range(netdev.RTNL_BATCH + 40)] + \
        ["10.244.3.0/24", "fd31::5/128", "fd00:3::/64"]
    ip("link", "add", "ov1", "type", "veth", "peer", "name", "ov2")
    try:
        ip("link", "set", "ov1", "up")
        ip("link", "set", "ov2", "up")
        ip_replace("ov1", rto, dsts)
        one = routes_on("ov1")
        assert len(one) == len(dsts) and all(("rto_min lock 200ms" in ln) == bool(rto) for ln in one), one[:3]
        ip("link", "set", "ov2", "down")     # flushes ov1's routes (no carrier)
        ip("link", "set", "ov1", "down")
        ip("link", "set", "ov1", "up")
        ip("link", "set", "ov2", "up")
        assert routes_on("ov1") == []
        assert replace("ov1", rto, dsts) == []
        assert routes_on("ov1") == one
        assert replace("ov1", rto, dsts) == [] and routes_on("ov1") == one     # replaced, not added
        # a failure names its route and the errno: a device that is down takes no IPv4 route
        ip("link", "set", "ov1", "down")
        failed = replace("ov1", rto, ["172.31.200.1/32"])
        assert failed == [["172.31.200.1/32", 100]], failed       # ENETDOWN
    finally:
        subprocess.run(["ip", "-n", NS, "link", "del", "ov1"], check=False)
