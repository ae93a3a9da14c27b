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

    sudo python3 scripts/bench_failover.py --matrix direct,fabric,oneway --trials 20
                                           [--methods mrc,mptcp] [--dead-after 10] [--trace DIR]
                                           [--seqlog DIR]

The trial matrix: many short trials per (scenario, method) on one testbed,
mrc beside MPTCP and plain ECMP-hashed TCP (or UDP) in the same run: direct
500 Mbit/s planes x 2 EVs, a routed leaf-spine fabric with one gray
leaf-spine link, one-way UDP. Per trial: longest stall, TCP RTOs, lost
datagrams (UDP), detection time, whether exactly the failed paths were
retired, false retirements, inner packets lost. Writes failover-trials.md
and failover-trials.json.
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

from scripts import preflight, write_section  # noqa: E402
from lab import UDPSEQ, XFER, Lab  # noqa: E402
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
  receipt not yet echoed, the one it echoed least recently, so each waits at most one round of the
  others (echoing the oldest receipt first starved busy paths when reverse packets were few). The sender dates
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


# ---------------------------------------------------------------- trial matrix (issue #11 item 5)
#
# Many short trials on one testbed per (scenario, method): the testbed is
# built once, each trial injects the fault ~1 s into a 3 s transfer, clears
# it, and waits until every path is GOOD again and the relapse window of the
# probe hysteresis has passed, so trials do not inherit each other's state.

MATRIX_SCENARIOS = {
    # one of 4 direct planes x 2 EVs, 500 Mbit/s each, blackholed both ways
    "direct": dict(planes=4, evs=2, rates="500mbit", fabric=None, udp=False),
    # 2 routed planes, 2 leaves x 2 spines, 500 Mbit/s per leaf-spine link;
    # the plane-0 link leaf 0 - spine 0 blackholed both ways, carrier up
    "fabric": dict(planes=2, evs=4, rates=None, fabric=dict(spines=2, leaves=2, link_rate="500mbit"),
                   udp=False),
    # one-way UDP at 400 Mbit/s over 4 x 500 Mbit/s direct planes (no reverse
    # data: only feedback frames tell the sender's judge what arrived)
    "oneway": dict(planes=4, evs=2, rates="500mbit", fabric=None, udp=True),
}
# mptcp-rto5: MPTCP with the RTO floor mrc gives its overlay routes
# (overlay.rto_min_ms, 5 ms), here as the namespace's tcp_rto_min_us: how
# much of a difference is that floor, and how much the path model
MATRIX_METHODS = {"direct": ["mrc", "mptcp", "mptcp-rto5", "ecmp"], "fabric": ["mrc", "mptcp", "mptcp-rto5", "tcp"],
                  "oneway": ["mrc", "ecmp"]}
TRIAL_SECS, TRIAL_FAULT_AT = 3.2, 1.0
UDP_MBIT, UDP_SIZE = 400, 1400
ECMP_DST = "10.250.0.2"
MPTCP_RTO_MIN_US = 5000

