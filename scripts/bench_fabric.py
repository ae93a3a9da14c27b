#!/usr/bin/env python3
"""Collective benchmark on a routed leaf-spine fabric: a real MPI_Allreduce.

    sudo python3 scripts/bench_fabric.py [--hosts 4] [--link-rate 200mbit] [--mib 8] [--iters 20]
                                         [--trials 1] [--out docs/benchmarks] [--quick] [--yield-when-idle]

One fabric (mrcctl.lab.fabric: P planes, each 2 leaves x S spines, hosts
split across the leaves, leaf-spine links shaped to --link-rate), mrc up on
every host. OpenMPI's TCP transport (mpirun launched into the namespaces,
mrcctl/lab/mpi.py) runs MPI_Allreduce of --mib MiB per rank from mpi4py
(scripts/mpi_allreduce.py; every result is checked) over:

  one-plane    btl_tcp_if_include p0: ECMP-hashed TCP on plane 0
  multi-rail   btl_tcp_if_include p0,p1,...: OpenMPI's own striping over the planes
  mrc          btl_tcp_if_include mrc0: every connection sprayed over all EVs

each healthy and then across a gray failure: after --fail-at iterations one
plane-0 leaf-spine link (leaf 0, spine 0) drops everything in both
directions with its carrier up. A job stuck on the dead link is killed after
--hang-timeout and reported as hung. OpenMPI's out-of-band channel runs on
mrc0 in every scenario, so only the data path differs.

Plus all-to-all: every host sends to every other at once with iperf3
(--a2a-seconds), over plane 0 (ECMP-hashed TCP) and over mrc0.

Reported: allreduce bus bandwidth (nccl-tests' definition, 2(n-1)/n of the
buffer per iteration time), iteration-time median / p90 / max and worst over
median, hung jobs; all-to-all aggregate Gbit/s. Writes fabric.md,
fabric.json and fabric.png into --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "integration"))

from scripts import preflight  # noqa: E402
from lab import Lab  # noqa: E402
from mrcctl.lab import mpi  # noqa: E402

FAIL_LINK = (0, 0, 0)   # plane, leaf, spine


def methods(planes: int) -> dict[str, str]:
    return {"one-plane": "p0", "multi-rail": ",".join(f"p{p}" for p in range(planes)), "mrc": "mrc0"}


def names(lab: Lab, hosts: list[int]) -> list[str]:
    return [lab.overlay(i) for i in hosts]


def run_job(lab: Lab, tmp: Path, btl_if: str, a, fail: bool) -> dict:
    hosts = list(lab.tb.hosts())
    t_fail: list[float] = []

    def on_iter(rec: dict) -> None:
        if fail and not t_fail and rec["iter"] + 1 >= a.fail_at:
            lab.tb.link_blackhole(*FAIL_LINK, on=True, direction="both")
            t_fail.append(time.time())

    job = mpi.allreduce(lab.tb, hosts, names(lab, hosts), tmp, btl_if, "mrc0", mib=a.mib, iters=a.iters,
                        warmup=a.warmup, timeout=a.hang_timeout if fail else a.hang_timeout * 2,
                        on_iter=on_iter, yield_idle=a.yield_when_idle)
    if fail:
        lab.tb.link_blackhole(*FAIL_LINK, on=False, direction="both")
    out = mpi.summary(job)
    out["iter_ms"] = [round(r["seconds"] * 1000, 1) for r in job["iters"]]
    if t_fail:
        out["fail_after_iter"] = a.fail_at
    if not job["done"]:
        out["stderr_tail"] = job["stderr_tail"][-400:]
    return out


def all_to_all(lab: Lab, via: str, seconds: float, port0: int = 5400) -> dict:
    """Every host sends to every other at once; aggregate received Gbit/s."""
    hosts = list(lab.tb.hosts())
    addr = (lambda j: lab.overlay(j)) if via == "mrc0" else (lambda j: lab.tb.host_addr(j, 0))
    servers, clients = [], []
    for j in hosts:
        for i in hosts:
            if i != j:
                servers.append(lab.tb.popen(j, ["iperf3", "-s", "-1", "-B", addr(j), "-p", str(port0 + i)],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(0.5)
    for j in hosts:
        for i in hosts:
            if i != j:
                clients.append(lab.tb.popen(i, ["iperf3", "-c", addr(j), "-p", str(port0 + i), "-t", str(seconds),
                                                "-J"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
    total, flows, errors = 0.0, [], 0
    for c in clients:
        try:
            out, _ = c.communicate(timeout=seconds + 30)
            res = json.loads(out)
            bps = res["end"]["sum_received"]["bits_per_second"]
            total += bps
            flows.append(bps / 1e9)
        except Exception:
            c.kill()
            errors += 1
    for s in servers:
        try:
            s.wait(timeout=5)
        except subprocess.TimeoutExpired:
            s.kill()
    return {"gbps_total": round(total / 1e9, 3), "flows": len(flows), "errors": errors,
            "gbps_min_flow": round(min(flows), 3) if flows else None}


def plot(results: dict, path: Path, a) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, key, title in ((axes[0], "healthy", "healthy fabric"),
                           (axes[1], "gray", f"link p{FAIL_LINK[0]} leaf{FAIL_LINK[1]}-spine{FAIL_LINK[2]} "
                                             f"dead after iteration {a.fail_at}")):
        for name, r in results["allreduce"].items():
            ms = r[key].get("iter_ms") or []
            ax.plot(range(len(ms)), ms, marker=".", label=name + (" (hung)" if r[key].get("hung") else ""))
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        ax.set_yscale("log")
    axes[0].set_ylabel(f"MPI_Allreduce {a.mib:g} MiB, ms")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def fmt(x) -> str:
    return "–" if x is None else str(x)


def write_md(results: dict, a, out: Path, cmd: str) -> None:
    ar = results["allreduce"]
    base = ar.get("multi-rail", {}).get("healthy", {}).get("busbw_gbit_median")
    lines = ["# Collective benchmark: MPI_Allreduce on a routed leaf-spine fabric", "",
             f"Command: `{cmd}`  ", f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(results['started']))}, "
             f"{results['machine']}.", "",
             f"{a.hosts} hosts on {a.planes} planes, each plane 2 leaves x {a.spines} spines, leaf-spine links "
             f"{a.link_rate}, {a.evs} EVs per plane for mrc. OpenMPI {results.get('ompi', '?')} TCP transport, "
             f"one rank per host{' (yielding the CPU while waiting)' if a.yield_when_idle else ''}, MPI_Allreduce of {a.mib:g} MiB per rank, {a.iters} timed iterations after "
             f"{a.warmup} warm-up; every result checked (sum of the ranks). Bus bandwidth as nccl-tests define "
             f"it: 2 (n-1)/n x buffer / iteration time.", "",
             "## Allreduce", "",
             "| method | fabric | bus bw median (Gbit/s) | x multi-rail | iteration ms median | p90 | max | "
             "max / median | finished | correct |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in ar.items():
        for key in ("healthy", "gray"):
            s = r[key]
            ratio = round(s["busbw_gbit_median"] / base, 2) if base and s.get("busbw_gbit_median") else None
            fin = "yes" if s.get("done") else ("**hung**, killed" if s.get("hung") else "no")
            lines.append(f"| {name} | {key} | {fmt(s.get('busbw_gbit_median'))} | {fmt(ratio)} | "
                         f"{fmt(s.get('iter_ms_median'))} | {fmt(s.get('iter_ms_p90'))} | {fmt(s.get('iter_ms_max'))} | "
                         f"{fmt(s.get('worst_over_median'))} | {fin} ({s.get('iterations', 0)} of {a.iters}) | "
                         f"{fmt(s.get('all_correct'))} |")
    lines += ["", f"`gray`: after iteration {a.fail_at} the link plane {FAIL_LINK[0]} leaf {FAIL_LINK[1]} - "
              f"spine {FAIL_LINK[2]} drops everything both ways with its carrier up; a job that did not finish "
              f"within {a.hang_timeout:g} s was killed.", "",
              "## All-to-all (iperf3, every host to every other at once)", "",
              "| via | aggregate Gbit/s | slowest flow Gbit/s | flows | errors |", "|---|---|---|---|---|"]
    for via, r in results["all_to_all"].items():
        lines.append(f"| {via} | {fmt(r.get('gbps_total'))} | {fmt(r.get('gbps_min_flow'))} | "
                     f"{fmt(r.get('flows'))} | {fmt(r.get('errors'))} |")
    if results.get("plot"):
        lines += ["", "![allreduce iteration times](fabric.png)"]
    lines += ["", "Raw figures: fabric.json.", ""]
    (out / "fabric.md").write_text("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--planes", type=int, default=2)
    ap.add_argument("--spines", type=int, default=2)
    ap.add_argument("--link-rate", default="200mbit")
    ap.add_argument("--evs", type=int, default=4)
    ap.add_argument("--mib", type=float, default=8.0)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--fail-at", type=int, default=5, help="iterations before the gray failure")
    ap.add_argument("--hang-timeout", type=float, default=60.0)
    ap.add_argument("--a2a-seconds", type=float, default=8.0)
    ap.add_argument("--runs", default="one-plane,multi-rail,mrc")
    ap.add_argument("--yield-when-idle", action="store_true",
                    help="ranks waiting for data yield the CPU instead of polling (mrcctl/lab/mpi.py)")
    ap.add_argument("--quick", action="store_true", help="2 MiB, 8 iterations, 4 s all-to-all")
    ap.add_argument("--prefix", default="bfab")
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks"))
    ap.add_argument("--tmp", default="/tmp/mrc-bench-fabric")
    a = ap.parse_args()
    if a.quick:
        a.mib, a.iters, a.a2a_seconds, a.fail_at = 2.0, 8, 4.0, 3
    err = preflight("bench_fabric.py", "namespaces, BPF") or mpi.missing()
    if err:
        print(err, file=sys.stderr)
        return 1
    out, tmp = Path(a.out), Path(a.tmp)
    out.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    ompi = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    results: dict = {"started": time.time(), "allreduce": {}, "all_to_all": {},
                     "machine": f"{subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} CPUs",
                     "ompi": ompi.split()[-1] if ompi else "?"}
    with Lab(tmp, a.hosts, a.planes, prefix=a.prefix, evs=a.evs,
             fabric=dict(spines=a.spines, leaves=2, link_rate=a.link_rate)) as lab:
        lab.up(settle=True)       # every path GOOD and the fabric mapped (Lab.settle)
        for name, btl_if in methods(a.planes).items():
            if name not in a.runs.split(","):
                continue
            r = {}
            for key, fail in (("healthy", False), ("gray", True)):
                print(f"== allreduce {name} {key}", flush=True)
                r[key] = run_job(lab, tmp / name / key, btl_if, a, fail)
                print(json.dumps({k: v for k, v in r[key].items() if k != "iter_ms"}), flush=True)
                time.sleep(2.0)   # let the healed link's EVs come back before the next job
            results["allreduce"][name] = r
        for via in ("p0", "mrc0"):
            print(f"== all-to-all {via}", flush=True)
            results["all_to_all"][via] = all_to_all(lab, via, a.a2a_seconds)
            print(json.dumps(results["all_to_all"][via]), flush=True)
    results["plot"] = plot(results, out / "fabric.png", a)
    (out / "fabric.json").write_text(json.dumps(results, indent=2))
    write_md(results, a, out, "sudo python3 scripts/bench_fabric.py " + " ".join(sys.argv[1:]))
    print(f"wrote {out / 'fabric.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
