#!/usr/bin/env python3
"""Failover benchmark: one TCP connection over 4 planes x 1 Gbit/s, one plane
blackholed ~2 s into the transfer; goodput recorded at 10 ms resolution by
the receiver (scripts/xfer.py --timeline).

    sudo python3 scripts/bench_failover.py [--runs mptcp,mrc,mrc-nohedge,mrc-always]
                                           [--trials 3] [--out docs/benchmarks] [--rate 1gbit]

Scenarios, in one run, each on a fresh testbed, each mrc one --trials times
(a stall that happens in one run of three is still a stall):
  mptcp        Linux MPTCP (mptcpize), one subflow per plane, no mrc
  mrc          mrc with the defaults (hedge = true: units on suspect paths are
               also sent on a GOOD path)
  mrc-nohedge  mrc, hedge = false
  mrc-always   mrc, hedge = "always": every unit twice, on two planes
  mrc-paced, mrc-always-paced   mrc and mrc-always with the sender paced (--pace,
               SO_MAX_PACING_RATE) below capacity: no congestion loss, so
               retransmissions show only what the failure (and reordering) cost

Reported per scenario: goodput before the failure and in steady state after
it, stall (time within the second after the failure that goodput stays
below half the post-failure steady state; 10 ms buckets), time to steady
state (after the failure, until the 50 ms average stays >= 80 % of the post
steady state), sender TCP retransmissions (nstat TcpRetransSegs), wire
packets mrc sent into the dead plane, and mrc's detection time (fault to
the first `dead` EV event). Writes failover.md, failover.json and
failover.png into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "integration"))

from lab import XFER, Lab  # noqa: E402
from scripts import preflight  # noqa: E402
from mrcctl.lab.testbed import Testbed  # noqa: E402

PORT = 5001
BUCKET_MS = 10
CHUNK = "64M"


def wait_established(tb: Testbed, host: int, port: int, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        out = tb.exec(host, ["ss", "-Htn", "state", "established", f"( dport = :{port} )"],
                      check=False).stdout
        if out.strip():
            return
        time.sleep(0.02)
    raise RuntimeError("connection not established")


def nstat(tb: Testbed, i: int) -> dict:
    data = json.loads(tb.exec(i, ["nstat", "-a", "-s", "-z", "-j"]).stdout)
    flat = {}
    for g in data.values():
        flat.update(g)
    return flat


def retransmissions(n0: dict, n1: dict) -> dict:
    """Sender retransmissions, and how many of them the receiver reported
    as received twice (DSACK): spurious, the original was not lost."""
    d = {k: n1.get(k, 0) - n0.get(k, 0)
         for k in ("TcpRetransSegs", "TcpExtTCPDSACKRecvSegs", "TcpExtTCPTimeouts", "TcpExtTCPLostRetransmit",
                   "TcpExtTCPLossProbes")}
    return {"retrans": d["TcpRetransSegs"], "spurious": d["TcpExtTCPDSACKRecvSegs"],
            "rto": d["TcpExtTCPTimeouts"], "lost_retrans": d["TcpExtTCPLostRetransmit"],
            "tlp": d["TcpExtTCPLossProbes"]}


def analyse(timeline: dict, t_fail: float) -> dict:
    b = timeline["bucket_ms"] / 1000
    gbps = [x * 8 / b / 1e9 for x in timeline["bytes"]]
    i_f = int(t_fail / b)
    n1s = int(1 / b)

    def mean(xs):
        return sum(xs) / len(xs) if xs else 0.0
    pre = mean(gbps[max(0, i_f - n1s):i_f])
    post = mean(gbps[i_f + n1s:i_f + 2 * n1s]) or mean(gbps[i_f + n1s // 2:])
    window = gbps[i_f:i_f + n1s]
    below = [g < 0.5 * post for g in window]
    longest = run = 0
    for x in below:
        run = run + 1 if x else 0
        longest = max(longest, run)
    avg5 = [mean(window[k:k + 5]) for k in range(len(window))]
    last_low = max((k for k, a in enumerate(avg5) if a < 0.8 * post), default=-1)
    return {
        "pre_gbps": round(pre, 3),
        "post_gbps": round(post, 3),
        "stall_ms": sum(below) * timeline["bucket_ms"],
        "longest_stall_ms": longest * timeline["bucket_ms"],
        "to_steady_ms": (last_low + 1) * timeline["bucket_ms"],
        "gbps": gbps,
        "t_fail": t_fail,
    }


def run_mrc(name: str, args, tmp: Path, hedge, pace: str | None = None) -> dict:
    """hedge: None for the default, else the value of health.hedge."""
    extra = "[health]\n" + (f"hedge = {json.dumps(hedge)}\n" if hedge is not None else "")
    (tmp / name).mkdir(parents=True, exist_ok=True)
    with Lab(tmp / name, 2, args.planes, rates=args.rate, prefix=args.prefix, evs=args.evs,
             extra=extra) as lab:
        lab.up()
        time.sleep(1.0)
        tl = str(tmp / name / "timeline.json")
        recv = lab.start_receiver(1, PORT, timeout=120, timeline=tl)
        n0 = nstat(lab.tb, 0)
        cmd = [sys.executable, XFER, "send", "--to", lab.overlay(1), "--port", str(PORT),
               "--bytes", CHUNK, "--repeat", str(args.repeat if not pace else args.paced_repeat),
               "--timeout", "120"]
        if pace:
            cmd += ["--max-rate", pace]
        send = lab.tb.popen(0, cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_established(lab.tb, 0, PORT)
        time.sleep(args.fail_at)
        dead_dev = lab.tb.dev(0, 1, args.fail_plane)
        tx_before = sum(p["tx_packets"] for p in lab.paths(0) if p["plane"] == dead_dev)
        t_fault, w_fault = time.monotonic(), time.time()
        lab.tb.blackhole(0, args.fail_plane)
        s, r = Lab.result(send, 300), Lab.result(recv, 300)
        paths = lab.paths(0)
        tx_after = sum(p["tx_packets"] for p in paths if p["plane"] == dead_dev)
        n1 = nstat(lab.tb, 0)
        evs = [json.loads(x) for x in lab.mrcctl(0, "events", "--json").stdout.splitlines()]
        # retired by the datapath (dead) or, when the flow stalled, by the agent (probe_loss)
        dead = [e for e in evs if e["reason"] in ("dead", "probe_loss") and e["time"] >= w_fault]
        on_plane = [e for e in dead if e["plane"] == dead_dev]
        snap1 = lab.status(1)
        false_pos = [e for e in evs if e["reason"] == "dead" and e["plane"] != dead_dev]
        out = analyse(json.load(open(tl)), t_fault - r["t0"])
        out.update(
            intact=s["sha256"] == r["sha256"] and not r["reset"],
            gbps_total=s["gbps"],
            **retransmissions(n0, n1),
            # wire PSNs the receiver never got, in either copy: inner packets lost
            rx_lost=sum(p.get("reorder", {}).get("net_lost", 0) for p in snap1["peers"]),
            lost_packets=tx_after - tx_before,
            detect_ms=round((min(e["time"] for e in on_plane) - w_fault) * 1000, 1) if on_plane else None,
            plane_paths_dead=len({e["path"] for e in on_plane}),
            retired_by=sorted({e["reason"] for e in on_plane}),
            false_positives=len(false_pos),
            dup_dropped=snap1["drops"].get("rx_duplicate", 0),
        )
        return out


def run_probe_cpu(args, tmp: Path, evs: int = 64, seconds: float = 10.0) -> dict:
    """The agent's CPU with planes x 64 = 256 idle paths (every path probed
    every probe interval: nothing else refreshes idle paths)."""
    (tmp / "probe-cpu").mkdir(parents=True, exist_ok=True)
    with Lab(tmp / "probe-cpu", 2, args.planes, rates=args.rate, prefix=args.prefix, evs=evs) as lab:
        lab.up()
        run_dir = lab.tb.exec(0, [sys.executable, "-c", "from mrcctl.instance.state import Instance; "
                                  "print(Instance('mrc0').run_dir)"]).stdout.strip()
        time.sleep(2.0)
        a = json.loads(Path(run_dir, "health.json").read_text())
        time.sleep(seconds)
        b = json.loads(Path(run_dir, "health.json").read_text())
        dt = b["uptime_s"] - a["uptime_s"]
        return {"paths": args.planes * evs, "seconds": round(dt, 2),
                "probes_per_s": round((b["probes_sent"] - a["probes_sent"]) / dt),
                "agent_cpu_pct": round(100 * (b["cpu_s"] - a["cpu_s"]) / dt, 1)}


def mptcp_setup(tb: Testbed) -> None:
    for i in (0, 1):
        tb.exec(i, ["sysctl", "-qw", "net.mptcp.enabled=1"])
        tb.exec(i, ["ip", "mptcp", "limits", "set", "subflow", "8", "add_addr_accepted", "8"])
        tb.exec(i, ["ip", "mptcp", "endpoint", "flush"])
    # the server announces its other planes; the client opens a subflow to each
    for p in range(1, tb.n_planes):
        tb.exec(1, ["ip", "mptcp", "endpoint", "add", tb.addr(1, 0, p), "dev", tb.dev(1, 0, p), "signal"])


def run_mptcp(args, tmp: Path) -> dict:
    tb = Testbed(hosts=2, planes=args.planes, rates=args.rate, prefix=args.prefix)
    tb.up()
    try:
        mptcp_setup(tb)
        (tmp / "mptcp").mkdir(parents=True, exist_ok=True)
        tl = str(tmp / "mptcp" / "timeline.json")
        ready = tmp / "mptcp" / "ready"
        recv = tb.popen(1, ["mptcpize", "run", sys.executable, XFER, "recv", "--bind", "0.0.0.0", "--port", str(PORT),
                            "--timeout", "120", "--timeline", tl, "--ready-file", str(ready)],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        end = time.monotonic() + 10
        while not ready.exists() and time.monotonic() < end:
            time.sleep(0.02)
        n0 = nstat(tb, 0)
        send = tb.popen(0, ["mptcpize", "run", sys.executable, XFER, "send", "--to", tb.addr(1, 0, 0),
                            "--port", str(PORT), "--bytes", CHUNK, "--repeat", str(2 * args.repeat), "--timeout", "120"],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_established(tb, 0, PORT)
        time.sleep(args.fail_at)
        t_fault = time.monotonic()
        tb.blackhole(0, args.fail_plane)
        s, r = Lab.result(send, 300), Lab.result(recv, 300)
        n1 = nstat(tb, 0)
        subflows = tb.exec(0, ["ip", "mptcp", "limits", "show"], check=False).stdout.strip()
        out = analyse(json.load(open(tl)), t_fault - r["t0"])
        out.update(intact=s["sha256"] == r["sha256"] and not r["reset"], gbps_total=s["gbps"],
                   **retransmissions(n0, n1), mptcp_limits=subflows)
        return out
    finally:
        tb.down()


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for name, r in results.items():
        if "gbps" not in r:
            continue
        b = BUCKET_MS / 1000
        t = [i * b - r["t_fail"] for i in range(len(r["gbps"]))]
        sel = [(x, y) for x, y in zip(t, r["gbps"]) if -0.5 <= x <= 1.5]
        ax.plot([x * 1000 for x, _ in sel], [y for _, y in sel], label=name, lw=1)
    ax.axvline(0, color="k", ls="--", lw=0.8)
    ax.set_xlabel("ms after one of 4 planes is blackholed")
    ax.set_ylabel("goodput, Gbit/s (10 ms buckets)")
    ax.set_title("one TCP connection, 4 planes x 1 Gbit/s")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


DESIGN = """
## How mrc fails over (bpf/judge.h, bpf/evidence.h, bpf/hedge.h, mrcctl/agent/health.py)