class Scenario:
    """One testbed (mrc up on both hosts, so every method runs on the same
    planes) and the fault of a scenario."""

    def __init__(self, name: str, a, tmp: Path):
        self.name, self.a = name, a
        self.spec = MATRIX_SCENARIOS[name]
        self.rto_min_us: dict[int, str] = {}     # what mptcp-rto5 found, to put back
        extra = "[health]\n" + (f"dead_after_ms = {a.dead_after}\n" if a.dead_after else "")
        weights = ([f'mode = "{a.weights_mode}"'] if a.weights_mode else []) + \
            ([f"loss = {a.weights_loss}"] if a.weights_loss else [])
        if weights:
            extra += "[weights]\n" + "".join(x + "\n" for x in weights)
        kw = dict(fabric=self.spec["fabric"]) if self.spec["fabric"] else dict(rates=self.spec["rates"])
        if self.spec["udp"]:
            kw["rx_hook"] = "tc"
        (tmp / name).mkdir(parents=True, exist_ok=True)
        self.lab = Lab(tmp / name, 2, self.spec["planes"], prefix=a.prefix, evs=self.spec["evs"],
                       extra=extra, **kw)

    def __enter__(self):
        self.lab.__enter__()
        try:
            self.lab.up(settle=True)
        except BaseException:
            self.lab.__exit__(None, None, None)     # __exit__ does not run when __enter__ fails
            raise
        return self

    def __exit__(self, *exc):
        return self.lab.__exit__(*exc)

    def fault(self, on: bool) -> None:
        tb = self.lab.tb
        if self.spec["fabric"]:
            tb.link_blackhole(0, 0, 0, on=on)
        else:
            tb.blackhole(0, 1, on=on, both=True)

    def failed_paths(self) -> set[str]:
        """Host 0's paths whose forward direction crosses the fault."""
        lab, tb = self.lab, self.lab.tb
        paths = lab.paths(0)
        if not self.spec["fabric"]:
            dev = tb.dev(0, 1, 1)
            return {p["id"] for p in paths if p["plane"] == dev}
        dev = tb.dev(0, 1, 0)
        # the fault is the link leaf 0 - spine 0; host 0 is on leaf 0
        across = {ev for ev, s in lab.spines(0, 0, 1).items() if s == 0}
        return {p["id"] for p in paths if p["plane"] == dev and p["ev"] in across}

    def wait_all_good(self, timeout: float = 15) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if all(p["state"] == "GOOD" for i in (0, 1) for p in self.lab.paths(i)):
                return True
            time.sleep(0.1)
        return False

    def setup(self, method: str) -> str:
        """Set the method up; returns the address the sender connects to."""
        tb = self.lab.tb
        if method == "mrc":
            return self.lab.overlay(1)
        if method == "tcp":
            return tb.addr(1, 0, 0)
        if method.startswith("mptcp"):
            mptcp_setup(tb)
            if method == "mptcp-rto5":
                for i in (0, 1):
                    self.rto_min_us[i] = tb.exec(i, ["sysctl", "-n", "net.ipv4.tcp_rto_min_us"]).stdout.strip()
                    tb.exec(i, ["sysctl", "-qw", f"net.ipv4.tcp_rto_min_us={MPTCP_RTO_MIN_US}"])
            return tb.addr(1, 0, 0)
        tb.exec(1, ["ip", "addr", "replace", f"{ECMP_DST}/32", "dev", "lo"])
        tb.exec(0, ["sysctl", "-qw", "net.ipv4.fib_multipath_hash_policy=1"])
        hops = []
        for p in range(tb.n_planes):
            hops += ["nexthop", "via", tb.addr(1, 0, p), "dev", tb.dev(0, 1, p), "weight", "1"]
        tb.exec(0, ["ip", "route", "replace", f"{ECMP_DST}/32", *hops])
        return ECMP_DST

    def teardown(self, method: str) -> None:
        tb = self.lab.tb
        if method.startswith("mptcp"):
            for i in (0, 1):
                tb.exec(i, ["ip", "mptcp", "endpoint", "flush"], check=False)
                if i in self.rto_min_us:
                    tb.exec(i, ["sysctl", "-qw", f"net.ipv4.tcp_rto_min_us={self.rto_min_us.pop(i)}"])
        if method == "ecmp":
            tb.exec(0, ["ip", "route", "del", f"{ECMP_DST}/32"], check=False)
            tb.exec(1, ["ip", "addr", "del", f"{ECMP_DST}/32", "dev", "lo"], check=False)


