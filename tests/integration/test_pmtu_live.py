"""Path MTU and jumbo planes over a routed leaf-spine fabric (bpf/pmtu.h).

One leaf-spine link with a smaller MTU than the planes: the EVs hashed
across it meet a router that answers full-size DF packets with ICMP
"fragmentation needed". mrc_rx records that MTU for exactly those paths and
mrc_tx answers the inner sender with the overlay size they carry, so TCP
shrinks its segments and keeps going instead of stalling on a black hole,
and a UDP sender with DF gets EMSGSIZE.

Jumbo: 9000-byte planes end to end, mrc_rx on multi-buffer XDP frames.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from lab import Lab

EVS = 8
SMALL = 1200           # the narrow link's MTU
OVERHEAD = 56          # outer IPv4 + UDP + MRC


def drops(lab: Lab, i: int) -> dict:
    return lab.status(i)["drops"]


def longest_gap_ms(timeline: str) -> float:
    data = json.loads(open(timeline).read())
    series, best, run = data["bytes"], 0, 0
    for b in series:
        run = run + 1 if b == 0 else 0
        best = max(best, run)
    return best * data["bucket_ms"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with Lab(tmp_path_factory.mktemp("pmtu"), 2, 1, prefix="mxpm", evs=EVS,
             fabric=dict(spines=2, leaves=2)) as lab:
        lab.up(settle=True)
        yield lab


def test_narrow_link_tcp_keeps_going_at_the_path_mtu(lab):
    spines = lab.spines(0, 0, 1)
    evs = list(spines)
    across = [ev for ev, s in spines.items() if s == 1]      # the link leaf 0 - spine 1
    assert 0 < len(across) < len(evs), "some EVs, not all, must cross the narrow link"
    lab.tb.link_mtu(0, 0, 1, SMALL)
    try:
        before0, before1 = drops(lab, 0), drops(lab, 1)
        timeline = str(lab.tmp / "pmtu-timeline.json")
        recv = lab.start_receiver(1, 5701, timeout=60, timeline=timeline)
        send = lab.start_sender(0, 1, "32M", 5701, timeout=60)
        s, r = lab.result(send, 90), lab.result(recv, 90)
        assert s["sha256"] == r["sha256"] and r["bytes"] == 32 << 20
        assert longest_gap_ms(timeline) < 1000, "the transfer stalled"

        after0 = drops(lab, 0)
        # ICMPs from the leaf named our narrow paths; mrc told TCP the size
        assert after0["rx_pmtu"] > before0.get("rx_pmtu", 0)
        assert after0["tx_too_big"] > before0.get("tx_too_big", 0)
        assert after0["rx_pmtu_bad"] == before0.get("rx_pmtu_bad", 0)
        assert drops(lab, 1)["rx_pmtu_bad"] == before1.get("rx_pmtu_bad", 0)
        # only paths across the narrow link carry a recorded MTU (one that
        # no too-big unit happened to take has none yet)
        mtus = {x["ev"]: x.get("mtu") for x in lab.paths(0, "h1")}
        recorded = {ev for ev, m in mtus.items() if m}
        assert recorded and recorded <= set(across), mtus
        assert all(mtus[ev] == SMALL for ev in recorded)
        # the sender's route learned the overlay size those paths carry
        route = lab.tb.exec(0, ["ip", "route", "get", lab.overlay(1)]).stdout
        assert f"mtu {SMALL - OVERHEAD}" in route, route
    finally:
        lab.tb.link_mtu(0, 0, 1)


UDP_DF = textwrap.dedent("""
    import errno, json, socket, sys, time
    IP_MTU_DISCOVER, IP_PMTUDISC_DO, IP_MTU = 10, 2, 14
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
    s.connect((sys.argv[1], 5702))
    err, sent = None, 0
    deadline = time.monotonic() + 5
    while err is None and time.monotonic() < deadline:
        try:
            s.send(b"u" * 1400)
            sent += 1
        except OSError as e:
            if e.errno != errno.ECONNREFUSED:   # nobody listens: the peer says so
                err = e.errno
        time.sleep(0.002)
    print(json.dumps({"sent": sent, "errno": err,
                      "mtu": s.getsockopt(socket.IPPROTO_IP, IP_MTU)}))
""")


def test_udp_with_df_sees_emsgsize(lab):
    lab.tb.link_mtu(0, 0, 1, SMALL)
    try:
        lab.tb.exec(0, ["ip", "route", "flush", "cache"])
        out = lab.tb.exec(0, [sys.executable, "-c", UDP_DF, lab.overlay(1)]).stdout
        res = json.loads(out.strip().splitlines()[-1])
        import errno
        assert res["errno"] == errno.EMSGSIZE, res
        assert res["mtu"] == SMALL - OVERHEAD, res
    finally:
        lab.tb.link_mtu(0, 0, 1)


def test_jumbo_planes(tmp_path):
    with Lab(tmp_path, 2, 1, prefix="mxjb", evs=4, fabric=dict(spines=2, leaves=2, mtu=9000)) as lab:
        lab.up()
        mtu = json.loads(lab.tb.exec(0, ["ip", "-j", "link", "show", "dev", "mrc0"]).stdout)[0]["mtu"]
        assert mtu == 9000 - OVERHEAD
        rx0 = {(x["ev"]): (x["rx_packets"], x["rx_bytes"]) for x in lab.paths(1, "h0")}
        s, r = lab.transfer(0, 1, "32M", port=5703)
        assert s["sha256"] == r["sha256"] and r["bytes"] == 32 << 20
        pk = sum(x["rx_packets"] - rx0[x["ev"]][0] for x in lab.paths(1, "h0"))
        by = sum(x["rx_bytes"] - rx0[x["ev"]][1] for x in lab.paths(1, "h0"))
        # frames above a page (multi-buffer XDP) carried the transfer
        assert pk and by / pk > 4096, (pk, by)
        d = drops(lab, 1)
        assert d["rx_truncated"] == 0 and d["rx_decap_fail"] == 0


def test_ipv6_underlay_packet_too_big(tmp_path):
    """The same over IPv6 planes: the narrow link's router answers with
    ICMPv6 "packet too big"; mrc_tx tells the inner (IPv4) sender the size
    less the 76-byte IPv6 encapsulation."""
    small6, ovh6 = 1300, 76
    with Lab(tmp_path, 2, 1, ipv6=True, prefix="mxp6", evs=EVS,
             fabric=dict(spines=2, leaves=2)) as lab:
        lab.up()
        lab.tb.link_mtu(0, 0, 1, small6)
        timeline = str(lab.tmp / "pmtu6-timeline.json")
        recv = lab.start_receiver(1, 5704, timeout=60, timeline=timeline)
        send = lab.start_sender(0, 1, "16M", 5704, timeout=60)
        s, r = lab.result(send, 90), lab.result(recv, 90)
        assert s["sha256"] == r["sha256"] and r["bytes"] == 16 << 20
        assert longest_gap_ms(timeline) < 1000, "the transfer stalled"
        d = drops(lab, 0)
        assert d["rx_pmtu"] > 0 and d["tx_too_big"] > 0 and d["rx_pmtu_bad"] == 0
        narrowed = [x for x in lab.paths(0, "h1") if x.get("mtu")]
        assert narrowed and all(x["mtu"] == small6 for x in narrowed)
        assert len(narrowed) < EVS, "only the EVs across the narrow link"
        route = lab.tb.exec(0, ["ip", "route", "get", lab.overlay(1)]).stdout
        assert f"mtu {small6 - ovh6}" in route, route
