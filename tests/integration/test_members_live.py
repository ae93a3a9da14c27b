"""Membership that changes live (issue #14.2): h2 added to and removed from
a running h0, by `mrcctl peer add/remove` and by a file dropped into the
peers dir, while h0 sends a sha256-checked stream to h1. The stream must
lose no PSN (h1's reorder `lost`, net of late arrivals, beyond what h0's
plane queues dropped) and see no reset (every byte, the same sha256, no
sender restart at h1);
h2 must answer after each add and not after each remove; a re-added h2
starts with fresh state (no counters, no DENIED of its first life)."""

from __future__ import annotations

import re
import subprocess
import sys
import time

from lab import FAST_HEALTH, XFER, Lab

# the 100 ms goals (an applied change, a dropped file's route) are measured by
# scripts/bench_scale.py; a loaded CI machine took 101.6 and 120 ms once
APPLY_SANITY_MS = 1000

PLANES = 2
EVS = 2


def _h0_config(lab: Lab, peers_dir) -> str:
    """h0 with planes toward h1 and h2, h1 inline, h2 left to the peers dir."""
    text = lab.tb.mrc_config(0, peers=[1, 2], evs=EVS)
    head, *blocks = text.split("[[peer]]")
    keep = [b for b in blocks if 'name = "h1"' in b]
    return head + "".join("[[peer]]" + b for b in keep) + f'\n[peers]\ndir = "{peers_dir}"\n'


def _h2_file(lab: Lab) -> str:
    und = "\n".join(f'{lab.tb.dev(0, 2, p)} = "{lab.tb.addr(2, 0, p)}"' for p in range(PLANES))
    return f'overlay = "{lab.overlay(2)}"\nevs_per_plane = {EVS}\n\n[underlay]\n{und}\n'


def _has_route(lab: Lab, dst: int) -> bool:
    return bool(lab.tb.exec(0, ["ip", "route", "show", "to", "exact", f"{lab.overlay(dst)}/32"]).stdout.strip())


def _reaches(lab: Lab, src: int, dst: int) -> bool:
    cp = lab.tb.exec(src, ["ping", "-c", "1", "-W", "1", lab.overlay(dst)], check=False)
    return cp.returncode == 0


