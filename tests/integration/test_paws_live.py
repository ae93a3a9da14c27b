"""The PAWS guard end to end (bpf/paws.h): one TCP transfer sprayed with
equal weights over 4 tbf-shaped planes, one of them 5 times slower, whose
queue then holds its segments for milliseconds while later ones overtake
them on the others: they arrive with TCP timestamps older than the newest
the receiver recorded. Linux's PAWS check drops those (TcpExtPAWSEstab)
unless the receive path lifts them. Measured in failover trials before the
guard: hundreds per 3 s transfer over equal 500 Mbit/s planes, and a 200 ms
RTO when the dropped segment was the one the window waited for (equal
planes reorder that much only while their queues fill, which a full test
run on 2 cores did not always bring about)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lab import XFER, Lab


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with Lab(tmp_path_factory.mktemp("paws"), 2, 4, rates=["500mbit"] * 3 + ["100mbit"], prefix="pw1",
             evs=2) as lab:
        lab.up(settle=True)
        yield lab


def test_reordered_segments_are_not_dropped_by_paws(lab):
    before = lab.nstat(1)
    lifted0 = lab.status(1)["health"]["paws_lifted"]
    recv = lab.start_receiver(1, 5401, timeout=60)
    send = lab.tb.popen(0, [sys.executable, XFER, "send", "--to", lab.overlay(1), "--port", "5401",
                            "--bytes", "64M", "--repeat", "2", "--seed", "5", "--timeout", "60"],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sent, got = lab.result(send, 90), lab.result(recv, 90)
    after = lab.nstat(1)
    lifted = lab.status(1)["health"]["paws_lifted"] - lifted0
    paws_drops = after.get("TcpExtPAWSEstab", 0) - before.get("TcpExtPAWSEstab", 0)
    assert sent["sha256"] == got["sha256"]
    # the reordering PAWS refuses happened, and the guard took it
    print(f"lifted {lifted}, PAWS drops {paws_drops}")
    assert lifted >= 50, f"only {lifted} timestamps lifted: no reordering to guard against?"
    # what still reaches PAWS: two receive CPUs racing on a flow's slot
    assert paws_drops <= max(10, lifted // 20), f"{paws_drops} PAWS drops against {lifted} lifted"
