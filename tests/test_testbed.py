"""Integration tests of the testbed (mrcctl/lab/testbed.py, scripts/testbed.py) with real network namespaces.

Each test uses its own short prefix ("tb{pid}{letter}") and removes what it
built. Skipped unless run as root with `ip` available.
"""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from mrcctl.lab import testbed as tbmod  # noqa: E402
from mrcctl.lab.testbed import Testbed, cleanup, overlay_addr, parse_rate, tbf_burst  # noqa: E402

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)"),
    pytest.mark.skipif(shutil.which("ip") is None or shutil.which("tc") is None, reason="needs iproute2"),
]

needs_ping = pytest.mark.skipif(shutil.which("ping") is None, reason="needs ping (iputils-ping)")


def _prefix(tag: str) -> str:
    return f"tb{os.getpid() % 10000}{tag}"


def _nses(prefix: str) -> list[str]:
    return tbmod.list_namespaces(prefix)


# -------------------------------------------------------------------------
# pure functions (no root needed, but cheap enough to keep here)


def test_parse_rate_and_burst():
    assert parse_rate("1gbit") == 10**9
    assert parse_rate("500mbit") == 500 * 10**6
    assert parse_rate("100kbit") == 100_000
    assert parse_rate("2mbps") == 16 * 10**6
    assert parse_rate(None) is None and parse_rate("none") is None
    assert tbf_burst(10**9) == 500_000
    assert tbf_burst(10 * 10**6) == 16 * 1024
    with pytest.raises(tbmod.TestbedError):
        parse_rate("fast")


def test_naming_and_addresses_are_deterministic():
    tb = Testbed(hosts=3, planes=4, ipv6=True, prefix="tbnames")
    assert tb.ns(0) == "tbnames-h0" and tb.ns(2) == "tbnames-h2"
    assert tb.planes(0, 1) == ["p0h1", "p1h1", "p2h1", "p3h1"]
    assert tb.planes(1, 0) == ["p0h0", "p1h0", "p2h0", "p3h0"]
    assert tb.planes(2, 1) == ["p0h1", "p1h1", "p2h1", "p3h1"]
    assert tb.addr(0, 1, 2) == "10.202.0.1" and tb.addr(1, 0, 2) == "10.202.0.2"
    assert tb.addr(0, 2, 0) == "10.200.1.1" and tb.addr(2, 0, 0) == "10.200.1.3"
    assert tb.addr(1, 2, 3) == "10.203.2.2" and tb.addr(2, 1, 3) == "10.203.2.3"
    assert tb.addr(0, 1, 1, family=6) == "fd00:1::1"
    assert tb.addr(2, 1, 3, family=6) == "fd00:3:2::3"
    assert overlay_addr(0) == "172.31.0.1" and tb.overlay_addr(2) == "172.31.0.3"
    # all underlay addresses and MACs distinct
    addrs = [tb.addr(i, j, p, f) for i in range(3) for j in range(3) if i != j for p in range(4) for f in (4, 6)]
    assert len(addrs) == len(set(addrs))
    macs = [tb.mac(i, j, p) for i in range(3) for j in range(3) if i != j for p in range(4)]
    assert len(macs) == len(set(macs))
    assert all(len(d) <= 15 for i in range(3) for j in range(3) if i != j for d in tb.planes(i, j))
    with pytest.raises(tbmod.TestbedError):
        tb.addr(0, 0, 0)
    with pytest.raises(tbmod.TestbedError):
        Testbed(prefix="bad-prefix")


# -------------------------------------------------------------------------
# real namespaces


@pytest.fixture(scope="module")
def bed():
    tb = Testbed(hosts=2, planes=2, prefix=_prefix("a"))
    with tb:
        yield tb
    assert _nses(tb.prefix) == []


@needs_ping
def test_ping_every_plane_ipv4(bed):
    assert _nses(bed.prefix) == [bed.ns(0), bed.ns(1)]
    for p in range(2):
        assert bed.ping(0, 1, p, count=2), f"plane {p} h0->h1"
        assert bed.ping(1, 0, p, count=1), f"plane {p} h1->h0"


def test_settings(bed):
    for i in (0, 1):
        out = bed.exec(i, ["sh", "-c", "cat /proc/sys/net/ipv4/conf/all/rp_filter "
                                       "/proc/sys/net/ipv4/conf/default/rp_filter"]).stdout.split()
        assert out == ["0", "0"]
        for d in bed.planes(i, 1 - i):
            assert bed.exec(i, ["cat", f"/proc/sys/net/ipv4/conf/{d}/rp_filter"]).stdout.strip() == "0"
            qd = bed.exec(i, ["tc", "qdisc", "show", "dev", d]).stdout
            assert "pfifo" in qd and "limit 1000p" in qd
            link = bed.exec(i, ["ip", "-o", "link", "show", "dev", d]).stdout
            assert "mtu 1500" in link and bed.mac(i, 1 - i, int(d[1])) in link
        assert "UP" in bed.exec(i, ["ip", "-o", "link", "show", "dev", "lo"]).stdout


