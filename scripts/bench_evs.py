#!/usr/bin/env python3
"""How many EVs one connection needs on a routed leaf-spine fabric.

    sudo python3 scripts/bench_evs.py [--evs 4,8,16] [--trials 3] [--link-rate 500mbit]
                                      [--ecn-rate 450mbit] [--map-off] [--prefix be] [--out docs/benchmarks]
                                      [--no-write]

Two hosts on different leaves of 2 planes x 2 spines (docs/fabric.md); a leaf
hashes each EV (outer UDP source port) onto one spine. For each EV count, a
fresh testbed with mrc up (defaults otherwise): which spine each of host 0's
EVs takes toward host 1 (the kernel's answer, Fabric.ev_spines), then
--trials transfers of one TCP connection over mrc0 (scripts/xfer.py, 3.2 s):
goodput, and the sender's retransmissions and spurious ones (DSACKed). In the
first testbed, as many trials of MPTCP (one subflow per plane, each pinned to
one spine by the same hash) and of plain TCP over plane 0. The leaf-to-leaf
capacity is planes x spines x the link rate. With --ecn-rate, each testbed then
runs mrc again with every leaf-spine link marking CE on ECN-capable packets
above that rate (Fabric.link_ecn_mark, a phantom queue; tcp_ecn=1 on the hosts),
as a fabric's switches mark instead of queueing. mrc runs with its default EV
map (docs/fabric.md, "The EV map"): the transfers start once the agents have
mapped the fabric, and the spine split is that of the ports on the wire. With
--map-off, each EV count first gets a testbed with `ev_map.mode = "off"` (the
configured EVs as the leaf hashes them).

Writes evs.md (the section between its markers) and evs.json into --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "integration"))

from scripts import command, preflight, write_section  # noqa: E402
from lab import XFER, Lab  # noqa: E402
from scripts.bench_failover import mptcp_setup, nstat, retransmissions, wait_established  # noqa: E402
from mrcctl.lab.testbed import parse_rate  # noqa: E402

BEGIN, END = "<!-- bench_evs.py results: begin -->", "<!-- bench_evs.py results: end -->"
SECONDS = 3.2
PLANES, SPINES = 2, 2


def transfer(lab: Lab, dst: str, port: int, mptcp: bool = False) -> dict:
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
    n0 = nstat(tb, 0)
    send = tb.popen(0, [*wrap, sys.executable, XFER, "send", "--to", dst, "--port", str(port), "--bytes", "16M",
                        "--seconds", str(SECONDS), "--timeout", "30"],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_established(tb, 0, port)
    s, r = Lab.result(send, 60), Lab.result(recv, 60)
    n1 = nstat(tb, 0)
    segs = n1.get("TcpOutSegs", 0) - n0.get("TcpOutSegs", 0)
    rt = retransmissions(n0, n1)
    return {"gbps": s["gbps"], "intact": s["sha256"] == r["sha256"] and not r["reset"], "segs": segs,
            "retrans_pct": round(100 * rt["retrans"] / max(segs, 1), 2),
            "spurious_pct": round(100 * rt["spurious"] / max(segs, 1), 2), "rto": rt["rto"]}


def spines_of(lab: Lab) -> dict[str, int]:
    """'p{plane} s{spine}' -> how many of host 0's EVs toward host 1 take it."""
    tb, paths = lab.tb, lab.paths(0)
    out: Counter = Counter()
    for p in range(PLANES):
        dev = tb.dev(0, 1, p)
        evs = [x["wire_ev"] for x in paths if x["plane"] == dev]
        for s in tb.ev_spines(p, 0, 1, evs).values():
            out[f"p{p} s{s}"] += 1
    return {f"p{p} s{s}": out.get(f"p{p} s{s}", 0) for p in range(PLANES) for s in range(SPINES)}


def summary(trials: list[dict]) -> dict:
    def col(k):
        return sorted(t[k] for t in trials)
    return {"trials": trials, "gbps": col("gbps"), "spurious_pct": col("spurious_pct"),
            "retrans_pct": col("retrans_pct"), "rto": sum(t["rto"] for t in trials),
            "intact": all(t["intact"] for t in trials)}


MAP_OFF = """
[ev_map]
mode = "off"
"""


def run(a, tmp: Path) -> list[dict]:
    rows = []
    fabric = dict(spines=SPINES, leaves=2, link_rate=a.link_rate)
    first = True
    for evs in (int(x) for x in a.evs.split(",")):
        for mapped in ((False, True) if a.map_off else (True,)):
            tag = f"evs{evs}" + ("-map" if mapped else "")
            (tmp / tag).mkdir(parents=True, exist_ok=True)
            with Lab(tmp / tag, 2, PLANES, prefix=a.prefix, evs=evs, fabric=fabric,
                     **({} if mapped else {"extra": MAP_OFF})) as lab:
                lab.up(settle=True)       # and mapped (Lab.settle)
                if first:
                    rows += baselines(lab, a)
                    first = False
                rows += mrc_rows(lab, a, evs, " (EV map)" if mapped else "")
    return rows