def stall_of(timeline: dict, t_fail: float) -> int:
    """Longest run (ms) of 10 ms buckets in the second after the fault below a
    quarter of the goodput of the second before it: the fault takes at most
    half of any method's capacity here, so a bucket that low is traffic that
    stopped, not capacity that went away."""
    b = timeline["bucket_ms"] / 1000
    xs = timeline["bytes"]
    i_f, n1s = int(t_fail / b), int(1 / b)
    before = xs[max(0, i_f - n1s):i_f]
    ref = sum(before) / len(before) if before else 0
    longest = run = 0
    for x in (xs[i_f:i_f + n1s] + [0] * n1s)[:n1s]:
        run = run + 1 if x < 0.25 * ref else 0
        longest = max(longest, run)
    return longest * timeline["bucket_ms"]


def mrc_counters(sc: Scenario) -> dict:
    s1 = sc.lab.status(1)
    return {"lost": sum(p.get("reorder", {}).get("net_lost", 0) for p in s1["peers"])}


class TcpTrace:
    """The kernel's TCP tracepoints (tcp_probe: every segment and ACK with
    snd_una, cwnd, srtt; tcp_retransmit_skb; tcp_cong_state_set) for one
    trial's connection, from the fault for TRACE_SECS, kept in DIR only for
    a trial that had an RTO: what a stall looked like from inside TCP
    (scripts/tcp_timeline.py prints it as a timeline). tcp_probe on every
    segment costs CPU: traced trials lose goodput (0.92 -> 0.77-0.80 Gbit/s
    on the fabric), so their numbers are not the benchmark's.
    tracefs is global, so the filter names the trial's port."""

    ROOT = Path("/sys/kernel/tracing")
    EVENTS = ("tcp/tcp_probe", "tcp/tcp_retransmit_skb", "tcp/tcp_cong_state_set")
    TRACE_SECS = 0.3

    def __init__(self, out: Path):
        if not (self.ROOT / "events/tcp/tcp_probe").exists():
            raise SystemExit(f"--trace: no TCP tracepoints under {self.ROOT} (tracefs mounted?)")
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self._w("tracing_on", "0")
        self._w("buffer_size_kb", "32768")

    def _w(self, name: str, value: str) -> None:
        (self.ROOT / name).write_text(value)

    def start(self, port: int) -> None:
        self._w("trace", "")
        for e in self.EVENTS:
            self._w(f"events/{e}/filter", f"sport == {port} || dport == {port}")
            self._w(f"events/{e}/enable", "1")
        self._w("tracing_on", "1")
        self._w("trace_marker", "FAULT\n")

    def pause(self) -> None:
        self._w("tracing_on", "0")

    def stop(self, name: str | None = None, keep: bool = False) -> None:
        """Tracing off; the trace saved as DIR/name if keep."""
        self._w("tracing_on", "0")
        for e in self.EVENTS:
            self._w(f"events/{e}/enable", "0")
        if keep and name:
            (self.out / name).write_text((self.ROOT / "trace").read_text())