@needs_ping
def test_blackhole_and_restore(bed):
    try:
        bed.blackhole(0, 1)
        assert not bed.ping(0, 1, 1, count=2, timeout=0.5), "blackholed plane still answers"
        assert bed.ping(0, 1, 0), "other plane must be unaffected"
        assert "blackhole" in bed.device_status(0, 1, 1)["faults"]
    finally:
        bed.blackhole(0, 1, on=False)
    assert bed.device_status(0, 1, 1)["faults"] == []
    assert bed.ping(0, 1, 1, count=2)


@needs_ping
def test_loss_is_silent_and_roughly_right(bed):
    try:
        bed.loss(1, 0, 50)
        cp = bed.exec(1, ["ping", "-n", "-q", "-f", "-c", "400", "-W", "0.3", bed.addr(0, 1, 0)],
                      check=False, timeout=60)
        # "400 packets transmitted, N received": loss looks like wire loss, not ENOBUFS
        line = next(ln for ln in cp.stdout.splitlines() if "transmitted" in ln)
        sent, recv = int(line.split()[0]), int(line.split(",")[1].split()[0])
        assert sent == 400
        assert 100 <= recv <= 300, line
    finally:
        bed.loss(1, 0, 0)
    assert bed.device_status(1, 0, 0)["faults"] == []


@needs_ping
def test_carrier_down_up(bed):
    try:
        bed.carrier(1, 0, up=False)
        st = bed.device_status(0, 1, 0)
        assert st["no_carrier"] or st["state"] != "UP"
        assert not bed.ping(0, 1, 0, count=1, timeout=0.5)
        assert bed.ping(0, 1, 1)
    finally:
        bed.carrier(1, 0, up=True)
    deadline = time.monotonic() + 5
    while not bed.ping(0, 1, 0, count=1, timeout=0.5):
        assert time.monotonic() < deadline, "plane 0 did not come back after carrier up"


def test_set_rate(bed):
    try:
        bed.set_rate(0, 1, "200mbit")
        for i in (0, 1):
            qd = bed.exec(i, ["tc", "qdisc", "show", "dev", bed.dev(i, 1 - i, 1)]).stdout
            assert "tbf" in qd and "rate 200Mbit" in qd
    finally:
        bed.set_rate(0, 1, None)
    assert "pfifo" in bed.exec(0, ["tc", "qdisc", "show", "dev", bed.dev(0, 1, 1)]).stdout


def test_exec_raises_with_stderr(bed):
    with pytest.raises(subprocess.CalledProcessError) as ei:
        bed.exec(0, ["ip", "link", "show", "dev", "nosuchdev"])
    assert "nosuchdev" in str(ei.value) or "does not exist" in str(ei.value)
    assert bed.exec(0, "true").returncode == 0
    assert bed.exec(0, ["false"], check=False).returncode == 1


def test_attach_and_status(bed):
    tb2 = Testbed.attach(bed.prefix)
    assert (tb2.n_hosts, tb2.n_planes, tb2.ipv6) == (2, 2, False)
    st = tb2.status()
    assert st["up"] and st["namespaces"] == [bed.ns(0), bed.ns(1)]
    devs = {d["dev"]: d for d in st["host_info"][0]["devices"]}
    assert devs["p0h1"]["live"]["state"] == "UP" and devs["p0h1"]["addr4"] == "10.200.0.1"


# -------------------------------------------------------------------------


@needs_ping
def test_ipv6_and_rates():
    pre = _prefix("b")
    with Testbed(hosts=2, planes=2, ipv6=True, rates=["300mbit", None], prefix=pre) as tb:
        for p in range(2):
            assert tb.ping(0, 1, p, family=6, count=2), f"IPv6 plane {p}"
            assert tb.ping(1, 0, p, family=4), f"IPv4 plane {p}"
        for i in (0, 1):
            qd0 = tb.exec(i, ["tc", "qdisc", "show", "dev", tb.dev(i, 1 - i, 0)]).stdout
            assert "tbf" in qd0 and "rate 300Mbit" in qd0 and "lat 20ms" in qd0
            assert "pfifo" in tb.exec(i, ["tc", "qdisc", "show", "dev", tb.dev(i, 1 - i, 1)]).stdout
        # IPv6 address survives a carrier flap (keep_addr_on_down)
        tb.carrier(0, 1, False)
        tb.carrier(0, 1, True)
        assert tb.addr(0, 1, 1, 6) in tb.exec(0, ["ip", "-6", "addr", "show", "dev", tb.dev(0, 1, 1)]).stdout
        deadline = time.monotonic() + 5
        while not tb.ping(0, 1, 1, family=6, count=1, timeout=0.5):
            assert time.monotonic() < deadline
        tb.blackhole(1, 0, both=True)
        assert not tb.ping(0, 1, 0, family=6, count=1, timeout=0.5)
        assert "blackhole" in tb.device_status(0, 1, 0)["faults"]
    assert _nses(pre) == []


