"""Authentication (security.key_file, bpf/auth.h) and the plane access list
([[plane]] allow_underlay, bpf/acl.h) between namespace hosts, real TCP."""

from __future__ import annotations

import os
import time

from lab import Lab

KEY_A = "00112233445566778899aabbccddeeff"
KEY_B = "ffeeddccbbaa99887766554433221100"


def _key(path, hexkey: str):
    path.write_text(hexkey + "\n")
    os.chmod(path, 0o600)
    return path


def _paths_to(snap: dict, peer: str) -> list[dict]:
    return next(p for p in snap["peers"] if p["name"] == peer)["paths"]


def test_auth_transfer_and_a_wrong_key_delivers_nothing(tmp_path):
    """h0 and h1 share the cluster key: 16 MiB of TCP arrive intact, probes
    keep their paths GOOD, the overlay MTU leaves room for the MAC. h2 has
    another key: what h0 sends it is dropped as a bad MAC, 0 delivered."""
    a, b = _key(tmp_path / "a.key", KEY_A), _key(tmp_path / "b.key", KEY_B)
    with Lab(tmp_path, hosts=3, planes=2, evs=2, prefix=f"mwa{os.getpid() % 1000}") as lab:
        # h1 and h2 know only h0: h1's counters see nothing of h2's key
        for i, key, peers in ((0, a, [1, 2]), (1, a, [0]), (2, b, [0])):
            lab.write_config(i, evs=2, peers=peers, extra=f'[security]\nkey_file = "{key}"')
        lab.up()
        send, recv = lab.transfer(0, 1, "16M")
        assert recv["bytes"] == send["bytes"] == 16 << 20
        assert recv["sha256"] == send["sha256"]
        s0, s1 = lab.status(0), lab.status(1)
        assert s0["overlay"]["mtu"] == 1500 - 56 - 8, "the MAC shrinks the overlay MTU"
        assert sorted(s0["auth"]["peers"]) == ["h1", "h2"]
        assert s1["drops"]["rx_no_mac"] == 0 and s1["drops"]["rx_bad_mac"] == 0
        assert sum(p["rx_packets"] for p in _paths_to(s1, "h0")) > 1000

        # probes and their replies are signed too: idle paths stay GOOD on
        # probe evidence alone
        time.sleep(1.0)
        paths = _paths_to(lab.status(0), "h1")
        assert all(p["state"] == "GOOD" for p in paths), paths
        assert sum(p["probes_rx"] for p in paths) > 0

        # the host with the wrong key: nothing h0 sends it is delivered
        r = lab.tb.exec(0, ["ping", "-c", "5", "-i", "0.2", "-W", "1", lab.overlay(2)], check=False)
        assert r.returncode != 0
        s2 = lab.status(2)
        assert sum(p["rx_packets"] for p in _paths_to(s2, "h0")) == 0
        assert s2["drops"]["rx_bad_mac"] >= 5
        # ... and h0 delivers nothing from it either
        assert sum(p["rx_packets"] for p in _paths_to(lab.status(0), "h2")) == 0


def _with_acl(text: str, device: str, entries: str) -> str:
    line = f'device = "{device}"\n'
    assert line in text
    return text.replace(line, line + f"allow_underlay = {entries}\n")


def test_allow_underlay_refuses_ping_not_mrc(tmp_path):
    """h1 allows only tcp/22 on plane 0 and everything on plane 1: a ping to
    its plane-0 address is refused in XDP and counted, one to its plane-1
    address answered; the overlay keeps working over both planes (ARP on
    plane 0 too), and status shows the effective list."""
    with Lab(tmp_path, hosts=2, planes=2, evs=2, prefix=f"mwl{os.getpid() % 1000}") as lab:
        p0, p1 = lab.tb.dev(1, 0, 0), lab.tb.dev(1, 0, 1)
        cfg = lab.configs[1]
        cfg.write_text(_with_acl(cfg.read_text(), p0, '["tcp/22"]'))
        lab.up()
        addr_p0, addr_p1 = lab.tb.addr(1, 0, 0), lab.tb.addr(1, 0, 1)
        r = lab.tb.exec(0, ["ping", "-c", "3", "-i", "0.2", "-W", "1", addr_p1], check=False)
        assert r.returncode == 0, r.stdout + r.stderr
        before = lab.status(1)["drops"]["rx_underlay_refused"]
        r = lab.tb.exec(0, ["ping", "-c", "3", "-i", "0.2", "-W", "1", addr_p0], check=False)
        assert r.returncode != 0, "ping on the restricted plane must be refused"
        assert lab.status(1)["drops"]["rx_underlay_refused"] >= before + 3

        # ARP keeps working on the restricted plane: h1 resolves h0 anew
        lab.tb.exec(1, ["ip", "neigh", "flush", "dev", p0], check=False)
        # the agent's neighbour task (once a second) sees the entry gone and
        # sends through the neighbour table, whose ARP must pass the list
        time.sleep(1.5)
        send, recv = lab.transfer(0, 1, "16M")
        assert recv["sha256"] == send["sha256"] and recv["bytes"] == 16 << 20
        send, recv = lab.transfer(1, 0, "16M", port=5002)
        assert recv["sha256"] == send["sha256"]
        s1 = lab.status(1)
        on_p0 = [p for p in _paths_to(s1, "h0") if p["plane"] == p0]
        assert on_p0 and all(p["rx_packets"] > 0 and p["tx_packets"] > 0 for p in on_p0)
        deadline = time.monotonic() + 5
        while True:
            neigh = lab.tb.exec(1, ["ip", "neigh", "show", "dev", p0]).stdout
            if lab.tb.addr(0, 1, 0) in neigh or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert lab.tb.addr(0, 1, 0) in neigh and "FAILED" not in neigh, neigh

        planes = {p["device"]: p["allow_underlay"] for p in s1["planes"]}
        assert planes[p1] is None
        assert planes[p0][-1] == "tcp/22" and "arp" in planes[p0] and "ipv6-nd" in planes[p0]
        table = lab.mrcctl(1, "status").stdout
        assert f"{p0} allow_underlay:" in table and "tcp/22" in table
        assert f"{p1} allow_underlay: everything" in table