def _wait_applied(lab: Lab, present: bool, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        names = {p["name"] for p in lab.status(0)["peers"]}
        if ("h2" in names) == present:
            lst = lab.mrcctl(0, "peer", "list", "-c", str(lab.configs[0])).stdout
            if not present or any(ln.split()[1:2] == ["h2"] and " up " in ln for ln in lst.splitlines()):
                return
        time.sleep(0.1)
    raise AssertionError(f"h2 {'not added' if present else 'not removed'} within {timeout} s")


def _route_watch(lab: Lab, addr: str, timeout: float = 5.0):
    """A shell in h0 that prints the wall-clock time at which h0 first has
    a route to addr (started before the change, polling every 2 ms)."""
    script = (f"while ! ip route show to exact {addr}/32 | grep -q .; do sleep 0.002; done; date +%s.%N")
    proc = lab.tb.popen(0, ["timeout", str(timeout), "sh", "-c", script], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    assert proc.poll() is None, "the route is there already"
    return proc


def _h2_counters(lab: Lab) -> tuple[int, int, list[str]]:
    peer = next(p for p in lab.status(0)["peers"] if p["name"] == "h2")
    tx = sum(p["tx_packets"] for p in peer["paths"])
    rx = sum(p["rx_packets"] for p in peer["paths"])
    return tx, rx, [p["state"] for p in peer["paths"]]


def test_peer_added_and_removed_under_a_transfer(tmp_path):
    peers_dir = tmp_path / "peers-h0"
    peers_dir.mkdir()
    with Lab(tmp_path, hosts=3, planes=PLANES, rates="200mbit", evs=EVS, prefix="mbm") as lab:
        lab.configs[0].write_text(_h0_config(lab, peers_dir))
        lab.write_config(1, peers=[0], evs=EVS)
        lab.write_config(2, peers=[0], evs=EVS)
        lab.up()
        assert not _reaches(lab, 0, 2)
        before = lab.status(1)["peers"][0]["reorder"]
        drops0 = lab.plane_drops(0)

        recv = lab.start_receiver(1, timeout=90)
        # paced below the planes' rate: their queues never fill, so any
        # PSN lost would be mrc's
        send = lab.tb.popen(0, [sys.executable, XFER, "send", "--to", lab.overlay(1), "--port", "5001",
                                "--bytes", "250M", "--max-rate", "20M", "--timeout", "90"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        cfg0 = str(lab.configs[0])
        h2file = tmp_path / "h2.toml"
        h2file.write_text(_h2_file(lab))

        # 1. by the command
        out = lab.mrcctl(0, "peer", "add", "-c", cfg0, "--file", str(h2file)).stdout
        print(out.strip())
        m = re.search(r"applied by the agent in ([0-9.]+) ms", out)
        assert "peer h2 added" in out and m, out
        # the 100 ms goal is measured by scripts/bench_scale.py; here only
        # that the command reports a time and it is not absurd under load
        assert float(m.group(1)) <= APPLY_SANITY_MS, out
        # a duplicate is refused, and names the other definition
        dup = lab.mrcctl(0, "peer", "add", "-c", cfg0, "--name", "h2b", "--overlay", lab.overlay(2),
                         "--underlay", f"{lab.tb.dev(0, 2, 0)}=10.9.9.9", check=False)
        assert dup.returncode == 2 and "h2.toml" in dup.stderr, dup.stderr
        _wait_applied(lab, True)
        assert _reaches(lab, 0, 2) and _has_route(lab, 2)
        # a first life that leaves marks: traffic, and a denied path
        lab.tb.exec(0, ["ping", "-c", "20", "-i", "0.01", "-q", lab.overlay(2)])
        lab.mrcctl(0, "path", "deny", "-c", cfg0, "h2/0")
        tx1, _rx1, states1 = _h2_counters(lab)
        assert tx1 >= 20 and states1[0] == "DENIED", (tx1, states1)

        out = lab.mrcctl(0, "peer", "remove", "-c", cfg0, "h2").stdout
        assert "peer h2 removed" in out, out
        _wait_applied(lab, False)
        assert not (peers_dir / "h2.toml").exists()
        assert not _reaches(lab, 0, 2) and not _has_route(lab, 2)
        gone = lab.mrcctl(0, "peer", "remove", "-c", cfg0, "h2", check=False)
        assert gone.returncode == 2 and "no peer 'h2'" in gone.stderr, gone.stderr

        # 2. by a file dropped into the directory (what a ConfigMap does)
        tmp = peers_dir / ".h2.toml.new"
        tmp.write_text(_h2_file(lab))
        watch = _route_watch(lab, lab.overlay(2))
        t0 = time.time()
        tmp.rename(peers_dir / "h2.toml")
        took = float(watch.communicate(timeout=10)[0]) - t0
        print(f"file dropped -> route to h2 in place: {took * 1000:.1f} ms")
        assert took * 1000 <= APPLY_SANITY_MS, took
        _wait_applied(lab, True)
        # `up` with the files as they are: nothing left to do
        assert "nothing changed" in lab.mrcctl(0, "up").stdout
        tx2, rx2, states2 = _h2_counters(lab)
        assert tx2 == 0 and rx2 == 0 and "DENIED" not in states2, (tx2, rx2, states2)
        assert _reaches(lab, 0, 2)
        (peers_dir / "h2.toml").unlink()
        _wait_applied(lab, False)
        assert not _reaches(lab, 0, 2) and not _has_route(lab, 2)

        if send.poll() is not None:
            raise AssertionError(f"the stream ended before the changes did ({send.returncode}): "
                                 f"{send.communicate()}")
        sent, got = lab.result(send, 120), lab.result(recv, 120)
        assert sent["sha256"] == got["sha256"] and got["bytes"] == sent["bytes"], (sent, got)
        after = lab.status(1)["peers"][0]["reorder"]
        drops = lab.plane_drops(0) - drops0
        print("h1 reorder before", before, "after", after, "h0 plane drops", drops)
        assert after["rx_packets"] - before["rx_packets"] > 100_000, (before, after)
        lost = after["net_lost"] - before["net_lost"]
        # none lost; should a plane queue drop anyway (a starved CPU), a
        # dropped GSO unit takes at most 64 wire packets with it
        assert lost <= 64 * drops, (lost, drops, before, after)
        assert after["resync"] == before["resync"], (before, after)


def test_without_an_agent_the_command_applies_and_a_bad_file_changes_nothing(tmp_path):
    """`up --no-agent`: `peer add/remove` apply the change themselves. With
    the agent, a file that does not validate is reported and applies
    nothing; h1 keeps its traffic either way."""
    peers_dir = tmp_path / "peers-h0"
    peers_dir.mkdir()
    with Lab(tmp_path, hosts=3, planes=PLANES, evs=EVS, prefix="mbn") as lab:
        lab.configs[0].write_text(_h0_config(lab, peers_dir))
        lab.write_config(1, peers=[0], evs=EVS)
        lab.write_config(2, peers=[0], evs=EVS)
        cfg0 = str(lab.configs[0])
        lab.mrcctl(0, "up", "--no-agent")
        lab.up(hosts=[1, 2])
        und = [f"--underlay={lab.tb.dev(0, 2, p)}={lab.tb.addr(2, 0, p)}" for p in range(PLANES)]
        out = lab.mrcctl(0, "peer", "add", "-c", cfg0, "--name", "h2", "--overlay", lab.overlay(2),
                         "--evs-per-plane", str(EVS), *und).stdout
        m = re.search(r"applied in ([0-9.]+) ms", out)
        assert m and "by the agent" not in out, out
        print(out.strip())
        assert float(m.group(1)) <= APPLY_SANITY_MS, out
        assert _reaches(lab, 0, 2) and _reaches(lab, 0, 1) and _has_route(lab, 2)
        lst = lab.mrcctl(0, "peer", "list", "-c", cfg0).stdout
        assert re.search(r"^1\s+h2\s+172\.31\.0\.3\s+\S+h2\.toml\s+up\s+4/4$", lst, re.M), lst
        lab.mrcctl(0, "peer", "remove", "-c", cfg0, "h2")
        assert not _reaches(lab, 0, 2) and not _has_route(lab, 2) and _reaches(lab, 0, 1)
        bad = lab.mrcctl(0, "peer", "add", "-c", cfg0, "--name", "h2", "--overlay", "172.31.0.300",
                         *und, check=False)
        assert bad.returncode == 2 and "172.31.0.300" in bad.stderr and not (peers_dir / "h2.toml").exists()

        # the agent, and a file it cannot apply: nothing of it is
        lab.mrcctl(0, "up")
        (peers_dir / "h2.toml").write_text(_h2_file(lab).replace(lab.overlay(2), lab.overlay(1)))
        deadline = time.monotonic() + 5
        while "last change not applied" not in (lst := lab.mrcctl(0, "peer", "list", "-c", cfg0).stdout):
            assert time.monotonic() < deadline, lst
            time.sleep(0.1)
        assert "already used by peer 'h1'" in lst, lst
        assert [p["name"] for p in lab.status(0)["peers"]] == ["h1"]
        assert _reaches(lab, 0, 1) and not _has_route(lab, 2)
        (peers_dir / "h2.toml").write_text(_h2_file(lab))      # fixed: applied
        _wait_applied(lab, True)
        assert _reaches(lab, 0, 2)


def _pid(lab: Lab) -> int:
    return lab.instance(0).read()["agent_pid"]


def _agent_log(lab: Lab) -> str:
    return (lab.instance(0).run_dir / "agent.log").read_text()


def _macs(lab: Lab, addr: str) -> list[str]:
    """The MACs of h0's paths to `addr`."""
    return [e.dmac for e in lab.path_entries(0) if e.daddr == addr]


def _scrape(lab: Lab, port: int) -> str:
    code = f"import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:{port}/metrics',timeout=10).read().decode())"
    return lab.tb.exec(0, [sys.executable, "-c", code], check=False).stdout   # "": not listening yet


def _wait(cond, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_the_agent_follows_peer_changes_in_place(tmp_path):
    """The agent takes an added peer into every subsystem without starting
    again: its pid and uptime go on, the exporter reports the new peer, the
    neighbours task rewrites the peer's MACs when its neighbour changes,
    and the health prober brings the peer's paths back after a blackhole
    (which only its probes can do for a peer that no longer sends). A
    removed peer leaves them all."""
    port = 9481
    peers_dir = tmp_path / "peers-h0"
    peers_dir.mkdir()
    metrics = f'[metrics]\nlisten = "127.0.0.1:{port}"\n'
    with Lab(tmp_path, hosts=3, planes=PLANES, evs=EVS, prefix="mbf") as lab:
        text = _h0_config(lab, peers_dir)
        lab.configs[0].write_text(text.replace("[peers]\n", FAST_HEALTH + metrics + "[peers]\n"))
        lab.write_config(1, peers=[0], evs=EVS, extra=FAST_HEALTH)
        lab.write_config(2, peers=[0], evs=EVS, extra=FAST_HEALTH)
        lab.up()
        pid0 = _pid(lab)
        _wait(lambda: "mrc_up 1.0" in _scrape(lab, port), "no exporter")
        assert 'peer="h2"' not in _scrape(lab, port)

        (peers_dir / "h2.toml").write_text(_h2_file(lab))
        _wait_applied(lab, True)
        _wait(lambda: 'peer="h2"' in _scrape(lab, port), "the exporter does not report h2")
        assert _reaches(lab, 0, 2)

        # neighbours: h2's address on plane 0 moves to another MAC, and back
        addr, dev = lab.tb.addr(2, 0, 0), lab.tb.dev(0, 2, 0)
        fake = "02:00:00:00:00:99"
        lab.tb.exec(0, ["ip", "neigh", "replace", addr, "lladdr", fake, "dev", dev, "nud", "permanent"])
        _wait(lambda: _macs(lab, addr) == [fake] * EVS, "the agent did not follow h2's new neighbour")
        lab.tb.exec(0, ["ip", "neigh", "replace", addr, "lladdr", lab.tb.mac(2, 0, 0), "dev", dev,
                        "nud", "reachable"])
        _wait(lambda: _macs(lab, addr) == [lab.tb.mac(2, 0, 0)] * EVS,
              "the agent did not follow h2's neighbour back")
        assert _reaches(lab, 0, 2)

        # health: h2's plane 1 dead under traffic, then h2 idle: only the
        # agent's probes bring its paths back
        lab.tb.blackhole(0, 1, peer=2)
        ping = lab.tb.popen(0, ["ping", "-q", "-i", "0.01", "-w", "20", lab.overlay(2)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait(lambda: sum(p["state"] != "GOOD" for p in lab.paths(0, "h2")) == EVS,
                  f"h2's plane 1 not out of service: {lab.paths(0, 'h2')}")
        finally:
            ping.kill()
            ping.wait()
            lab.tb.blackhole(0, 1, peer=2, on=False)
        _wait(lambda: all(p["state"] == "GOOD" for p in lab.paths(0, "h2")),
              f"h2's paths did not come back: {lab.paths(0, 'h2')}")

        # an edited file: h2 removed and added again with one more EV per
        # plane (h2's side too, so that the new paths answer)
        lab.write_config(2, peers=[0], evs=EVS + 1, extra=FAST_HEALTH)
        lab.mrcctl(2, "up")
        (peers_dir / "h2.toml").write_text(_h2_file(lab).replace(f"evs_per_plane = {EVS}",
                                                                   f"evs_per_plane = {EVS + 1}"))
        _wait(lambda: len(lab.paths(0, "h2")) == PLANES * (EVS + 1), "h2 not re-added with more EVs")
        _wait(lambda: _macs(lab, addr) == [lab.tb.mac(2, 0, 0)] * (EVS + 1), "the new paths have no MAC")
        assert _reaches(lab, 0, 2)

        (peers_dir / "h2.toml").unlink()
        _wait_applied(lab, False)
        assert not _reaches(lab, 0, 2) and _reaches(lab, 0, 1)
        _wait(lambda: 'peer="h2"' not in _scrape(lab, port), "the exporter still reports h2")
        # one agent throughout: an exec would keep the pid but start the
        # exporter (which logs it) again
        log = _agent_log(lab)
        assert _pid(lab) == pid0 and log.count("metrics on http") == 1, log
