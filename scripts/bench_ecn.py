#!/usr/bin/env python3
"""ECN-driven EV avoidance on a routed fabric (bpf/congest.h).

    sudo python3 scripts/bench_ecn.py [--trials 5] [--mib 96] [--link-rate 1gbit]
                                      [--mark-rate RATE] [--out docs/benchmarks]

Two hosts on different leaves, 2 planes x 2 spines (mrcctl.lab.fabric). The
leaf-0 uplink of plane 0 to the spine most of plane 0's EVs hash to marks CE
(bpf/ecn_mark.bpf.c: every ECN-capable packet, or with --mark-rate only
while the link carries more than that). One TCP connection with ECN
(net.ipv4.tcp_ecn = 1 on the sender) moves --mib MiB from h0 to h1, in
trials that alternate weights.ecn_hold_us = 1000 (the default) and 0 (off)
in the same run. Reported per trial: goodput, the wire packets the spray
sent per marked EV over the mean of the unmarked ones (1.0: no avoidance),
CE marks the receiver counted, ECE echoes the sender heard, TCP
retransmissions. Writes ecn.md and ecn.json into --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "integration"))

from scripts import preflight  # noqa: E402
from lab import FAST_HEALTH as HEALTH, Lab  # noqa: E402

HOLDS = (1000, 0)


def trial(lab: Lab, marked: set[int], mib: int, port: int) -> dict:
    before = {x["ev"]: x for x in lab.paths(0, "h1")}
    rx_before = {x["ev"]: x["rx_ce"] for x in lab.paths(1, "h0")}
    retx0 = lab.nstat(0).get("TcpRetransSegs", 0)
    t0 = time.monotonic()
    s, r = lab.transfer(0, 1, f"{mib}M", port=port, timeout=120)
    secs = time.monotonic() - t0
    if s["sha256"] != r["sha256"]:
        raise SystemExit(f"sha256 mismatch in a trial: {s} {r}")
    after = {x["ev"]: x for x in lab.paths(0, "h1")}
    sent = {ev: (after[ev]["tx_packets"] - before[ev]["tx_packets"])
            - sum(after[ev][k] - before[ev][k] for k in ("tx_steered", "tx_hedged")) for ev in after}
    hot = statistics.mean(v for ev, v in sent.items() if ev in marked)
    cold = statistics.mean(v for ev, v in sent.items() if ev not in marked)
    ce = sum(x["rx_ce"] - rx_before[x["ev"]] for x in lab.paths(1, "h0"))
    echoes = sum(after[ev]["ecn_echoes"] - before[ev]["ecn_echoes"] for ev in after)
    return {"gbps": round(r["bytes"] * 8 / secs / 1e9, 3), "marked_share": round(hot / cold, 3),
            "ce": ce, "ece_echoes": echoes, "retrans": lab.nstat(0).get("TcpRetransSegs", 0) - retx0}


def write_md(results: dict, a, out: Path, cmd: str, layout: dict) -> None:
    lines = ["# ECN-driven EV avoidance on a leaf-spine fabric", "",
             f"Command: `{cmd}`  ",
             f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; shared 2-vCPU VM, so goodput is "
             "CPU-bound and noisy; the share ratio is the measure.", "",
             f"Fabric: 2 hosts on different leaves, 2 planes x 2 spines, links {a.link_rate}; plane 0 leaf 0 -> "
             f"spine {layout['spine']} marks CE ({'above ' + a.mark_rate if a.mark_rate else 'every ECT packet'}); "
             f"EVs across it: {sorted(layout['marked'])} of plane 0's {sorted(layout['evs'])}.", "",
             "`marked share`: wire packets the spray sent per marked EV over the mean per unmarked EV "
             "(retransmissions steered to the freshest path and hedged copies left out); 1.0 means no avoidance.", "",
             "| ecn_hold_us | trial | Gbit/s | marked share | CE at receiver | ECE echoes | TCP retransmissions |",
             "|---|---|---|---|---|---|---|"]
    for hold in HOLDS:
        for i, t in enumerate(results[str(hold)]):
            lines.append(f"| {hold} | {i + 1} | {t['gbps']} | {t['marked_share']} | {t['ce']} | "
                         f"{t['ece_echoes']} | {t['retrans']} |")
    lines += ["", "| ecn_hold_us | marked share, median (min-max) | Gbit/s, median |", "|---|---|---|"]
    for hold in HOLDS:
        sh = [t["marked_share"] for t in results[str(hold)]]
        gb = [t["gbps"] for t in results[str(hold)]]
        lines.append(f"| {hold} | {statistics.median(sh):.3f} ({min(sh):.3f}-{max(sh):.3f}) | "
                     f"{statistics.median(gb):.3f} |")
    (out / "ecn.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--mib", type=int, default=96)
    ap.add_argument("--link-rate", default="1gbit")
    ap.add_argument("--mark-rate", default=None, help="mark only above this rate (phantom queue)")
    ap.add_argument("--prefix", default="becn")
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks"))
    a = ap.parse_args()
    err = preflight("bench_ecn.py", "namespaces, BPF")
    if err:
        print(err, file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list] = {str(h): [] for h in HOLDS}
    with Lab(Path(tempfile.mkdtemp(prefix="mrc-bench-ecn")), 2, 2, prefix=a.prefix, evs=4, extra=HEALTH,
             fabric=dict(spines=2, leaves=2, link_rate=a.link_rate)) as lab:
        lab.up(settle=True)
        spines = lab.spines(0, 0, 1)
        spine = max((0, 1), key=lambda s: sum(1 for v in spines.values() if v == s))
        marked = {ev for ev, s in spines.items() if s == spine}
        lab.tb.exec(0, ["sysctl", "-qw", "net.ipv4.tcp_ecn=1"])
        lab.tb.link_ecn_mark(0, 0, spine, direction="up", rate=a.mark_rate)
        for i in range(a.trials):
            for hold in HOLDS:
                lab.write_config(0, **dict(lab.cfg_kw, extra=HEALTH + f"[weights]\necn_hold_us = {hold}\n"))
                lab.mrcctl(0, "up")
                t = trial(lab, marked, a.mib, 5700 + i * 2 + (hold == 0))
                results[str(hold)].append(t)
                print(f"trial {i + 1} hold {hold}: {t}", flush=True)
    layout = {"spine": spine, "marked": marked, "evs": evs}
    (out / "ecn.json").write_text(json.dumps({"results": results, "layout": {**layout, "marked": sorted(marked)}},
                                             indent=1) + "\n")
    write_md(results, a, out, "sudo python3 scripts/bench_ecn.py " + " ".join(sys.argv[1:]), layout)
    print(f"wrote {out / 'ecn.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
