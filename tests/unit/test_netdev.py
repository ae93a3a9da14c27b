"""netdev.root_qdiscs: each device's root queue and shaper rate, parsed from
one RTM_GETQDISC dump (what the adaptive weights read), against tbf qdiscs
tc set up in a namespace of this test's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from unit_dp import need_root

REPO = Path(__file__).resolve().parents[2]
READ = ("import json, socket, sys; sys.path.insert(0, %r)\n"
        "from mrcctl.datapath.netdev import root_qdiscs\n"
        "q = root_qdiscs()\n"
        "print(json.dumps({d: q.get(socket.if_nametoindex(d)) for d in ('qa', 'qb', 'lo')}))")


def test_root_qdiscs_reads_shaper_rates_and_backlog():
    need_root()
    ns = f"mrcnd{os.getpid() % 100000}"
    sh = lambda *a: subprocess.run(["ip", "netns", "exec", ns, *a], check=True, capture_output=True, text=True)
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        sh("ip", "link", "add", "qa", "type", "veth", "peer", "name", "qb")
        for d in ("qa", "qb", "lo"):
            sh("ip", "link", "set", d, "up")
        sh("ip", "addr", "add", "10.99.0.1/24", "dev", "qa")
        sh("ip", "neigh", "add", "10.99.0.2", "lladdr", "02:00:00:00:00:02", "dev", "qa")
        # 1 Mbit/s with room for 200 frames: what is sent stays queued for a while
        sh("tc", "qdisc", "add", "dev", "qa", "root", "tbf", "rate", "1mbit", "burst", "3000", "limit", "300000")
        # above 2^32 bytes/s the kernel gives the rate in TCA_TBF_RATE64
        sh("tc", "qdisc", "add", "dev", "qb", "root", "tbf", "rate", "40gbit", "burst", "1mb", "latency", "10ms")
        sh(sys.executable, "-c", "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
           "for _ in range(100): s.sendto(bytes(1400), ('10.99.0.2', 9))")
        got = json.loads(sh(sys.executable, "-c", READ % str(REPO)).stdout)
        tc = json.loads(sh("tc", "-s", "-j", "qdisc", "show", "dev", "qa").stdout)[0]
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    backlog_a, rate_a = got["qa"]
    assert rate_a == 1_000_000 // 8
    assert got["qb"] == [0, 40_000_000_000 // 8]
    assert got["lo"] == [0, None]           # noqueue: a root qdisc without a shaper
    # tens of the 1442-byte frames are still queued (the socket's send buffer
    # holds back the rest), and tc, asked right after, agrees: 1 Mbit/s
    # drains about 87 frames a second, and starting tc took 60 ms in a CI run
    assert 20 * 1442 <= backlog_a <= 100 * 1442
    assert backlog_a - 20 * 1442 <= tc["backlog"] <= backlog_a


FEATURES = ("import json, sys; sys.path.insert(0, %r)\n"
            "from mrcctl.datapath import netdev\n"
            "from pyroute2.ethtool import Ethtool\n"
            "e = Ethtool()\n"
            "def theirs(d, n):\n"
            "    f = e.get_features(d).features.get(n)\n"
            "    return bool(f.enable) if f is not None and f.available else None\n"
            "names = ('tx-udp-segmentation', 'rx-gro-hw', 'generic-receive-offload', 'no-such-feature')\n"
            "out = {'before': [[netdev.feature(d, n), theirs(d, n)] for d in ('fa', 'lo') for n in names]}\n"
            "netdev.set_feature('fa', 'tx-udp-segmentation', False)\n"
            "out['off'] = [netdev.feature('fa', 'tx-udp-segmentation'), theirs('fa', 'tx-udp-segmentation'),\n"
            "              netdev.feature('fb', 'tx-udp-segmentation')]\n"
            "netdev.set_feature('fa', 'tx-udp-segmentation', True)\n"
            "out['on'] = netdev.feature('fa', 'tx-udp-segmentation')\n"
            "try:\n"
            "    netdev.set_feature('fa', 'no-such-feature', True)\n"
            "except OSError as err:\n"
            "    out['refused'] = str(err)\n"
            "print(json.dumps(out))")


def test_ethtool_features_read_and_set_like_ethtool():
    """netdev.feature/set_feature (the SIOCETHTOOL ioctl `up` uses on
    virtual planes) against pyroute2's ethtool, on a veth pair of this
    test's own namespace: fixed features read None, a change reaches only
    the device named."""
    need_root()
    ns = f"mrcnf{os.getpid() % 100000}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        sh = lambda *a: subprocess.run(["ip", "netns", "exec", ns, *a], check=True, capture_output=True,
                                       text=True)
        sh("ip", "link", "add", "fa", "type", "veth", "peer", "name", "fb")
        got = json.loads(sh(sys.executable, "-c", FEATURES % str(REPO)).stdout)
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=True)
    assert all(ours == theirs for ours, theirs in got["before"]), got["before"]
    # a veth can switch UDP GSO; hardware GRO it has not (None: fixed)
    assert got["before"][0][0] is True and got["before"][1][0] is None and got["before"][3][0] is None
    assert got["off"] == [False, False, True]
    assert got["on"] is True
    assert "no ethtool feature no-such-feature" in got["refused"]