@pytest.mark.skipif(shutil.which("iperf3") is None, reason="needs iperf3")
def test_tbf_shapes_tcp():
    pre = _prefix("c")
    with Testbed(hosts=2, planes=1, rates="200mbit", prefix=pre) as tb:
        srv = tb.popen(1, ["iperf3", "-s", "-1", "-B", tb.addr(1, 0, 0)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        res = {}
        for _ in range(30):  # wait for the server; iperf3 -J may exit 0 on "connection refused"
            cp = tb.exec(0, ["iperf3", "-c", tb.addr(1, 0, 0), "-t", "2", "-J"], check=False, timeout=30)
            try:
                res = json.loads(cp.stdout)
            except ValueError:
                res = {"error": cp.stdout[-300:] + cp.stderr[-300:]}
            if "error" not in res:
                break
            time.sleep(0.1)
        assert "error" not in res, res.get("error")
        bps = res["end"]["sum_received"]["bits_per_second"]
        assert 150e6 < bps < 210e6, bps
        srv.wait(timeout=10)
    assert _nses(pre) == []


def test_three_hosts_full_mesh():
    pre = _prefix("d")
    with Testbed(hosts=3, planes=2, prefix=pre) as tb:
        assert _nses(pre) == [tb.ns(0), tb.ns(1), tb.ns(2)]
        for i in range(3):
            links = tb.exec(i, ["ip", "-o", "link", "show"]).stdout
            for j in tb.peers(i):
                for d in tb.planes(i, j):
                    assert f" {d}@" in links
        if shutil.which("ping"):
            assert tb.ping(0, 2, 1) and tb.ping(1, 2, 0) and tb.ping(0, 1, 0)
    assert _nses(pre) == []


def test_down_is_idempotent_and_survives_half_built(monkeypatch):
    pre = _prefix("e")
    tb = Testbed(hosts=2, planes=2, prefix=pre)
    tb.down()  # nothing there yet
    # half-built: only one namespace exists, plus a running process inside it
    subprocess.run(["ip", "netns", "add", tb.ns(0)], check=True)
    tb.popen(0, ["sleep", "60"])
    tb.down()
    tb.down()
    assert _nses(pre) == []
    # a build that fails half-way cleans up after itself
    def broken(self, i, cmds):
        raise tbmod.TestbedError("injected failure")

    monkeypatch.setattr(Testbed, "_tc_batch", broken)
    with pytest.raises(tbmod.TestbedError):
        tb.up()
    assert _nses(pre) == []
    assert not os.path.exists(tbmod.state_path(pre))
    cleanup(pre)


def test_context_manager_cleans_up_on_exception():
    pre = _prefix("f")
    with pytest.raises(RuntimeError):
        with Testbed(hosts=2, planes=1, prefix=pre) as tb:
            assert _nses(pre) == [tb.ns(0), tb.ns(1)]
            raise RuntimeError("boom")
    assert _nses(pre) == []


def test_cli_up_status_down():
    pre = _prefix("g")
    script = os.path.join(ROOT, "scripts", "testbed.py")
    try:
        cp = subprocess.run([sys.executable, script, "up", "--hosts", "2", "--planes", "2",
                             "--rate", "100mbit", "--prefix", pre, "--json"],
                            capture_output=True, text=True, timeout=60)
        assert cp.returncode == 0, cp.stderr
        lay = json.loads(cp.stdout)
        assert lay["namespaces"] == [f"{pre}-h0", f"{pre}-h1"] and lay["rates"] == ["100mbit"] * 2
        cp = subprocess.run([sys.executable, script, "blackhole", "--host", "0", "--plane", "1",
                             "--prefix", pre], capture_output=True, text=True, timeout=60)
        assert cp.returncode == 0, cp.stderr
        cp = subprocess.run([sys.executable, script, "status", "--prefix", pre],
                            capture_output=True, text=True, timeout=60)
        assert cp.returncode == 0 and "FAULT: blackhole" in cp.stdout and "tbf 100Mbit" in cp.stdout, cp.stdout
    finally:
        cp = subprocess.run([sys.executable, script, "down", "--prefix", pre],
                            capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert _nses(pre) == []
