"""Operator experience against a live two-host testbed: `mrcctl top` driven
under tmux, the Prometheus exporter scraped over HTTP, `status --json`
against its schema, and `mrcctl demo` end to end (Ctrl-C included)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab import MRCCTL, REPO, Lab

PREFIX = "op"            # namespaces op-h0, op-h1
STATES = ("GOOD", "ASSUMED_BAD", "DENIED", "UNKNOWN")
ROW_RE = re.compile(r"^\s*(\d+)\s+(p\dh1)\s+(\d+)\s+(GOOD|ASSUMED_BAD|DENIED|UNKNOWN)\s+(\S+)\s+(\S+)")
FOLDED_RE = re.compile(r"^(p\dh1)\s+(\d+)\s+(GOOD|ASSUMED_BAD|DENIED|UNKNOWN|MIXED \d+/\d+)\s+(\S+)")
METRICS_PORT = 9477      # the agent's, from [metrics] in the config
EXPORTER_PORT = 9478     # the standalone `mrcctl exporter`


def _wait(pred, timeout: float, step: float = 0.2):
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > end:
            return v
        time.sleep(step)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    extra = f'[metrics]\nlisten = "127.0.0.1:{METRICS_PORT}"'
    with Lab(tmp_path_factory.mktemp("op"), hosts=2, planes=4, evs=4, rates="250mbit", prefix=PREFIX,
             extra=extra) as lab:
        lab.up()
        yield lab


def stream(lab: Lab, seconds: float, port: int = 5201):
    """A time-bounded TCP stream h0 -> h1 (mrcctl.lab.stream's sha256-checked ends)."""
    py = [sys.executable, "-m", "mrcctl.cli.stream"]
    recv = lab.tb.popen(1, py + ["recv", "--bind", lab.overlay(1), "--port", str(port),
                                 "--timeout", str(seconds + 40)],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert "listening" in recv.stdout.readline()
    send = lab.tb.popen(0, py + ["send", "--to", lab.overlay(1), "--port", str(port), "--seconds", str(seconds)],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return send, recv


def finish(send, recv) -> None:
    s = json.loads(send.communicate(timeout=90)[0].splitlines()[-1])
    r = json.loads(recv.communicate(timeout=90)[0].splitlines()[-1])
    assert s["bytes"] > 0 and s["sha256"] == r["sha256"], (s, r)


# ------------------------------------------------------------------ tmux

class Tmux:
    def __init__(self, name: str, width: int, height: int):
        self.name = name
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
        subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", str(width), "-y", str(height),
                        "env PS1='$ ' TERM=xterm-256color bash --norc --noprofile"], check=True)
        # a pane narrower than the client default: pin it
        subprocess.run(["tmux", "set-option", "-t", name, "window-size", "manual"], capture_output=True)
        subprocess.run(["tmux", "resize-window", "-t", name, "-x", str(width), "-y", str(height)],
                       capture_output=True)

    def send(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def screen(self) -> list[str]:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True,
                              text=True, check=True).stdout.split("\n")

    def resize(self, width: int, height: int) -> None:
        subprocess.run(["tmux", "resize-window", "-t", self.name, "-x", str(width), "-y", str(height)], check=True)

    def kill(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


def rows(screen: list[str]) -> dict[int, tuple]:
    out = {}
    for line in screen:
        m = ROW_RE.match(line)
        if m:
            out[int(m.group(1))] = m.groups()[1:]
    return out


def nonzero(rate: str) -> bool:
    return rate not in ("0", "-") and not re.fullmatch(r"0(\.0)?\S?", rate)


def check_frame(screen: list[str], width: int, height: int) -> str:
    """The frame's structure at this size: returns 'paths' or 'planes'."""
    lines = [ln for ln in screen if ln.strip()]
    assert len(screen) <= height + 1
    assert all(len(ln) <= width for ln in screen)
    assert lines[0].startswith("mrc top "), lines[0]
    assert lines[1].startswith("tx+rx "), lines[1]
    header = lines[2].split()
    assert header[0] in ("path", "plane") and "state" in header, lines[2]
    assert "q quit" in lines[-1], lines[-1]
    body = lines[3:-1]
    if header[0] == "path":
        paths = [ln for ln in body if ROW_RE.match(ln)]
        assert len(paths) == 16, "\n".join(screen)
        assert [int(ROW_RE.match(ln).group(1)) for ln in paths] == list(range(16))
        return "paths"
    planes = [ln for ln in body if FOLDED_RE.match(ln)]
    assert [FOLDED_RE.match(ln).group(1) for ln in planes] == ["p0h1", "p1h1", "p2h1", "p3h1"], "\n".join(screen)
    return "planes"


def wait_frame(tm: "Tmux", width: int, height: int, kinds=("paths", "planes"), timeout: float = 3) -> str:
    """Wait until the pane shows a well-formed frame of one of `kinds` (a
    resize shows the old frame's remains until the next refresh)."""
    end = time.monotonic() + timeout
    while True:
        scr = tm.screen()
        try:
            kind = check_frame(scr, width, height)
            if kind in kinds:
                return kind
            err = f"frame is {kind}, want {kinds}"
        except (AssertionError, IndexError) as e:
            err = str(e)
        if time.monotonic() > end:
            raise AssertionError(f"{err}\n" + "\n".join(scr))
        time.sleep(0.2)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")
def test_top_under_tmux(lab):
    cfg = lab.configs[0]
    send, recv = stream(lab, 14)
    tm = Tmux(f"op-top-{os.getpid()}", 100, 30)
    try:
        tm.send(f"ip netns exec {lab.tb.ns(0)} {' '.join(MRCCTL)} top -c {cfg}", "Enter")

        # every path row, with a state, and rates on the paths that carry traffic
        def traffic_frame():
            scr = tm.screen()
            r = rows(scr)
            if len(r) == 16 and any(nonzero(v[3]) for v in r.values()):
                return scr
            return None
        scr = _wait(traffic_frame, 15)
        assert scr, "\n".join(tm.screen())
        assert check_frame(scr, 100, 30) == "paths"
        r = rows(scr)
        assert all(v[2] in STATES for v in r.values())
        for pid, (plane, ev, state, tx, rx) in r.items():
            assert int(ev) == 49152 + pid
            if state == "GOOD":
                assert nonzero(tx), f"GOOD path {pid} shows tx {tx} while traffic runs:\n" + "\n".join(scr)

        # fold / unfold with f
        tm.send("f")
        wait_frame(tm, 100, 30, ("planes",))
        tm.send("f")
        wait_frame(tm, 100, 30, ("paths",))

        # a blackholed plane under traffic: ASSUMED_BAD in status, then in top (failover, issue 3)
        lab.tb.blackhole(0, 2, True, both=True)
        try:
            def bad_in_status():
                paths = [p for p in lab.paths(0) if p["plane"] == "p2h1"]
                return all(p["state"] == "ASSUMED_BAD" for p in paths)
            assert _wait(bad_in_status, 5, 0.5), lab.paths(0)

            def bad_in_top():
                rr = rows(tm.screen())
                return len(rr) == 16 and all(v[2] == "ASSUMED_BAD" for v in rr.values() if v[0] == "p2h1")
            assert _wait(bad_in_top, 3), "\n".join(tm.screen())
        finally:
            lab.tb.blackhole(0, 2, False, both=True)

        # 80x24 (resized under a running top): every row still fits, nothing wraps
        tm.resize(80, 24)
        wait_frame(tm, 80, 24)
        # too short for 16 rows: folds to planes rather than garbling
        tm.resize(60, 12)
        wait_frame(tm, 60, 12, ("planes",))

        tm.send("q")
        assert _wait(lambda: not subprocess.run(["pgrep", "-f", f"top -c {cfg}"], capture_output=True).stdout, 5)
        tm.send("echo rc=$?", "Enter")
        assert _wait(lambda: any(ln.strip() == "rc=0" for ln in tm.screen()), 5), "\n".join(tm.screen())
        # the alternate screen is gone: the shell's own lines are back, no frame remains, and
        # what we type is echoed again (cbreak mode was undone)
        scr = tm.screen()
        assert "$ echo rc=$?" in scr and not any("q quit" in ln for ln in scr), "\n".join(scr)

        # Ctrl-C quits as cleanly as q
        tm.send("clear", "Enter")
        tm.send(f"ip netns exec {lab.tb.ns(0)} {' '.join(MRCCTL)} top -c {cfg}", "Enter")
        wait_frame(tm, 60, 12, timeout=10)
        tm.send("C-c")
        assert _wait(lambda: not subprocess.run(["pgrep", "-f", f"top -c {cfg}"], capture_output=True).stdout, 5)
        tm.send("echo rc2=$?", "Enter")
        assert _wait(lambda: "rc2=0" in tm.screen(), 5), "\n".join(tm.screen())
        assert "$ echo rc2=$?" in tm.screen()
    finally:
        tm.kill()
    assert not subprocess.run(["pgrep", "-f", f"top -c {cfg}"], capture_output=True).stdout
    finish(send, recv)


def test_top_once_and_errors(lab, tmp_path):
    r = lab.mrcctl(0, "top", "-c", str(lab.configs[0]), "--once")
    assert check_frame(r.stdout.rstrip("\n").split("\n"), 80, 10_000) in ("paths", "planes")
    # an instance that is not up: one line, exit 1
    other = tmp_path / "other.toml"
    other.write_text(lab.configs[0].read_text().replace('device = "mrc0"', 'device = "mrc9"'))
    r = lab.mrcctl(0, "top", "-c", str(other), "--once", check=False)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "not up" in r.stderr


# ------------------------------------------------------------------ Prometheus

def scrape(lab: Lab, port: int) -> dict:
    """GET /metrics from inside h0 and parse it with prometheus-client's parser."""
    from prometheus_client.parser import text_string_to_metric_families
    code = (f"import urllib.request,sys;"
            f"sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:{port}/metrics',timeout=5).read().decode())")
    text = lab.tb.exec(0, [sys.executable, "-c", code], timeout=20).stdout
    out: dict[str, dict] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def by_path(metrics: dict, name: str) -> dict[int, float]:
    return {int(dict(k)["ev"]): v for k, v in metrics.get(name, {}).items()}


def test_exporter_counters_match_status(lab):
    exp = lab.tb.popen(0, [*MRCCTL, "exporter", "-c", str(lab.configs[0]), "--listen",
                           f"127.0.0.1:{EXPORTER_PORT}", "--per-path"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    try:
        assert "serving" in exp.stdout.readline()
        send, recv = stream(lab, 5, port=5202)
        time.sleep(1.5)
        m1 = scrape(lab, EXPORTER_PORT)
        snap = lab.status(0)
        time.sleep(0.5)
        m2 = scrape(lab, EXPORTER_PORT)
        finish(send, recv)
    finally:
        exp.send_signal(signal.SIGTERM)
        assert exp.wait(timeout=10) == 0

    assert m1["mrc_up"][()] == 1
    paths = {p["ev"]: p for p in snap["peers"][0]["paths"]}
    for metric, key in (("mrc_path_tx_packets_total", "tx_packets"), ("mrc_path_tx_bytes_total", "tx_bytes"),
                        ("mrc_path_rx_packets_total", "rx_packets"), ("mrc_path_rx_bytes_total", "rx_bytes")):
        a, b = by_path(m1, metric), by_path(m2, metric)
        assert set(a) == set(paths) == set(b)
        # status was read between the two scrapes: it lies between them, path by path
        for ev, p in paths.items():
            assert a[ev] <= p[key] <= b[ev], (metric, ev, a[ev], p[key], b[ev])
    # and the counters grew while traffic ran
    assert sum(by_path(m2, "mrc_path_tx_bytes_total").values()) > sum(by_path(m1, "mrc_path_tx_bytes_total").values())

    # one series per known state and path, exactly one of them 1 (states may legitimately change
    # between a scrape and status, so no equality here: the counters above pin the agreement)
    for m in (m1, m2):
        for ev, p in paths.items():
            series = {dict(k)["state"]: v for k, v in m["mrc_path_state"].items() if dict(k)["ev"] == str(ev)}
            assert {"GOOD", "ASSUMED_BAD", "DENIED"} <= set(series) and sum(series.values()) == 1, series
    drops = {dict(k)["reason"]: v for k, v in m2["mrc_drop_packets_total"].items()}
    assert set(drops) <= set(snap["drops"]) and "rx_unknown_peer" in drops
    ino = os.stat(f"/run/netns/{lab.tb.ns(0)}").st_ino
    logs = [Path(f"/run/mrc/instances/ns{ino}-mrc0/events.jsonl{s}") for s in ("", ".1")]
    lines = sum(len(f.read_bytes().splitlines()) for f in logs if f.exists())
    # the log only grows (the agent may append after our scrape)
    assert m2["mrc_failover_events_total"][()] <= lines

    # the agent serves the same metrics when [metrics] listen is configured
    # (aggregates only, the default: per-peer sums no smaller than status's)
    m = scrape(lab, METRICS_PORT)
    assert m["mrc_up"][()] == 1 and not [n for n in m if n.startswith("mrc_path_")]
    peer = snap["peers"][0]
    assert m["mrc_peer_tx_bytes_total"][(("peer", peer["name"]),)] >= sum(p["tx_bytes"] for p in peer["paths"])
    assert sum(m["mrc_peer_paths"].values()) == 16


def test_exporter_bad_listen_is_one_line(lab):
    r = lab.mrcctl(0, "exporter", "-c", str(lab.configs[0]), "--listen", "nonsense", check=False)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # the agent already holds the metrics port
    r = lab.mrcctl(0, "exporter", "-c", str(lab.configs[0]), "--listen", f"127.0.0.1:{METRICS_PORT}",
                   check=False, timeout=20)
    assert r.returncode == 1 and "cannot listen" in r.stderr and len(r.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ schema

def test_status_json_matches_schema(lab):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((REPO / "docs" / "status.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(lab.status(0))
    jsonschema.Draft202012Validator(schema).validate(lab.status(1))
    one = json.loads(lab.mrcctl(0, "status", "--json", "--peer", "h1").stdout)
    jsonschema.Draft202012Validator(schema).validate(one)
    assert [p["name"] for p in one["peers"]] == ["h1"] and len(one["peers"][0]["paths"]) == 16
    r = lab.mrcctl(0, "status", "--peer", "nope", check=False)
    assert r.returncode == 2 and "no peer named nope" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    text = lab.mrcctl(0, "status", "--view", "planes").stdout
    assert "per plane" in text and len([ln for ln in text.splitlines() if ln.split()[:2] == ["p0h1", "4"]]) == 1


# ------------------------------------------------------------------ demo

def _leftovers(before_links: str, before_inst: set[str]) -> list[str]:
    bad = []
    netns = [n for n in os.listdir("/run/netns") if n.startswith("mrcdemo")] if os.path.isdir("/run/netns") else []
    bad += [f"netns {n}" for n in netns]
    if os.path.isdir("/run/mrc-testbed"):
        bad += [f"testbed state {n}" for n in os.listdir("/run/mrc-testbed") if n.startswith("mrcdemo")]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    new_links = set(re.findall(r"^\d+: (\S+?)[:@]", links, re.M)) - set(re.findall(r"^\d+: (\S+?)[:@]",
                                                                                    before_links, re.M))
    bad += [f"link {n}" for n in new_links]
    live = {os.stat(f"/run/netns/{n}").st_ino for n in os.listdir("/run/netns")} if os.path.isdir("/run/netns") \
        else set()
    inst_dir = Path("/run/mrc/instances")
    now = {p.name for p in inst_dir.iterdir()} if inst_dir.is_dir() else set()
    for name in now - before_inst:
        m = re.match(r"ns(\d+)-", name)
        if m and int(m.group(1)) not in live:
            bad.append(f"instance record {name}")
    procs = subprocess.run(["pgrep", "-af", "mrcctl.cli.stream|mrcctl demo"], capture_output=True, text=True).stdout
    bad += [f"process {ln}" for ln in procs.splitlines() if "pgrep" not in ln]
    sessions = subprocess.run(["tmux", "ls"], capture_output=True, text=True).stdout if shutil.which("tmux") else ""
    bad += [f"tmux {ln}" for ln in sessions.splitlines() if "mrcdemo" in ln]
    return bad


def _snapshot_system():
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    inst_dir = Path("/run/mrc/instances")
    return links, ({p.name for p in inst_dir.iterdir()} if inst_dir.is_dir() else set())


def test_demo_runs_to_completion_and_leaves_nothing():
    links, inst = _snapshot_system()
    r = subprocess.run([*MRCCTL, "demo", "--duration", "8"], capture_output=True, text=True, timeout=150,
                       stdin=subprocess.DEVNULL, cwd="/")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    ticks = [ln for ln in lines if ln.startswith("t=")]
    assert len(ticks) >= 6, r.stdout          # a plain-text line per second while it runs
    assert any("BLACKHOLED" in ln for ln in ticks) and any("restored" in ln for ln in ticks)
    assert "sha256 match" in r.stdout
    assert "peer h1" in r.stdout               # the final per-path table
    assert _leftovers(links, inst) == []


def test_demo_fabric_retires_only_the_evs_across_the_failed_spine_link():
    """--fabric: a gray failure of one leaf-spine link; while it lasts the
    sender's paths GOOD are all but the EVs the leaf hashes across that link."""
    links, inst = _snapshot_system()
    r = subprocess.run([*MRCCTL, "demo", "--fabric", "--planes", "2", "--duration", "9", "--rate", "500mbit"],
                       capture_output=True, text=True, timeout=150, stdin=subprocess.DEVNULL, cwd="/")
    assert r.returncode == 0, r.stdout + r.stderr
    ticks = [ln for ln in r.stdout.splitlines() if ln.startswith("t=")]
    m = re.search(r"link leaf 0 - spine \d \(EVs ([\d, ]+) cross it\)", r.stdout)
    assert m, r.stdout
    k = len(m.group(1).split(","))
    during = [ln for ln in ticks if "BLACKHOLED" in ln]
    assert during and f"paths GOOD {8 - k}/8" in during[-1], r.stdout
    assert "paths GOOD 8/8" in ticks[-1] and "sha256 match" in r.stdout
    assert _leftovers(links, inst) == []


def test_demo_ctrl_c_cleans_up():
    links, inst = _snapshot_system()
    p = subprocess.Popen([*MRCCTL, "demo", "--duration", "30", "--no-fault"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, cwd="/")
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            line = p.stdout.readline()
            if not line or line.startswith("t="):
                break
        assert line.startswith("t="), p.stderr.read() if p.poll() is not None else line
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, out + err
    assert "interrupted" in out + err
    assert _leftovers(links, inst) == []
