"""Issue #13 items 2 and 12 end to end, two hosts, real programs:

* a UDP GSO sender (UDP_SEGMENT) through plain and hedged paths: every
  datagram arrives exactly once (sha256), the receiver's accounting sees no
  false duplicate or loss;
* VXLAN from a "container network" over the overlay: single packets carried
  (ping, UDP, TCP with segmentation offload off on the VXLAN device, sha256),
  GSO units of the nested tunnel refused under tx_nested_gso, never as an
  unexplained drop.
"""

from __future__ import annotations

import json
import re
import sys
import time

import pytest

from lab import XFER, Lab

SEG = 1200                 # UDP_SEGMENT size
PER_SEND = 20              # datagrams per GSO unit
SENDS = 150

UDP_RECV = r"""
import hashlib, json, socket, sys
bind, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 20)
s.bind((bind, port))
open(sys.argv[4], "w").close()
s.settimeout(5)
got, dups = {}, 0
try:
    while len(got) < n:
        d = s.recv(65536)
        k = int.from_bytes(d[:4], "big")
        dups += k in got
        got[k] = d
except socket.timeout:
    pass
h = hashlib.sha256(b"".join(got[k] for k in sorted(got)))
print(json.dumps({"datagrams": len(got), "dups": dups, "sha256": h.hexdigest()}))
"""

