#!/usr/bin/env python3
"""Cross traffic on one fabric link: does mrc leave it, and does the other flow keep its share?

    sudo python3 scripts/bench_cross.py [--trials 5] [--link-rate 500mbit] [--cross-rate 300mbit]
                                        [--evs 4] [--prefix bx] [--out docs/benchmarks] [--no-write]

Two hosts on different leaves of 2 planes x 2 spines (docs/fabric.md). One TCP
connection from host 0 to host 1 for 4 s (scripts/xfer.py); 1 s in, a UDP
stream (--cross-rate, 2 s; the testbed's GSO sender, mrcctl/lab/udpgen.py)
enters the leaf-spine link of plane 0 that most of host 0's plane-0 EVs cross
(leaf 0 -> that spine): the link is then offered more than it carries, and its
queue grows. Per trial: the connection's goodput, what the cross stream got
through to the spine (counted there) against its fair share (half the link),
what it sent (iperf3, the sender before, shared the 2 cores with the transfer
and sent about half its rate), and, for mrc with per-EV weights, the share of
plane 0 that the EVs across the link had when the stream began and 0.1, 0.5
and 2 s later (the agent's weights trace, MRC_WEIGHTS_TRACE). Rows, in one run on one
testbed: mrc (defaults: per-EV weights reading delay, CE marks and loss per
EV), mrc with `weights.loss = false` (the split does not read loss), mrc with
`weights.per_ev = false`
(each plane's share spread evenly over its EVs, as before per-EV weights),
MPTCP with one subflow per plane (each pinned to one spine by the leaf's hash).
mrc is brought down and up before every trial, so each starts from even weights.
The whole run's weights trace stays in --tmp (weights.jsonl), or in the file
MRC_WEIGHTS_TRACE names, for a trial to be looked at afterwards (each trial's
line on stdout has its clock readings: "start", "t0").

Writes cross.md (the section between its markers) and cross.json into --out.
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

from scripts import command, preflight, write_section  # noqa: E402
from lab import XFER, Lab  # noqa: E402
from scripts.bench_failover import mptcp_setup  # noqa: E402
from mrcctl.lab.testbed import parse_rate  # noqa: E402

BEGIN, END = "<!-- bench_cross.py results: begin -->", "<!-- bench_cross.py results: end -->"
SECONDS, CROSS_AT, CROSS_S = 4.0, 1.0, 2.0
PLANES, SPINES = 2, 2


def trial(lab: Lab, a, spine: int, port: int, dst: str, mptcp: bool = False) -> dict:
    tb = lab.tb
    wrap = ["mptcpize", "run"] if mptcp else []
    ready = lab.tmp / f"ready-{port}"
    ready.unlink(missing_ok=True)
    recv = tb.popen(1, [*wrap, sys.executable, XFER, "recv", "--bind", "0.0.0.0", "--port", str(port),
                        "--timeout", "30", "--ready-file", str(ready)],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 10
    while not ready.exists() and time.monotonic() < end:
        time.sleep(0.02)
    start = time.monotonic()
    send = tb.popen(0, [*wrap, sys.executable, XFER, "send", "--to", dst, "--port", str(port), "--bytes", "16M",
                        "--seconds", str(SECONDS), "--timeout", "30"],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(max(0.0, start + CROSS_AT - time.monotonic()))
    cross = tb.cross_traffic(0, 0, spine, a.cross_rate, CROSS_S, port=port + 100)
    out, _ = cross.communicate(timeout=30)
    s, r = Lab.result(send, 60), Lab.result(recv, 60)
    summ = json.loads(out)
    t0 = summ.get("started")
    got = summ.get("bits_per_second", 0) * (1 - summ.get("lost_percent", 0) / 100) / 1e6
    return {"gbps": s["gbps"], "intact": s["sha256"] == r["sha256"] and not r["reset"], "start": start, "t0": t0,
            "cross_mbit": round(got, 1), "cross_sent_mbit": round(summ.get("bits_per_second", 0) / 1e6, 1),
            "cross_lost_pct": round(summ.get("lost_percent", 0), 2)}


def crossing(lab: Lab) -> tuple[list[int], list[int], int]:
    """Host 0's plane-0 paths to h1, those of them across the spine most of
    them cross (asked from leaf 0's FIB), and that spine."""
    paths = [x for x in lab.paths(0, "h1") if x["plane"] == "p0"]
    spines = lab.spines(0, 0, 1)
    spine = max(range(SPINES), key=lambda s: sum(1 for x in paths if spines[x["ev"]] == s))
    return [x["id"] for x in paths], [x["id"] for x in paths if spines[x["ev"]] == spine], spine


def crossed_share(trace: Path, group: list[int], crossed: list[int], start: float, t0: float,
                  after: tuple[float, ...] = (0.0, 0.1, 0.5, CROSS_S)) -> list[float]:
    """The crossed EVs' share of their plane at t0 + each of `after` (s), from
    the per-EV lines host 0's agent wrote into the weights trace since the
    trial started (a step writes one when it moved the split; the agent
    started with the trial, with an even split)."""
    share, out, marks = len(crossed) / len(group), [], list(after)
    for line in trace.read_text().splitlines() if trace.exists() else []:
        x = json.loads(line)
        if x.get("peer") != "h1" or x.get("paths") != group or x["t"] < start:
            continue
        while marks and x["t"] > t0 + marks[0]:
            out.append(share)
            marks.pop(0)
        share = sum(w for i, w in zip(group, x["ev_w"]) if i in crossed)
    return [round(x, 3) for x in out + [share] * len(marks)]


def show(method: str, tr: dict) -> None:
    """One trial's line on stdout, its clock readings (the agent's, as in the
    weights trace) kept for finding the trial there."""
    print(json.dumps({"method": method, **tr}), flush=True)


def run(a, tmp: Path) -> list[dict]:
    rows = []
    trace = Path(os.environ.get("MRC_WEIGHTS_TRACE") or tmp / "weights.jsonl")
    trace.unlink(missing_ok=True)
    os.environ["MRC_WEIGHTS_TRACE"] = str(trace)    # the agents `mrcctl up` starts inherit it
    fabric = dict(spines=SPINES, leaves=2, link_rate=a.link_rate)
    with Lab(tmp, 2, PLANES, prefix=a.prefix, evs=a.evs, fabric=fabric) as lab:
        lab.up(settle=True)
        for name, extra in (("mrc (per-EV weights, the default)", ""),
                            ("mrc, weights.loss = false", "[weights]\nloss = false\n"),
                            ("mrc, weights.per_ev = false", "[weights]\nper_ev = false\n")):
            lab.write_config(0, **dict(lab.cfg_kw, extra=lab.cfg_kw.get("extra", "") + extra))
            trials = []
            for t in range(a.trials):
                # a fresh agent (`up` alone keeps a running one, and its weights)
                lab.mrcctl(0, "down")
                lab.mrcctl(0, "up")
                # the EV map may give the EVs other ports at every `up`
                lab.wait_ev_map([0])
                group, crossed, spine = crossing(lab)
                tr = trial(lab, a, spine, 5800 + len(rows) * 20 + t, lab.overlay(1))
                tr["crossed"] = f"{len(crossed)} of {len(group)}"
                tr["crossed_share"] = crossed_share(trace, group, crossed, tr["start"], tr["t0"]) \
                    if tr["t0"] else None
                trials.append(tr)
                show(name, tr)
            rows.append({"method": name, "crossed": ", ".join(sorted({t["crossed"] for t in trials})),
                         "trials": trials})
        lab.write_config(0, **lab.cfg_kw)
        lab.mrcctl(0, "up")
        lab.wait_ev_map([0])
        spine = crossing(lab)[2]
        mptcp_setup(lab.tb)
        trials = [trial(lab, a, spine, 5860 + t, lab.tb.addr(1, 0, 0), mptcp=True) for t in range(a.trials)]
        for tr in trials:
            show("mptcp", tr)
        rows.append({"method": "mptcp, a subflow per plane", "crossed": "-", "trials": trials})
        for i in (0, 1):
            lab.tb.exec(i, ["ip", "mptcp", "endpoint", "flush"], check=False)
    return rows


def write(rows: list[dict], a, out: Path, cmd: str) -> None:
    fair = parse_rate(a.link_rate) / 2e6

    def med(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2] if xs else None

    md = [f"Produced by `{cmd}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {a.trials} trials per "
          f"row, one TCP connection of {SECONDS:g} s from host 0 to host 1 on the other leaf, {a.evs} EVs per "
          f"plane, links of {a.link_rate}; {CROSS_S:g} s of UDP at {a.cross_rate} into one leaf-spine link "
          f"of plane 0, {CROSS_AT:g} s in; the cross stream's fair share is {fair:g} Mbit/s).", "",
          "| method | EVs of plane 0 across the link | goodput, Gbit/s (each trial) | cross stream through, "
          "Mbit/s (each trial) | what it sent of its rate, Mbit/s (median) | its loss, % (median) | the "
          f"crossed EVs' share of plane 0 at +0 / 0.1 / 0.5 / {CROSS_S:g} s after the stream began "
          "(median) | intact |",
          "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ts = r["trials"]
        seen = [t["crossed_share"] for t in ts if t.get("crossed_share")]
        if seen and not r["method"].startswith("mrc, weights.per_ev"):
            at = " / ".join(f"{med([x[k] for x in seen]):.2f}" for k in range(4))
        else:
            at = "– (even)" if r["method"].startswith("mrc") else "–"
        gbps = ", ".join(f"{t['gbps']:.2f}" for t in ts)
        through = ", ".join(f"{t['cross_mbit']:.0f}" for t in ts)
        sent = med([t["cross_sent_mbit"] for t in ts if "cross_sent_mbit" in t])
        md.append(f"| {r['method']} | {r['crossed']} | {gbps} | {through} | "
                  f"{'–' if sent is None else f'{sent:.0f}'} | "
                  f"{med([t['cross_lost_pct'] for t in ts]):.1f} | {at} | {all(t['intact'] for t in ts)} |")
    write_section(out / "cross.md", "Cross traffic on a fabric link", BEGIN, END, md)
    (out / "cross.json").write_text(json.dumps({"command": cmd, "link_rate": a.link_rate,
                                                "cross_rate": a.cross_rate, "rows": rows}, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--link-rate", default="500mbit")
    ap.add_argument("--cross-rate", default="300mbit")
    ap.add_argument("--evs", type=int, default=4)
    ap.add_argument("--prefix", default="bx")
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks"))
    ap.add_argument("--tmp", default="/tmp/bench_cross")
    ap.add_argument("--no-write", action="store_true", help="print only")
    a = ap.parse_args()
    err = preflight("bench_cross.py", "network namespaces")
    if err:
        print(err, file=sys.stderr)
        return 1
    tmp = Path(a.tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    rows = run(a, tmp)
    if not a.no_write:
        write(rows, a, Path(a.out), command("bench_cross.py", ap, a, ("trials", "link_rate", "cross_rate", "evs")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