class SeqLog:
    """bpf/seqlog.bpf.c on a scenario's two hosts: every TCP unit host 0
    sends (inner sequence range, EV, plane, MRC flags, PSN; at its planes'
    egress) and every inner segment host 1 takes in (at its planes'
    ingress, after mrc_rx decapsulated it), with CLOCK_MONOTONIC times.
    Kept for trials with an RTO as DIR/seqlog-<scenario>-<method>-<k>.json;
    scripts/tcp_holes.py shows the hole a stall waited on and every
    transmission of it. For TCP over XDP-hooked planes (mrc_rx_tc ends
    classification before a later filter sees the inner packet)."""

    OBJ = REPO / "bpf" / "seqlog.bpf.o"
    PRIO = 7
    TX_REC, RX_REC = "=QIIIIHB5x", "=QII"
    TX_FIELDS = ("ts_ns", "seq", "len", "psn", "ifindex", "ev", "flags")
    RX_FIELDS = ("ts_ns", "seq", "len")

    def __init__(self, out: Path):
        from mrcctl.datapath.libbpf import BpfObject

        if not self.OBJ.exists():
            raise SystemExit(f"--seqlog: {self.OBJ} is missing (make -C bpf)")
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.obj = BpfObject.open(str(self.OBJ))
        self.obj.load()

    def attach(self, tb: Testbed) -> None:
        from mrcctl.lab.fabric import TC_EGRESS, TC_INGRESS, attach_tc_bpf

        for host, peer, prog, parent in ((0, 1, "seqlog_tx_prog", TC_EGRESS), (1, 0, "seqlog_rx_prog", TC_INGRESS)):
            for p in range(tb.n_planes):
                attach_tc_bpf(tb.ns(host), tb.dev(host, peer, p), self.obj.program(prog).fd, prog, parent, self.PRIO)

    def start(self) -> None:
        counts = self.obj.map("seqlog_n")
        for d in (0, 1):
            counts.update(d.to_bytes(4, "little"), bytes(8))

    def _read(self, ring: str, d: int, fmt: str) -> list[list[int]]:
        """Direction d's records in time order (a ring: the newest ones)."""
        import struct

        n = int.from_bytes(self.obj.map("seqlog_n").lookup(d.to_bytes(4, "little")), "little")
        m = self.obj.map(ring)
        raw = m.read_raw(0, min(n, m.max_entries))
        size = struct.calcsize(fmt)
        return sorted(list(struct.unpack_from(fmt, raw, i * size)) for i in range(len(raw) // size))

    def stop(self, name: str, keep: bool, fault_ns: int) -> None:
        if not keep:
            return
        doc = {"fault_ns": fault_ns, "tx_fields": self.TX_FIELDS, "rx_fields": self.RX_FIELDS,
               "tx": self._read("seqlog_tx", 0, self.TX_REC), "rx": self._read("seqlog_rx", 1, self.RX_REC)}
        (self.out / name).write_text(json.dumps(doc))


def run_trial(sc: Scenario, method: str, dst: str, k: int, tmp: Path,
              trace: TcpTrace | None = None, seqlog: SeqLog | None = None) -> dict:
    lab, tb = sc.lab, sc.lab.tb
    port = 5600 + k
    trace = trace if not sc.spec["udp"] else None
    seqlog = seqlog if method == "mrc" and not sc.spec["udp"] else None
    failed = sc.failed_paths()
    c0 = mrc_counters(sc) if method == "mrc" else None
    t_wall = time.time()
    if sc.spec["udp"]:
        ready = tmp / f"udp-ready-{k}"
        # a file left by an earlier run in this directory would start the
        # sender before the receiver is bound: its first datagrams met a
        # closed port (ECONNREFUSED in the sender) and counted as lost
        ready.unlink(missing_ok=True)
        bind = lab.overlay(1) if method == "mrc" else "0.0.0.0"
        recv = tb.popen(1, [sys.executable, UDPSEQ, "recv", bind, str(port), str(TRIAL_SECS + 3), str(ready)],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        end = time.monotonic() + 10
        while not ready.exists() and time.monotonic() < end:
            time.sleep(0.02)
        send = tb.popen(0, [sys.executable, UDPSEQ, "send", dst, str(port), str(UDP_MBIT), str(TRIAL_SECS),
                            str(UDP_SIZE)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        n0 = None
    else:
        tl = tmp / f"timeline-{k}.json"
        wrap = ["mptcpize", "run"] if method.startswith("mptcp") else []
        ready = tmp / f"ready-{k}"
        ready.unlink(missing_ok=True)
        recv = tb.popen(1, [*wrap, sys.executable, XFER, "recv", "--bind", "0.0.0.0", "--port", str(port),
                            "--timeout", "30", "--timeline", str(tl), "--ready-file", str(ready)],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        end = time.monotonic() + 10
        while not ready.exists() and time.monotonic() < end:
            time.sleep(0.02)
        n0 = nstat(tb, 0)
        send = tb.popen(0, [*wrap, sys.executable, XFER, "send", "--to", dst, "--port", str(port),
                            "--bytes", "16M", "--seconds", str(TRIAL_SECS), "--timeout", "30"],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_established(tb, 0, port)
    try:
        time.sleep(TRIAL_FAULT_AT)
        if trace:
            trace.start(port)
        if seqlog:
            seqlog.start()
        t_fault, w_fault = time.monotonic(), time.time()
        sc.fault(True)
        if trace:
            time.sleep(TcpTrace.TRACE_SECS)
            trace.pause()
        # cleared when the sender stops sending: a flow pinned to the dead
        # link then resumes (after its RTO backoff) instead of timing out
        time.sleep(TRIAL_SECS - TRIAL_FAULT_AT - (TcpTrace.TRACE_SECS if trace else 0))
        sc.fault(False)
        s_out, _ = send.communicate(timeout=60)
        r_out, _ = recv.communicate(timeout=60)
    finally:
        sc.fault(False)
        for proc in (send, recv):
            if proc.poll() is None:
                proc.kill()
    s = json.loads(s_out.strip().splitlines()[-1])
    r = json.loads(r_out.strip().splitlines()[-1])
    out: dict = {}
    if sc.spec["udp"]:
        share_pps = s["pps"] / sc.spec["planes"]
        lost = r["missing"] + (s["sent"] - 1 - r["top"]) - s.get("send_failed", 0)
        out.update(intact=r["received"] > 0, lost_dgrams=lost, send_failed=s.get("send_failed", 0),
                   lost_share_ms=round(lost / share_pps * 1000, 1))
    elif "error" in s or "error" in r:
        # the connection did not survive the fault (a flow pinned to the dead link)
        out.update(intact=False, stall_ms=1000, broken=s.get("error") or r.get("error"),
                   **retransmissions(n0, nstat(tb, 0)))
    else:
        out.update(intact=s["sha256"] == r["sha256"] and not r["reset"],
                   gbps=s["gbps"], stall_ms=stall_of(json.load(open(tl)), t_fault - r["t0"]),
                   **retransmissions(n0, nstat(tb, 0)))
    if method == "mrc":
        evs = lab.events(0, t_wall)
        bad = [e for e in evs if e["new"] == "ASSUMED_BAD" and e["time"] >= w_fault]
        on = [e for e in bad if e["path"] in failed]
        out.update(
            detect_ms=round((min(e["time"] for e in on) - w_fault) * 1000, 1) if on else None,
            retired=len({e["path"] for e in on}), of=len(failed),
            false_retired=len({e["path"] for e in evs if e["new"] == "ASSUMED_BAD" and e["path"] not in failed}),
            inner_lost=mrc_counters(sc)["lost"] - c0["lost"])
    if trace:
        trace.stop(f"trace-{sc.name}-{method}-{k}.txt", keep=bool(out.get("rto")))
    if seqlog:
        seqlog.stop(f"seqlog-{sc.name}-{method}-{k}.json", keep=bool(out.get("rto")), fault_ns=int(t_fault * 1e9))
    out["recovered"] = sc.wait_all_good()
    time.sleep(1.2)   # past the hysteresis's relapse window (1 s)
    return out


def summarise(trials: list[dict]) -> dict:
    ok = [t for t in trials if "error" not in t]

    def col(key):
        return [t.get(key) for t in ok]
    out = {"trials": len(trials), "errors": len(trials) - len(ok), "intact": all(col("intact")) and ok != []}
    for key in ("stall_ms", "rto", "lost_share_ms", "detect_ms", "false_retired", "inner_lost", "gbps"):
        vals = [v for v in col(key) if v is not None]
        if vals:
            vs = sorted(vals)
            out[key] = {"median": vs[len(vs) // 2], "max": vs[-1], "all": vals,
                        "over_10ms": sum(1 for v in vals if v > 10) if key in ("stall_ms", "lost_share_ms") else None}
    out["with_rto"] = sum(1 for t in ok if t.get("rto"))
    if "retired" in (ok[0] if ok else {}):
        out["exact_retired"] = sum(1 for t in ok if t["retired"] == t["of"])
    return out


def run_matrix(a, tmp: Path, out: Path) -> int:
    results: dict = {}
    trace = TcpTrace(Path(a.trace)) if a.trace else None
    seqlog = SeqLog(Path(a.seqlog)) if a.seqlog else None
    for name in a.matrix.split(","):
        if name not in MATRIX_SCENARIOS:
            print(f"unknown matrix scenario {name} (have {', '.join(MATRIX_SCENARIOS)})", file=sys.stderr)
            return 2
        for method in (a.methods.split(",") if a.methods else MATRIX_METHODS[name]):
            if method not in MATRIX_METHODS[name]:
                continue
            key = f"{name} / {method}" + (f", dead_after_ms {a.dead_after}" if a.dead_after and method == "mrc" else "") \
                + (f", weights {a.weights_mode}" if a.weights_mode and method == "mrc" else "")
            trials = []
            with Scenario(name, a, tmp) as sc:
                dst = sc.setup(method)
                if seqlog:
                    seqlog.attach(sc.lab.tb)
                try:
                    for k in range(a.trials):
                        try:
                            trials.append(run_trial(sc, method, dst, k, tmp / name, trace, seqlog))
                        except Exception as e:  # a failed trial must not lose the others
                            trials.append({"error": f"{type(e).__name__}: {str(e)[:200]}"})
                            sc.fault(False)
                            if trace:
                                trace.stop()
                        print(key, k + 1, json.dumps(trials[-1]), flush=True)
                finally:
                    sc.teardown(method)
            results[key] = {"summary": summarise(trials), "trials": trials}
    cmd = "sudo python3 scripts/bench_failover.py " + " ".join(sys.argv[1:])
    saved = out / "failover-trials.json"
    if a.merge and saved.exists():
        # rows of an earlier run stay (with their own command) unless rerun
        old = json.loads(saved.read_text())
        results = {**{k: v for k, v in old.items() if k not in results}, **results}
    for r in results.values():
        r.setdefault("command", cmd)
        r.setdefault("date", time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()))
    saved.write_text(json.dumps(results, indent=2))
    write_matrix_md(results, a, out)
    return 0


def write_matrix_md(results: dict, a, out: Path) -> None:
    def fmt(s: dict, key: str) -> str:
        v = s.get(key)
        if not v:
            return "–"
        return f"{v['median']} / {v['max']}"
    rows = ["| scenario / method | trials | intact | stall ms median / max | trials with a stall > 10 ms "
            "| trials with an RTO | UDP lost, ms of the dead share, median / max | trials losing > 10 ms "
            "| detect ms median / max | trials retiring exactly the failed paths | false retirements, max "
            "| inner pkts lost median / max | Gbit/s median |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, r in results.items():
        s = r["summary"] = summarise(r["trials"])
        rows.append(
            f"| {key} | {s['trials']} ({s['errors']} errors) | {'yes' if s['intact'] else 'NO'} "
            f"| {fmt(s, 'stall_ms')} | {(s.get('stall_ms') or {}).get('over_10ms', '–')} "
            f"| {s['with_rto'] if 'rto' in s else '–'} | {fmt(s, 'lost_share_ms')} | {(s.get('lost_share_ms') or {}).get('over_10ms', '–')} "
            f"| {fmt(s, 'detect_ms')} | {s.get('exact_retired', '–')} "
            f"| {(s.get('false_retired') or {}).get('max', '–')} | {fmt(s, 'inner_lost')} "
            f"| {(s.get('gbps') or {}).get('median', '–')} |")
    text = [
        "Commands (each row was produced by one of them):",
        "",
        *sorted({f"* `{r['command']}` ({r['date']})" for r in results.values()}),
        "",
        f"On this VM (2 vCPUs, kernel {os.uname().release}). One testbed per row: each trial a "
        f"{TRIAL_SECS} s transfer, "
        f"the fault {TRIAL_FAULT_AT} s in, cleared at the end; the next trial starts when every path is "
        "GOOD again and the hysteresis's 1 s relapse window has passed. mrc runs with the default "
        "[health] unless the row names another dead_after_ms.",
        "",
        "* **direct**: 4 veth planes x 2 EVs, 500 Mbit/s each; plane 1 blackholed both ways (tc egress "
        "drop at both ends, carrier up). *mptcp*: one subflow per plane; *ecmp*: plain TCP over a "
        "multipath route across the planes, L4-hashed (one plane carries it).",
        "* **fabric**: 2 routed planes, each 2 leaves x 2 spines, 500 Mbit/s per leaf-spine link, the "
        "hosts on different leaves; the plane-0 link leaf 0 - spine 0 blackholed both ways, carrier up "
        "(half of plane 0's EVs cross it, asked from the leaf's FIB). *tcp*: plain TCP over plane 0, "
        "hashed onto one spine by the fabric.",
        "* **oneway**: UDP at 400 Mbit/s over 4 x 500 Mbit/s direct planes, no reverse traffic; plane 1 "
        "blackholed both ways. Lost datagrams are counted from sequence numbers and shown as ms of the "
        "dead plane's share (lost / (rate / 4)). mrc uses the tc receive hook, whose feedback frames are "
        "the only evidence the sender gets.",
        "",
        *rows,
        "",
        "Definitions: *stall* = longest run of 10 ms buckets in the second after the fault whose goodput "
        "is below a quarter of the second before it; *RTO* = TcpExtTCPTimeouts of the sender grew in the trial; *detect* = "
        "fault to the first ASSUMED_BAD event of a failed path; *exactly* = the set of paths retired "
        "equals the paths whose forward direction crosses the fault; *false retirements* = paths retired "
        "that do not cross it (per trial); *inner pkts lost* = wire PSNs the receiver never got in any "
        "copy (mrc's reorder window).",
    ]
    # what the runs showed is written by hand around the generated part
    write_section(out / "failover-trials.md", "Failover trials: direct planes, a routed fabric, one-way UDP",
                  "<!-- bench_failover --matrix: generated -->", "<!-- end bench_failover -->", text)


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
    ap.add_argument("--matrix", help="trial matrix instead: scenarios among " + ",".join(MATRIX_SCENARIOS)
                    + " (--trials per method, each row one testbed; writes failover-trials.md)")
    ap.add_argument("--methods", help="matrix methods to run (default: every one the scenario has)")
    ap.add_argument("--dead-after", type=int, help="matrix: mrc's health.dead_after_ms (default: mrc's default)")
    ap.add_argument("--weights-mode", choices=["fixed", "adaptive"],
                    help="matrix: mrc's weights.mode (default: mrc's default, adaptive unless weights are typed)")
    ap.add_argument("--weights-loss", choices=["true", "false"],
                    help="matrix: mrc's weights.loss (default: mrc's default)")
    ap.add_argument("--merge", action="store_true", help="matrix: keep the rows of failover-trials.json not rerun")
    ap.add_argument("--seqlog", metavar="DIR", help="matrix, TCP over mrc: log every unit host 0 sends and every "
                    "segment host 1 takes in (bpf/seqlog.bpf.c); keep the logs of trials with an RTO in DIR "
                    "(scripts/tcp_holes.py reads one)")
    ap.add_argument("--trace", metavar="DIR", help="matrix: trace TCP (kernel tracepoints) from each fault for "
                    f"{TcpTrace.TRACE_SECS} s; keep the traces of trials with an RTO in DIR")
    a = ap.parse_args()
    err = preflight("bench_failover.py", "namespaces, BPF")
    if err:
        print(err, file=sys.stderr)
        return 1
    out, tmp = Path(a.out), Path(a.tmp)
    out.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    if a.matrix:
        return run_matrix(a, tmp, out)
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
