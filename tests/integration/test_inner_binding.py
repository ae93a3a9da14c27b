"""Issue #13.7: inner addresses are bound to the peer.

A configured peer (h0) sends well-formed MRC frames to h1 from its own
underlay address on its own plane, crafted by hand (a UDP socket in h0's
namespace carrying an MRC header and an inner IPv4/UDP packet). Those whose
inner source is another overlay address (h2's, an unused one) or whose inner
destination is not h1's must not reach a UDP socket on h1; the same frames
with h0's own inner source must. Real traffic keeps flowing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab import Lab
from mrcctl.datapath import abi as wire

REPO = Path(__file__).resolve().parents[2]
PORT = 5301
N = 20

# Sends N crafted MRC DATA frames: argv = src_underlay dst_underlay ev path_id
# psn0 inner_src inner_dst inner_dport.
SENDER = r"""
import socket, struct, sys
sys.path.insert(0, sys.argv[9])
from mrcctl.datapath import abi as wire
src, dst, ev, pid, psn0, isrc, idst, dport = sys.argv[1:9]
def ipv4(s, d, payload):
    h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0, 0x4000, 64, 17, 0,
                    socket.inet_aton(s), socket.inet_aton(d))
    return h[:10] + struct.pack("!H", wire.inet_csum(h)) + h[12:] + payload
sk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sk.bind((src, int(ev)))
for k in range(%d):
    body = b"spoof-%%02d" %% k
    inner = ipv4(isrc, idst, struct.pack("!HHHH", 40000, int(dport), 8 + len(body), 0) + body)
    hdr = wire.encode_mrc_hdr(wire.MsgType.DATA, path_id=int(pid), psn=int(psn0) + k, tx_ts=k)
    sk.sendto(hdr + inner, (dst, wire.MRC_DEFAULT_UDP_PORT))
""" % N

# Counts datagrams to overlay:port for `secs` seconds, prints the count.
RECEIVER = r"""
import socket, sys, time
sk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sk.bind((sys.argv[1], int(sys.argv[2])))
sk.settimeout(0.2)
open(sys.argv[4], "w").close()
n, end = 0, time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    try:
        sk.recv(2048)
        n += 1
    except socket.timeout:
        pass
print(n)
"""


@pytest.fixture(scope="module")
def lab3(tmp_path_factory):
    with Lab(tmp_path_factory.mktemp("bind"), hosts=3, planes=2, evs=2, prefix="mb") as lab:
        lab.up()
        yield lab


def received(lab, tmp, isrc: str, idst: str, psn0: int) -> int:
    """How many of N crafted frames from h0 (inner isrc -> idst:PORT) a UDP
    socket on h1's overlay address receives."""
    ready = tmp / f"ready-{psn0}"
    recv = lab.tb.popen(1, [sys.executable, "-c", RECEIVER, lab.overlay(1), str(PORT), "2.5", str(ready)],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 10
    while not ready.exists():
        assert recv.poll() is None and time.monotonic() < deadline, recv.stderr.read()
        time.sleep(0.02)
    # path 0 of h0 toward h1: plane 0, EV 49152 (the first EV)
    lab.tb.exec(0, [sys.executable, "-c", SENDER, lab.tb.addr(0, 1, 0), lab.tb.addr(1, 0, 0),
                    str(wire.MRC_DEFAULT_EV_BASE), "0", str(psn0), isrc, idst, str(PORT),
                    str(REPO)])
    out, err = recv.communicate(timeout=20)
    assert recv.returncode == 0, err
    return int(out.strip())


def drops(lab) -> dict:
    return lab.status(1)["drops"]


def test_spoofed_inner_source_is_not_delivered(lab3, tmp_path):
    before = drops(lab3)
    # the crafting is right: h0's own inner source arrives, all N
    assert received(lab3, tmp_path, lab3.overlay(0), lab3.overlay(1), 1_000_000) == N
    # h2's overlay address, an unused one, h1's own: none arrives
    for k, src in enumerate((lab3.overlay(2), "172.31.0.77", lab3.overlay(1))):
        assert received(lab3, tmp_path, src, lab3.overlay(1), 2_000_000 + k * 1000) == 0, src
    # an inner destination that is not h1's (h2's): not delivered by h1
    assert received(lab3, tmp_path, lab3.overlay(0), lab3.overlay(2), 3_000_000) == 0
    after = drops(lab3)
    assert after["rx_inner_src"] - before.get("rx_inner_src", 0) == 3 * N, json.dumps(after)
    assert after["rx_inner_dst"] - before.get("rx_inner_dst", 0) == N, json.dumps(after)


def test_traffic_still_flows(lab3):
    send, recv = lab3.transfer(0, 1, "16M")
    assert recv["bytes"] == send["bytes"] == 16 << 20
    assert recv["sha256"] == send["sha256"]
    send, recv = lab3.transfer(2, 1, "4M", port=5002)
    assert recv["sha256"] == send["sha256"]
    d = drops(lab3)
    assert d.get("rx_wrong_plane", 0) == 0
