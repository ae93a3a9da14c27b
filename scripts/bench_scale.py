#!/usr/bin/env python3
"""Scale benchmark: what a host pays for configured peers and paths.

    sudo python3 scripts/bench_scale.py [--scenarios paths256,peers64,peers256,peers1024,peers4096] [--idle 10]
                                        [--out docs/benchmarks] [--label NAME]

One hub host (h0) of a two-host testbed; h1 is a real peer, the others are
configured but absent (their underlay addresses resolve to a MAC nobody
answers, as idle or powered-off nodes behind a gateway would). Scenarios:

  paths256   one real peer, 4 planes x 64 EVs = 256 paths
  peersN     h1 + N-1 absent peers, 4 planes x 8 EVs = 32 paths each
  peersN/M   the same with [limits] max_peers = M (maps sized for M peers,
             not the default headroom)

--routed puts the absent peers behind a gateway (one per plane, the only
neighbour they need), as the peers on other leaves of a fabric are.

Measured on h0: `mrcctl up` wall time, kernel map memory (memlock of every
map the agent holds, from /proc/PID/fdinfo), the agent's CPU (% of one
core) and RSS idle for --idle seconds and during a 64 MiB transfer to h1,
EV probes sent per second (the agent's health.json), and the wall time of
`mrcctl status --json` and of one Prometheus scrape of the agent.

Membership churn (--churn N, default 10): during a paced, sha256-checked
stream to h1, N absent peers are added one at a time with `mrcctl peer
add` and removed again with `mrcctl peer remove` (the hub's [peers] dir),
then N more by a file renamed into that dir and deleted again; measured:
the time the agent took to apply each change (what the command reports;
for a dropped file, until h0 has the route to the new peer, as `ip
monitor` stamps it), how long the agent's subsystems took to follow it in
place (its log) and whether the agent started again anyway, and what the
stream to h1 lost meanwhile (wire PSNs h1's reorder window never got, net of late arrivals;
the bytes and their sha256).
Writes scale.md and scale.json (appending a labelled run) into --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "integration"))

from scripts import write_section  # noqa: E402
from lab import XFER, Lab  # noqa: E402

PLANES = 4
ABSENT_NET = 210      # absent peers' underlay: 10.(210 + plane).0.0/16
GATEWAY_HOST = "255.254"   # --routed: their gateway, 10.(210 + plane).255.254
METRICS_PORT = 9479
FOLLOWS = re.compile(r"the agent follows them in ([0-9.]+) ms")
RESTART = re.compile(r"starting it again")
HZ = os.sysconf("SC_CLK_TCK")


def absent_peers(lab: Lab, n: int, evs: int, routed: bool = False) -> str:
    """TOML for n absent peers of h0, with permanent neighbours so their
    probes have somewhere to go. Their underlay addresses lie in a /16 per
    plane routed on-link on h0 (thousands do not fit the planes' /24s);
    the neighbours go in with one `ip -batch`. routed: the /16 lies behind
    a gateway instead (GATEWAY_HOST of the plane's /16, on-link, the only
    permanent neighbour), as peers on other leaves of a fabric are."""
    out, neigh = [], []
    for p in range(PLANES):
        dev, net = lab.tb.dev(0, 1, p), f"10.{ABSENT_NET + p}"
        if routed:
            gw = f"{net}.{GATEWAY_HOST}"
            lab.tb.exec(0, ["ip", "route", "replace", f"{gw}/32", "dev", dev])
            lab.tb.exec(0, ["ip", "neigh", "replace", gw, "lladdr", f"02:00:00:{p:02x}:ff:fe", "dev", dev,
                            "nud", "permanent"])
            lab.tb.exec(0, ["ip", "route", "replace", f"{net}.0.0/16", "via", gw, "dev", dev])
        else:
            lab.tb.exec(0, ["ip", "route", "replace", f"{net}.0.0/16", "dev", dev])
    for k in range(n):
        host = 10 + k
        out += ["[[peer]]", f'name = "idle{k}"', f'overlay = "172.31.{1 + host // 250}.{host % 250 + 1}"',
                f"evs_per_plane = {evs}", "[peer.underlay]"]
        for p in range(PLANES):
            dev = lab.tb.dev(0, 1, p)
            ip = f"10.{ABSENT_NET + p}.{k // 250}.{k % 250 + 1}"
            out.append(f'{dev} = "{ip}"')
            if not routed:
                    neigh.append(f"neigh replace {ip} lladdr 02:00:00:{p:02x}:{host >> 8 & 255:02x}:{host & 255:02x} "
                             f"dev {dev} nud permanent")
        out.append("")
    if neigh:
        lab.tb.exec(0, ["ip", "-batch", "-"], input="\n".join(neigh) + "\n", timeout=300)
    return "\n".join(out)


def agent_pid(lab: Lab) -> int:
    ino = os.stat(f"/run/netns/{lab.tb.ns(0)}").st_ino
    state = json.loads(Path(f"/run/mrc/instances/ns{ino}-mrc0/state.json").read_text())
    return int(state["agent_pid"])


def run_dir(lab: Lab) -> Path:
    ino = os.stat(f"/run/netns/{lab.tb.ns(0)}").st_ino
    return Path(f"/run/mrc/instances/ns{ino}-mrc0")


def cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / HZ


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def map_memory_mb(pid: int) -> float:
    seen: dict[int, int] = {}
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        except OSError:
            continue
        kv = dict(line.split(":\t", 1) for line in info.splitlines() if ":\t" in line)
        if "map_id" in kv and "memlock" in kv:
            seen[int(kv["map_id"])] = int(kv["memlock"])
    return sum(seen.values()) / 2**20


def probes_sent(lab: Lab) -> int:
    try:
        return int(json.loads((run_dir(lab) / "health.json").read_text())["probes_sent"])
    except (OSError, ValueError, KeyError):
        return 0


def window(lab: Lab, pid: int, seconds: float, during=None) -> dict:
    c0, p0, t0 = cpu_s(pid), probes_sent(lab), time.monotonic()
    if during is None:
        time.sleep(seconds)
    else:
        during()
    time.sleep(1.1)       # health.json is rewritten once a second
    dt = time.monotonic() - t0
    return {"agent_cpu_pct": round(100 * (cpu_s(pid) - c0) / dt, 2),
            "probes_per_s": round((probes_sent(lab) - p0) / dt, 1), "agent_rss_mb": round(rss_mb(pid), 1)}


def timed(fn) -> float:
    t = time.monotonic()
    fn()
    return round(time.monotonic() - t, 3)


def file_dropped(lab: Lab, peers_dir: Path, k: int, evs: int) -> float:
    """Drop a peer file into the peers dir as a ConfigMap would (written
    aside, renamed in); ms until h0 has the route to its overlay, seen by
    `ip monitor` in h0 (started before the rename)."""
    overlay = f"172.31.251.{k + 1}"
    und = "\n".join(f'{lab.tb.dev(0, 1, p)} = "10.{ABSENT_NET + p}.201.{k + 1}"' for p in range(PLANES))
    tmp = peers_dir / f".drop{k}.toml.new"
    tmp.write_text(f'overlay = "{overlay}"\nevs_per_plane = {evs}\n\n[underlay]\n{und}\n')
    mon = lab.tb.popen(0, ["timeout", "10", "stdbuf", "-oL", "ip", "-ts", "monitor", "route"],
                       stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    t0 = time.time()
    tmp.rename(peers_dir / f"drop{k}.toml")
    try:
        for line in mon.stdout:
            stamp, _, rest = line.partition("] ")
            if rest.startswith(f"{overlay} "):
                seen = datetime.datetime.fromisoformat(stamp.lstrip("[")).timestamp()
                return round((seen - t0) * 1000, 1)
        raise SystemExit(f"no route to {overlay} within 10 s of dropping its file")
    finally:
        mon.kill()
        mon.wait()


def churn(lab: Lab, peers_dir: Path, n: int, evs: int) -> dict:
    """n absent peers added and removed one at a time, each by `mrcctl peer`,
    then n by a file dropped into the peers dir and deleted again,
    while h0 streams to h1 below the planes' rate (so that a PSN h1 never
    gets is mrc's loss, not a queue's)."""
    cfg0 = str(lab.configs[0])
    before = lab.status(1)["peers"][0]["reorder"]
    recv = lab.start_receiver(1, port=5302, timeout=60)
    send = lab.tb.popen(0, [sys.executable, XFER, "send", "--to", lab.overlay(1), "--port", "5302",
                            "--bytes", "64M", "--seconds", "600", "--max-rate", "40M",
                            "--timeout", "60"],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    add_ms, remove_ms, drop_ms = [], [], []

    def applied(out: str) -> float:
        m = re.search(r"applied by the agent in ([0-9.]+) ms", out)
        if not m:
            raise SystemExit(f"mrcctl peer: no apply time in {out!r}")
        return float(m.group(1))

    follow_ms = []
    log = run_dir(lab) / "agent.log"
    pid = agent_pid(lab)
    seen = [len(FOLLOWS.findall(log.read_text()))]

    def followed(_since: float) -> None:
        """Wait until the agent logs that it follows the change (in place,
        agent/members.py): how long its subsystems took to take it in."""
        t = time.monotonic()
        while time.monotonic() - t < 30:
            found = FOLLOWS.findall(log.read_text())
            if len(found) > seen[0]:
                follow_ms.extend(float(x) for x in found[seen[0]:])
                seen[0] = len(found)
                return
            time.sleep(0.02)
        raise SystemExit("the agent did not follow a change within 30 s")

    try:
        for k in range(n):
            und = [f"--underlay={lab.tb.dev(0, 1, p)}=10.{ABSENT_NET + p}.200.{k + 1}" for p in range(PLANES)]
            since = time.time()
            add_ms.append(applied(lab.mrcctl(0, "peer", "add", "-c", cfg0, "--name", f"churn{k}",
                                             "--overlay", f"172.31.250.{k + 1}", "--evs-per-plane", str(evs),
                                             *und).stdout))
            followed(since)
            since = time.time()
            remove_ms.append(applied(lab.mrcctl(0, "peer", "remove", "-c", cfg0, f"churn{k}").stdout))
            followed(since)
        for k in range(n):
            drop_ms.append(file_dropped(lab, peers_dir, k, evs))
            since = time.time()
            (peers_dir / f"drop{k}.toml").unlink()
            followed(since)
    except BaseException:
        send.kill()
        raise
    if send.poll() is not None:
        raise SystemExit(f"the stream to h1 ended before the churn did: {send.communicate()}")
    time.sleep(1.0)
    send.send_signal(signal.SIGUSR1)      # the stream ends at its next chunk
    sent, got = lab.result(send, 120), lab.result(recv, 120)
    after = lab.status(1)["peers"][0]["reorder"]
    return {"changes": 4 * n,
            "add_ms_median": round(statistics.median(add_ms), 1), "add_ms_max": round(max(add_ms), 1),
            "remove_ms_median": round(statistics.median(remove_ms), 1),
            "remove_ms_max": round(max(remove_ms), 1),
            "drop_ms_median": round(statistics.median(drop_ms), 1), "drop_ms_max": round(max(drop_ms), 1),
            "agent_follows_ms_median": round(statistics.median(follow_ms), 1),
            "agent_follows_ms_max": round(max(follow_ms), 1),
            "agent_restarts": 0 if agent_pid(lab) == pid and not RESTART.search(log.read_text()) else 1,
            "stream_mb": round(got["bytes"] / 1e6, 1),
            "stream_intact": got["bytes"] == sent["bytes"] and got["sha256"] == sent["sha256"],
            "lost_psns": after["net_lost"] - before["net_lost"]}


def scenario(name: str, idle_s: float, prefix: str, n_churn: int = 0, routed: bool = False) -> dict:
    limit = None
    if "/" in name:                     # peersN/M: [limits] max_peers = M
        name, limit = name.split("/")
    if name == "paths256":
        evs, n_absent = 64, 0
    elif name.startswith("peers"):
        evs, n_absent = 8, int(name[5:]) - 1
    else:
        raise SystemExit(f"unknown scenario {name}")
    extra = f'[metrics]\nlisten = "127.0.0.1:{METRICS_PORT}"\n'
    if limit:
        extra += f"[limits]\nmax_peers = {int(limit)}\n"
        name = f"{name}/{limit}"
    with tempfile.TemporaryDirectory() as tmp, \
            Lab(Path(tmp), hosts=2, planes=PLANES, evs=evs, prefix=prefix) as lab:
        lab.up(hosts=[1])
        peers_dir = Path(tmp) / "peers-h0"
        peers_dir.mkdir()
        cfg = lab.tb.mrc_config(0, evs=evs, extra=extra) + "\n" + absent_peers(lab, n_absent, evs, routed) + \
            f'\n[peers]\ndir = "{peers_dir}"\n'
        lab.configs[0].write_text(cfg)
        up_s = timed(lambda: lab.mrcctl(0, "up", timeout=300))
        time.sleep(3)                      # past the agent's start-up round of probes
        pid = agent_pid(lab)
        idle = window(lab, pid, idle_s)
        busy = window(lab, pid, 0, during=lambda: lab.transfer(0, 1, "64M", port=5301))
        status_s = timed(lambda: lab.mrcctl(0, "status", "--json", timeout=300))
        code = ("import urllib.request,sys;urllib.request.urlopen("
                f"'http://127.0.0.1:{METRICS_PORT}/metrics',timeout=60).read()")
        scrape_s = timed(lambda: lab.tb.exec(0, [sys.executable, "-c", code], timeout=120))
        paths = sum(len(p["paths"]) for p in lab.status(0)["peers"])
        row = {"scenario": name + (" routed" if routed else ""), "peers": 1 + n_absent, "paths": paths, "up_s": up_s,
               "map_memory_mb": round(map_memory_mb(pid), 2), "idle": idle, "transfer": busy,
               "status_s": status_s, "scrape_s": scrape_s}
        if n_churn and not (limit and 1 + n_absent >= int(limit)):     # a full instance refuses more
            row["churn"] = churn(lab, peers_dir, n_churn, evs)
        return row


def write(out: Path, label: str, rows: list[dict], cmd: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    jf = out / "scale.json"
    runs = json.loads(jf.read_text()) if jf.exists() else []
    runs = [r for r in runs if r.get("label") != label] + \
        [{"label": label, "time": time.time(), "cmd": cmd, "rows": rows}]
    jf.write_text(json.dumps(runs, indent=1) + "\n")
    md = ["", "Each label is one run of the command under it (see scripts/bench_scale.py for what is measured).", ""]
    for run in runs:
        md += [f"### {run['label']}", "", f"`{run.get('cmd', 'sudo python3 scripts/bench_scale.py')}`", "",
               "| scenario | peers | paths | up s | map MiB | idle agent CPU % | idle probes/s | "
               "agent CPU % under transfer | probes/s under transfer | agent RSS MB | status s | scrape s |",
               "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in run["rows"]:
            md.append(f"| {r['scenario']} | {r['peers']} | {r['paths']} | {r['up_s']} | {r['map_memory_mb']} | "
                      f"{r['idle']['agent_cpu_pct']} | {r['idle']['probes_per_s']} | "
                      f"{r['transfer']['agent_cpu_pct']} | {r['transfer']['probes_per_s']} | "
                      f"{r['idle']['agent_rss_mb']} | {r['status_s']} | {r['scrape_s']} |")
        md.append("")
        churned = [r for r in run["rows"] if r.get("churn")]
        if churned:
            md += ["Membership churn under a stream to h1 (peers added and removed one at a time by "
                   "`mrcctl peer`; apply time as the agent reports it):", "",
                   "| scenario | changes | add ms median / max | remove ms median / max | "
                   "file dropped -> route ms median / max | "
                   "agent: restarted, reporting again s median / max, or in place, follows ms median / max | "
                   "stream MB | stream intact | wire PSNs lost |",
                   "|---|---|---|---|---|---|---|---|---|"]
            for r in churned:
                c = r["churn"]
                md.append(f"| {r['scenario']} | {c['changes']} | {c['add_ms_median']} / {c['add_ms_max']} | "
                          f"{c['remove_ms_median']} / {c['remove_ms_max']} | "
                          f"{c.get('drop_ms_median', '–')} / {c.get('drop_ms_max', '–')} | "
                          f"{_agent_cell(c)} | {c['stream_mb']} | "
                          f"{'yes' if c['stream_intact'] else 'NO'} | {c['lost_psns']} |")
            md.append("")
    # the generated tables replace their own section of scale.md
    write_section(out / "scale.md", "Scale: cost of configured peers and paths", BEGIN, END, md)

def _agent_cell(c: dict) -> str:
    if "agent_back_s_median" in c:      # runs before the agent followed changes in place
        return f"restarted: {c['agent_back_s_median']} / {c['agent_back_s_max']} s"
    if "agent_follows_ms_median" in c:
        return (f"in place: {c['agent_follows_ms_median']} / {c['agent_follows_ms_max']} ms"
                + (" (and restarted)" if c.get("agent_restarts") else ""))
    return "–"


BEGIN = "<!-- bench_scale.py results: begin -->"
END = "<!-- bench_scale.py results: end -->"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", default="paths256,peers64,peers256,peers1024,peers4096")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of the idle window")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks")
    ap.add_argument("--label", default="main")
    ap.add_argument("--prefix", default="bsc")
    ap.add_argument("--churn", type=int, default=10,
                    help="peers added and removed under a stream to h1 per scenario (0: none)")
    ap.add_argument("--routed", action="store_true",
                    help="the absent peers sit behind a gateway (on other leaves of a fabric), not on-link")
    a = ap.parse_args()
    rows = []
    for name in a.scenarios.split(","):
        r = scenario(name.strip(), a.idle, a.prefix, a.churn, a.routed)
        print(json.dumps(r), flush=True)
        rows.append(r)
    write(a.out, a.label, rows, "sudo python3 scripts/bench_scale.py " + shlex.join(sys.argv[1:]))


if __name__ == "__main__":
    main()