def baselines(lab: Lab, a) -> list[dict]:
    rows = []
    for name, dst, mptcp in (("tcp, plane 0", lab.tb.addr(1, 0, 0), False),
                             ("mptcp, a subflow per plane", lab.tb.addr(1, 0, 0), True)):
        if mptcp:
            mptcp_setup(lab.tb)
        row = {"method": name, **summary([transfer(lab, dst, 5900 + t, mptcp) for t in range(a.trials)])}
        print(json.dumps({x: row[x] for x in ("method", "gbps", "spurious_pct")}), flush=True)
        rows.append(row)
    for i in (0, 1):
        lab.tb.exec(i, ["ip", "mptcp", "endpoint", "flush"], check=False)
    return rows


def mrc_rows(lab: Lab, a, evs: int, tag: str) -> list[dict]:
    row = {"method": f"mrc, {evs} EVs per plane{tag}", "evs": evs, "spines": spines_of(lab),
           **summary([transfer(lab, lab.overlay(1), 5950 + t) for t in range(a.trials)])}
    print(json.dumps({x: row[x] for x in ("method", "spines", "gbps", "spurious_pct")}), flush=True)
    rows = [row]
    if a.ecn_rate:
        # what a fabric that marks instead of queueing tells the sender
        for i in (0, 1):
            lab.tb.exec(i, ["sysctl", "-qw", "net.ipv4.tcp_ecn=1"])
        for p in range(PLANES):
            for s in range(SPINES):
                for lf in (0, 1):
                    lab.tb.link_ecn_mark(p, lf, s, direction="both", rate=a.ecn_rate)
        row = {"method": f"mrc, {evs} EVs per plane{tag}, links mark CE above {a.ecn_rate}", "evs": evs,
               "spines": row["spines"],
               **summary([transfer(lab, lab.overlay(1), 5970 + t) for t in range(a.trials)])}
        print(json.dumps({x: row[x] for x in ("method", "gbps", "spurious_pct")}), flush=True)
        rows.append(row)
    return rows


def write(rows: list[dict], a, out: Path, cmd: str) -> None:
    cap = PLANES * SPINES * parse_rate(a.link_rate) / 1e9
    mptcp = next((r for r in rows if r["method"].startswith("mptcp")), None)
    mptcp_med = mptcp["gbps"][len(mptcp["gbps"]) // 2] if mptcp else None
    md = [f"Produced by `{cmd}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {a.trials} transfers of "
          f"{SECONDS} s per row, one TCP connection from host 0 to host 1 on the other leaf; leaf-to-leaf "
          f"capacity {cap:g} Gbit/s: {PLANES} planes x {SPINES} spines x {a.link_rate}).", "",
          "| method | host 0's EVs per spine link (p0 s0, p0 s1, p1 s0, p1 s1) | Gbit/s (each trial) | "
          "median x capacity | median x MPTCP | spurious retransmissions, % of segments | RTOs | intact |",
          "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        med = r["gbps"][len(r["gbps"]) // 2]
        split = ", ".join(str(v) for v in r["spines"].values()) if "spines" in r else "–"
        x_mptcp = f"{med / mptcp_med:.2f}" if mptcp_med else "–"
        md.append(f"| {r['method']} | {split} | {', '.join(f'{g:.2f}' for g in r['gbps'])} | {med / cap:.2f} | "
                  f"{x_mptcp} | {', '.join(f'{s:.2f}' for s in r['spurious_pct'])} | {r['rto']} | "
                  f"{r['intact']} |")
    write_section(out / "evs.md", "EVs per plane on a routed fabric", BEGIN, END, md)
    (out / "evs.json").write_text(json.dumps({"command": cmd, "link_rate": a.link_rate, "rows": rows}, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--evs", default="4,8,16", help="EV counts per plane, one testbed each")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--link-rate", default="500mbit")
    ap.add_argument("--ecn-rate", default=None,
                    help="also run mrc with every fabric link marking CE above this rate (e.g. 450mbit)")
    ap.add_argument("--map-off", action="store_true",
                    help="also run each EV count with ev_map.mode = off (a testbed before the default one)")
    ap.add_argument("--prefix", default="be")
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks"))
    ap.add_argument("--tmp", default="/tmp/bench_evs")
    ap.add_argument("--no-write", action="store_true", help="print only")
    a = ap.parse_args()
    err = preflight("bench_evs.py", "network namespaces")
    if err:
        print(err, file=sys.stderr)
        return 1
    tmp = Path(a.tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    rows = run(a, tmp)
    if not a.no_write:
        write(rows, a, Path(a.out), command("bench_evs.py", ap, a, ("evs", "trials", "link_rate", "ecn_rate", "map_off")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