UDP_SEND = r"""
import hashlib, json, random, socket, sys, time
dst, port, sends, per, seg = sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:6])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_UDP, 103, seg)          # UDP_SEGMENT: one GSO unit per send
s.connect((dst, port))
rng, h, k = random.Random(7), hashlib.sha256(), 0
for _ in range(sends):
    buf = b""
    for _ in range(per):
        d = k.to_bytes(4, "big") + rng.randbytes(seg - 4)
        h.update(d)
        buf += d
        k += 1
    s.send(buf)
    time.sleep(0.002)
print(json.dumps({"datagrams": k, "sha256": h.hexdigest()}))
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with Lab(tmp_path_factory.mktemp("rxsafe"), hosts=2, planes=2, prefix="mvrx", evs=2) as lab:
        lab.up()
        yield lab


def drops(lab, i):
    return lab.status(i)["drops"]


def reorder(lab, i):
    return lab.status(i)["peers"][0]["reorder"]


def udp_gso_transfer(lab, port):
    ready = lab.tmp / f"udp-ready-{port}"
    ready.unlink(missing_ok=True)
    n = SENDS * PER_SEND
    recv = lab.tb.popen(1, [sys.executable, "-c", UDP_RECV, lab.overlay(1), port, n, ready],
                        stdout=-1, stderr=-1, text=True)
    deadline = time.monotonic() + 10
    while not ready.exists():
        assert recv.poll() is None and time.monotonic() < deadline, recv.stderr.read()
        time.sleep(0.02)
    send = lab.tb.exec(0, [sys.executable, "-c", UDP_SEND, lab.overlay(1), port, SENDS, PER_SEND, SEG],
                       timeout=60)
    out, err = recv.communicate(timeout=30)
    return json.loads(send.stdout), json.loads(out or "{}" if not err else out), n


def test_udp_gso_units_arrive_whole_plain_and_hedged(lab):
    """Also with the receiver decapsulating at tc ingress, where a unit that
    crossed the veth whole would be handed on whole and dropped by the UDP
    socket: the sender's `up` turned tx-udp-segmentation off on its planes,
    so such units leave segmented."""
    for phase, extra, port in (("plain", "", 6001), ("hedged", '[health]\nhedge = "always"\n', 6002),
                               ("plain, tc hook", "", 6003)):
        for i in (0, 1):
            lab.write_config(i, evs=2, extra=extra, rx_hook="tc" if "tc hook" in phase else "xdp")
            lab.mrcctl(i, "up")
        lab.settle()                         # neighbours resolved: hedged copies leave
        d0, r0, tx0 = drops(lab, 1), reorder(lab, 1), lab.status(0)
        sent, got, n = udp_gso_transfer(lab, port)
        d1, r1 = drops(lab, 1), reorder(lab, 1)
        assert sent["datagrams"] == n
        assert got["datagrams"] == n and got["dups"] == 0, (phase, got)
        assert got["sha256"] == sent["sha256"], phase
        dup_drops = d1["rx_duplicate"] - d0["rx_duplicate"]
        lost = (r1["lost"] - r1["late"] - r1["unmarked"]) - (r0["lost"] - r0["late"] - r0["unmarked"])
        assert lost <= 0, (phase, r0, r1)
        hedged = lab.status(0)["health"]["hedged"] - tx0["health"]["hedged"]
        if phase == "plain, tc hook":
            # the receiver answers one-way traffic with feedback frames on a
            # tc plane, so the sender's judge runs and may hedge a unit of a
            # path it finds late: then only those copies are duplicates
            assert r1["dup"] - r0["dup"] == dup_drops and (dup_drops == 0 or hedged > 0), (r0, r1, hedged)
        elif phase == "plain":
            # one wire PSN per datagram: no duplicate anywhere
            assert dup_drops == 0 and r1["dup"] == r0["dup"], (r0, r1)
            assert r1["rx_packets"] - r0["rx_packets"] >= n
        else:
            # each datagram's second copy and nothing else
            assert 0 < dup_drops <= n, dup_drops
            assert r1["dup"] - r0["dup"] == dup_drops
            # a unit goes unhedged when no partner is fresh (hedge.h: one
            # overdue by dead_after would not help); one-way traffic's
            # evidence is the receiver's rate-limited feedback frames. CI
            # runs after this session's merges hedged 79-82 % of the units
            # (>= 90 % before; not yet explained, see the stop note)
            assert hedged >= SENDS * 0.6, hedged
    for i in (0, 1):
        lab.write_config(i, evs=2)
        lab.mrcctl(i, "up")


def test_udp_gso_off_on_virtual_planes_while_up(lab):
    """`up` turns tx-udp-segmentation off on a veth plane (and records that
    it did); `down` turns it back on. With the tc hook on both ends: a peer's
    XDP program takes the feature away from this end by itself."""
    dev = lab.tb.dev(0, 1, 0)

    def feature() -> str:
        return re.search(r"tx-udp-segmentation: (\w+)", lab.tb.exec(0, ["ethtool", "-k", dev]).stdout)[1]

    try:
        for i in (1, 0):
            lab.write_config(i, evs=2, rx_hook="tc")
            lab.mrcctl(i, "up")
        assert feature() == "off"
        lab.mrcctl(0, "down")
        assert feature() == "on"
        lab.mrcctl(0, "up")
        assert feature() == "off"
    finally:
        for i in (0, 1):
            lab.write_config(i, evs=2)
            lab.mrcctl(i, "up")


VX = {0: "172.31.9.1", 1: "172.31.9.2"}


def test_vxlan_over_the_overlay(lab):
    for i in (0, 1):
        lab.tb.exec(i, ["ip", "link", "add", "vx0", "type", "vxlan", "id", "42", "dstport", "4789",
                        "local", lab.overlay(i), "remote", lab.overlay(1 - i), "dev", "mrc0"])
        lab.tb.exec(i, ["ip", "addr", "add", f"{VX[i]}/24", "dev", "vx0"])
        lab.tb.exec(i, ["ip", "link", "set", "vx0", "up"])
    try:
        d0 = drops(lab, 0)
        r = lab.tb.exec(0, ["ping", "-c", "3", "-i", "0.2", "-W", "1", VX[1]], check=False)
        assert r.returncode == 0, r.stdout + r.stderr
        # TCP with the VXLAN device's segmentation off: every packet single,
        # already encapsulated (checksum offload): carried byte for byte
        for i in (0, 1):
            lab.tb.exec(i, ["ethtool", "-K", "vx0", "tso", "off", "gso", "off"])
        ready = lab.tmp / "vx-ready"
        ready.unlink(missing_ok=True)
        recv = lab.tb.popen(1, [sys.executable, XFER, "recv", "--bind", VX[1], "--port", "6100",
                                "--timeout", "60", "--ready-file", str(ready)],
                            stdout=-1, stderr=-1, text=True)
        deadline = time.monotonic() + 10
        while not ready.exists():
            assert recv.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        send = lab.tb.popen(0, [sys.executable, XFER, "send", "--to", VX[1], "--port", "6100",
                                "--bytes", "8M", "--seed", "3", "--timeout", "60"],
                            stdout=-1, stderr=-1, text=True)
        s, rv = Lab.result(send, 90), Lab.result(recv, 90)
        assert s["bytes"] == rv["bytes"] == 8 << 20 and s["sha256"] == rv["sha256"]
        d1 = drops(lab, 0)
        assert d1["tx_encap_fail"] == d0["tx_encap_fail"]
        assert d1["tx_nested_gso"] == d0["tx_nested_gso"]
        # with segmentation offload on, the nested tunnel's GSO units are
        # refused and counted (one level of tunnel offload only)
        for i in (0, 1):
            lab.tb.exec(i, ["ethtool", "-K", "vx0", "tso", "on", "gso", "on"])
        ready.unlink(missing_ok=True)
        recv = lab.tb.popen(1, [sys.executable, XFER, "recv", "--bind", VX[1], "--port", "6101",
                                "--timeout", "8", "--ready-file", str(ready)],
                            stdout=-1, stderr=-1, text=True)
        deadline = time.monotonic() + 10
        while not ready.exists():
            assert recv.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        send = lab.tb.popen(0, [sys.executable, XFER, "send", "--to", VX[1], "--port", "6101",
                                "--bytes", "4M", "--seed", "4", "--timeout", "5"],
                            stdout=-1, stderr=-1, text=True)
        send.communicate(timeout=30)
        # what arrives is not the point (the units are refused); the sender's
        # orphaned socket may go on retransmitting single segments for long
        # after it exits, and each one restarts the receiver's idle timeout
        recv.kill()
        recv.communicate(timeout=30)
        d2 = drops(lab, 0)
        assert d2["tx_nested_gso"] > d1["tx_nested_gso"]
        assert d2["tx_encap_fail"] == d0["tx_encap_fail"]
    finally:
        for i in (0, 1):
            lab.tb.exec(i, ["ip", "link", "del", "vx0"], check=False)