* **Evidence.** Every MRC header echoes, for one of the peer's paths, the send timestamp of the
  newest packet received on it (`fb_path`/`fb_ts`); the receiver picks, among the paths that have a
  receipt not yet echoed, the *oldest* one, so evidence comes back in send order. The sender dates
  evidence by the send time of the packet it confirms (`last_ack_ns`), keeps per path a smoothed
  send-to-evidence delay (`ev_rtt_us`, from new evidence only: a dead path keeps receiving echoes
  of its last receipt) and per peer the newest confirmed send time (`ack_max_ns`, data only).
  Idle paths get EV probes from the agent (AF_PACKET, prebuilt frames, answered by the peer's XDP).
* **Verdict in mrc_tx, per unit, no user space.** A path is overdue when its oldest unconfirmed
  unit is older than `dead_after` beyond its own evidence delay *and* a packet sent `dead_after`
  later has been confirmed on another path. Queues that differ between planes do not trip the
  first condition; a peer gone silent (RTO) does not trip the second. The first verdict only
  restarts the observation (two strikes: one congestion drop must not retire a path); the second
  flips GOOD -> ASSUMED_BAD with a compare-and-swap, emits an EV event into the ring buffer and
  the unit takes the next slot. `ev_min_active` is checked before (bpf_loop over the peer's paths)
  and if no slot nearby is usable a fallback scan picks any GOOD path, else (min_active > 0) the
  first path not denied.
* **Agent.** Rebuilds the spray table from GOOD paths after every event; forces ASSUMED_BAD on
  link down/no carrier (rtnetlink); retires a GOOD path whose evidence is > 100 ms old and whose
  last 3 probes went unanswered (the case the datapath cannot judge: the flow is stalled in an RTO
  and its retransmission keeps landing on dead paths); logs every change to events.jsonl.
* **Recovery with hysteresis.** mrc_rx counts probe replies of an ASSUMED_BAD path by probe
  sequence number (a lost probe restarts the count; replies to probes sent before the retirement
  do not count) and returns it to GOOD after `recover_probes` in a row, doubled for every relapse
  within 1 s of recovering (up to 16x): a flapping plane settles instead of oscillating.
* **Retransmissions** (any mode) go out on the path that confirmed delivery most recently
  (`mrc_peer_seq.ack_max_path`) instead of the next slot. mrc_tx knows one from the inner TCP
  sequence: a unit that ends at or below the highest sequence its flow has sent
  (`mrc_tx_flows`). In the first `hedge_after` + evidence delay after a failure nothing looks
  suspect yet: TCP resends what the dead plane lost, a resend sprayed onto the same plane is lost
  again, and when nothing follows it RACK cannot see that and TCP waits for its 200 ms RTO. That
  happened in 2 of 5 hedged runs before this change.
* **Hedging** (`hedge = true`, the default) sends a unit on a suspect path as a clone
  (bpf_clone_redirect) on that path and, rewritten, on a GOOD path of the same family on another
  plane. A path is suspect when it has been struck once and not confirmed since, or is overdue by
  `hedge_after`. With nothing failing that is a few dozen units per 5 s at 3.5 Gbit/s, which costs
  no measurable goodput. `hedge = false` keeps sending new data onto a failed plane until it is
  retired, and a tail of that data lost in TCP's recovery ends in an RTO (see the trials above).
  `hedge = "always"` copies every unit. Both copies carry
  MRC_F_HEDGE; the receiver drops the second by wire PSN (segment i of a unit = psn + i) in a
  per-peer window of 16384 PSNs, one compare-and-swap per packet (tag and 32 bits in one word),
  exact across CPUs.
"""


def write_md(results: dict, args, out: Path, cmd: str, cpu: dict | None = None) -> None:
    rows = ["| scenario | intact | before (Gbit/s) | after (Gbit/s) | stall (ms) | longest stall (ms) "
            "| to steady (ms) | TCP retrans | of them spurious | RTOs | mrc pkts into dead plane "
            "| inner pkts lost | mrc detect (ms) | retired by | false dead (other planes) "
            "| longest stall, every trial (ms) | RTOs, every trial |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        if "error" in r:
            rows.append(f"| {name} | error: {r['error']} |" + " |" * 15)
            continue
        tr = r.get("trials", {})
        rows.append(f"| {name} | {'yes' if r['intact'] else 'NO'} | {r['pre_gbps']} | {r['post_gbps']} "
                    f"| {r['stall_ms']} | {r['longest_stall_ms']} | {r['to_steady_ms']} | {r['retrans']} "
                    f"| {r.get('spurious', 'n/a')} | {r.get('rto', 'n/a')} | {r.get('lost_packets', 'n/a')} "
                    f"| {r.get('rx_lost', 'n/a')} "
                    f"| {r.get('detect_ms', 'n/a')} "
                    f"| {', '.join(r.get('retired_by', [])) or 'n/a'} "
                    f"| {r.get('false_positives', 'n/a')} "
                    f"| {' / '.join(map(str, tr.get('longest_stall_ms', [])))} "
                    f"| {' / '.join(map(str, tr.get('rto', [])))} |")
    text = [
        "# Failover benchmark",
        "",
        f"Command: `{cmd}`",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on this VM (2 vCPUs, kernel "
        f"{os.uname().release}): two namespace hosts, {args.planes} veth planes shaped with tbf "
        f"{args.rate} each, {args.evs} EVs per plane; one TCP connection (cubic) sending "
        f"{CHUNK} x {args.repeat}; plane {args.fail_plane} blackholed on the sender's egress "
        f"{args.fail_at} s after the connection is up (testbed classic-BPF filter, link stays up). "
        "mrc: default [health] (hedge true, dead_after_ms 20, hedge_after_ms 10, probe_interval_ms 20, "
        f"recover_probes 3) unless the scenario says otherwise. Each mrc scenario ran {args.trials} times; "
        "the columns show the first run, the last two columns every run.",
        "",
        *rows,
        "",
        "![goodput around the failure](failover.png)",
        "",
        "Definitions: *stall* = time within the first second after the failure during which the 10 ms "
        "goodput is below half of the post-failure steady state (goodput in [1 s, 2 s] after the "
        "failure); *to steady* = until the 50 ms average stays at >= 80 % of that; *TCP retrans* = "
        "sender nstat TcpRetransSegs delta over the whole transfer (congestion and reordering "
        "included); *of them spurious* = retransmitted segments the receiver reported as received "
        "twice (TcpExtTCPDSACKRecvSegs): the original had arrived, so the retransmission answered "
        "reordering, not a loss; *RTOs* = TCP retransmission timeouts (TcpExtTCPTimeouts; each one is "
        "a stall of at least 200 ms); *mrc pkts into dead plane* = wire packets mrc sent on the dead "
        "plane's paths after the failure (all dropped there); *inner pkts lost* = wire PSNs the "
        "receiver never got in any copy (mrc's reorder window, `lost`): the packets the failure "
        "(or congestion) really took from the connection; *mrc detect* = failure to the first event retiring a path of that "
        "plane (`dead` from the datapath, `probe_loss` from the agent); "
        "*false dead* = `dead` events on planes that did not fail, whole run.",
        "",
    ]
    text += DESIGN.splitlines()
    if cpu:
        text += ["## Probe cost", "",
                 f"{cpu['paths']} idle paths (4 planes x 64 EVs), probe_interval_ms 20: the agent sent "
                 f"{cpu['probes_per_s']} probes/s using {cpu['agent_cpu_pct']} % of one core "
                 f"(measured over {cpu['seconds']} s from the agent's own CPU time, health.json).", ""]
    (out / "failover.md").write_text("\n".join(text) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="mptcp,mrc,mrc-nohedge,mrc-always,mrc-paced,mrc-always-paced")
    ap.add_argument("--trials", type=int, default=3, help="runs of each mrc scenario")
    ap.add_argument("--pace", default="75M", help="sender pacing (bytes/s) of the *-paced runs")
    ap.add_argument("--paced-repeat", type=int, default=6)
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks"))
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--planes", type=int, default=4)
    ap.add_argument("--evs", type=int, default=4)
    ap.add_argument("--fail-plane", type=int, default=1)
    ap.add_argument("--fail-at", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=24, help=f"transfer = {CHUNK} x this (MPTCP: twice that)")
    ap.add_argument("--prefix", default="fb")
    ap.add_argument("--tmp", default="/tmp/mrc-bench-failover")
    ap.add_argument("--no-probe-cpu", action="store_true", help="skip the 256-path probe CPU measurement")
    a = ap.parse_args()
    err = preflight("bench_failover.py", "namespaces, BPF")
    if err:
        print(err, file=sys.stderr)
        return 1
    out, tmp = Path(a.out), Path(a.tmp)
    out.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    # name: (health.hedge or None for the default, pacing)
    mrc_runs = {"mrc": (None, None), "mrc-nohedge": (False, None), "mrc-always": ("always", None),
                "mrc-paced": (None, a.pace), "mrc-always-paced": ("always", a.pace)}
    results = {}
    for name in a.runs.split(","):
        if name != "mptcp" and name not in mrc_runs:
            print(f"unknown scenario {name}", file=sys.stderr)
            return 2
        trials = []
        for k in range(1 if name == "mptcp" else max(1, a.trials)):
            print(f"== {name} ({k + 1})", flush=True)
            try:
                trials.append(run_mptcp(a, tmp) if name == "mptcp" else run_mrc(name, a, tmp, *mrc_runs[name]))
            except Exception as e:  # one failed scenario must not lose the others
                trials.append({"error": f"{type(e).__name__}: {str(e)[:200]}"})
            print(json.dumps({k: v for k, v in trials[-1].items() if k != "gbps"}), flush=True)
        # the table and the plot show the first trial; the other trials add
        # their longest stalls and RTOs
        results[name] = dict(trials[0])
        ok = [t for t in trials if "error" not in t]
        results[name]["trials"] = {"longest_stall_ms": [t["longest_stall_ms"] for t in ok],
                                   "rto": [t.get("rto") for t in ok],
                                   "intact": all(t["intact"] for t in ok) and len(ok) == len(trials)}
    cpu = None
    if not a.no_probe_cpu:
        try:
            cpu = run_probe_cpu(a, tmp)
        except Exception as e:
            cpu = None
            print(f"probe cpu: {type(e).__name__}: {e}", flush=True)
        print(json.dumps(cpu), flush=True)
    cmd = "sudo python3 scripts/bench_failover.py " + " ".join(sys.argv[1:])
    summary = {k: {kk: vv for kk, vv in v.items() if kk != "gbps"} for k, v in results.items()}
    summary["probe_cpu"] = cpu
    (out / "failover.json").write_text(json.dumps(summary, indent=2))
    plot(results, out / "failover.png")
    write_md(results, a, out, cmd.strip(), cpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
