#!/usr/bin/env python3
"""`mrcctl up` to the first forwarded packet.

    sudo python3 scripts/bench_up.py [--trials 7] [--planes 4] [--evs 4] [--rx-hook xdp|tc|auto]
                                     [--label NAME] [--prefix bup] [--out docs/benchmarks]
                                     [--variant NAME=DIR ...] [--name NAME]

A two-host testbed; h1 runs mrc (with its agent) the whole time. Each trial
takes h0 down, flushes h0's neighbour table (a host coming up does not find
its peers' MACs cached), and starts, before anything of mrc exists on h0:

  * in h0 a UDP sender to h1's overlay address, one datagram per ms (its
    sends fail until `up` has made the overlay device and its route);
  * in h1 the same toward h0's overlay address (mrc_tx on h1 encapsulates
    them; h0's planes drop them until its receive programs run);
  * a receiver on each side, which keeps the kernel's receive timestamp
    (SO_TIMESTAMPNS) of the first datagram that arrives.

Then `ip netns exec h0 python -m mrcctl up -c h0.toml` runs, timed from just
before the process starts. Reported per trial: `up`'s wall time, the time
from its start to the first datagram h0 -> h1 arriving at h1 (h0's transmit
path works: overlay device, route, mrc_tx, maps, and h1's receive side
accepted h0's new epoch), to the first datagram h1 -> h0 arriving at h0
(h0's receive programs attached and their maps filled), and the later of
the two. The sender's period (1 ms) bounds the resolution.

`--variant NAME=DIR` (repeatable) runs h0's `mrcctl` from another source
tree (e.g. `git archive` of an earlier commit with `make -C DIR/bpf`), its
trials interleaved with the others' in one run, so that a change is measured
against its predecessor under the same load.

Writes up.md (the section between its markers) and up.json (appending a
labelled run) into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "integration"))

from scripts import write_section  # noqa: E402

PORT = 5491
MAGIC = b"MRCUP1"
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)


# ---- the probes, run inside a namespace (`bench_up.py probe send|recv ...`) ----

def probe_send(to: str, seconds: float, period: float) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
        try:
            s.sendto(MAGIC + struct.pack("=Qd", n, time.time()), (to, PORT))
        except OSError:
            pass        # no route yet: the overlay device does not exist
        time.sleep(period)


def probe_recv(ready: str, seconds: float) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    s.bind(("0.0.0.0", PORT))
    s.settimeout(seconds)
    Path(ready).write_text("ready")
    try:
        while True:
            data, anc, _flags, _addr = s.recvmsg(64, socket.CMSG_SPACE(16))
            if not data.startswith(MAGIC):
                continue
            arrived = next((struct.unpack("=qq", d[:16]) for lvl, typ, d in anc
                            if lvl == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS), None)
            at = arrived[0] + arrived[1] / 1e9 if arrived else time.time()
            n, sent = struct.unpack_from("=Qd", data, len(MAGIC))
            print(json.dumps({"arrived": at, "seq": n, "sent": sent}), flush=True)
            return
    except socket.timeout:
        print(json.dumps({"arrived": None}), flush=True)


# ---- the benchmark ------------------------------------------------------------

def mrcctl_in(tree: Path) -> tuple[list[str], dict]:
    return [sys.executable, "-m", "mrcctl"], {**os.environ, "PYTHONPATH": str(tree)}


def trial(lab, tmp: Path, timeout: float, tree: Path) -> dict:
    cmd, env = mrcctl_in(tree)
    subprocess.run(["ip", "netns", "exec", lab.tb.ns(0), *cmd, "down", "-c", str(lab.configs[0])],
                   capture_output=True, cwd=tree, env=env, timeout=60)
    lab.tb.exec(0, ["ip", "neigh", "flush", "all"], check=False)
    me = [sys.executable, str(Path(__file__).resolve()), "probe"]
    recvs, sends = {}, []
    for i in (0, 1):
        ready = tmp / f"ready{i}"
        ready.unlink(missing_ok=True)
        recvs[i] = lab.tb.popen(i, me + ["recv", "--ready", str(ready), "--seconds", str(timeout)],
                                stdout=subprocess.PIPE, text=True)
        end = time.monotonic() + 10
        while not ready.exists():
            if recvs[i].poll() is not None or time.monotonic() > end:
                raise SystemExit(f"the receiver on h{i} did not start")
            time.sleep(0.01)
    try:
        for i, j in ((0, 1), (1, 0)):
            sends.append(lab.tb.popen(i, me + ["send", "--to", lab.overlay(j), "--seconds", str(timeout)],
                                      stdout=subprocess.DEVNULL))
        time.sleep(0.3)         # the senders run (and fail to send) before up starts
        t0 = time.time()
        cp = subprocess.run(["ip", "netns", "exec", lab.tb.ns(0), *cmd, "up", "-c", str(lab.configs[0])],
                            capture_output=True, text=True, cwd=tree, env=env, timeout=120)
        up_s = time.time() - t0
        if cp.returncode != 0:
            raise SystemExit(f"mrcctl up failed: {cp.stderr.strip()}")
        got = {}
        for i, p in recvs.items():
            out, _ = p.communicate(timeout=timeout + 10)
            got[i] = json.loads(out.strip().splitlines()[-1])["arrived"]
    finally:
        for p in (*sends, *recvs.values()):
            if p.poll() is None:
                p.kill()
                p.wait()
    to_peer = None if got[1] is None else got[1] - t0         # h0 -> h1, arrived at h1
    from_peer = None if got[0] is None else got[0] - t0       # h1 -> h0, arrived at h0
    both = None if None in (to_peer, from_peer) else max(to_peer, from_peer)
    return {"up_s": round(up_s, 3), "first_tx_s": r3(to_peer), "first_rx_s": r3(from_peer),
            "first_both_s": r3(both)}


def r3(x):
    return None if x is None else round(x, 3)


def summary(rows: list[dict], key: str) -> dict:
    vals = [r[key] for r in rows]
    if None in vals:
        return {"median": None, "max": None, "missing": vals.count(None)}
    return {"median": round(statistics.median(vals), 3), "max": round(max(vals), 3),
            "min": round(min(vals), 3)}


KEYS = ("up_s", "first_tx_s", "first_rx_s", "first_both_s")


def run(a, variants: dict[str, Path]) -> list[dict]:
    from lab import Lab
    with tempfile.TemporaryDirectory() as tmp, \
            Lab(Path(tmp), hosts=2, planes=a.planes, evs=a.evs, prefix=a.prefix, rx_hook=a.rx_hook) as lab:
        lab.up(hosts=[1])
        rows: dict[str, list] = {v: [] for v in variants}
        for k in range(a.trials + 1):
            for v, tree in variants.items():
                r = trial(lab, Path(tmp), a.timeout, tree)
                print(json.dumps({"trial": k, "variant": v, **r}), flush=True)
                if k:       # the first one warms the page cache and Python's bytecode cache
                    rows[v].append(r)
        lab.mrcctl(0, "down", check=False)
        return [{"label": a.label if len(variants) == 1 else f"{a.label}: {v}", "time": time.time(),
                 "planes": a.planes, "evs": a.evs, "rx_hook": a.rx_hook, "trials": r,
                 **{k: summary(r, k) for k in KEYS}} for v, r in rows.items()]


BEGIN = "<!-- bench_up.py results: begin -->"
END = "<!-- bench_up.py results: end -->"


def write(out: Path, results: list[dict], cmd: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    jf = out / "up.json"
    runs = json.loads(jf.read_text()) if jf.exists() else []
    labels = {r["label"] for r in results}
    runs = [r for r in runs if r.get("label") not in labels] + [{**r, "cmd": cmd} for r in results]
    jf.write_text(json.dumps(runs, indent=1) + "\n")
    cmds = list(dict.fromkeys(r.get("cmd", cmd) for r in runs))
    md = ["", "Produced by " + ", then ".join(f"`{c}`" for c in cmds) +
          " (each label one run of `--trials` trials after a discarded one; seconds from the start of "
          "`mrcctl up`).", "",
          "| label | planes x EVs | rx_hook | trials | `up` returns, median / max | first h0 -> h1, median / max "
          "| first h1 -> h0, median / max | both directions, median / max |",
          "|---|---|---|---|---|---|---|---|"]

    def cell(s):
        return "lost" if s["median"] is None else f"{s['median']} / {s['max']}"
    for r in runs:
        md.append(f"| {r['label']} | {r['planes']} x {r['evs']} | {r['rx_hook']} | {len(r['trials'])} | "
                  + " | ".join(cell(r[k]) for k in KEYS) + " |")
    md.append("")
    write_section(out / "up.md", "`mrcctl up` to the first forwarded packet", BEGIN, END, md)

def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "probe":
        ap = argparse.ArgumentParser()
        ap.add_argument("mode", choices=["send", "recv"])
        ap.add_argument("--to")
        ap.add_argument("--ready")
        ap.add_argument("--seconds", type=float, default=10)
        ap.add_argument("--period", type=float, default=0.001)
        a = ap.parse_args(sys.argv[2:])
        if a.mode == "send":
            probe_send(a.to, a.seconds, a.period)
        else:
            probe_recv(a.ready, a.seconds)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--planes", type=int, default=4)
    ap.add_argument("--evs", type=int, default=4)
    ap.add_argument("--rx-hook", default="xdp", choices=["xdp", "tc", "auto"],
                    help="every plane's rx_hook (auto is tc on these veth planes)")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds a trial waits for its first packets")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks")
    ap.add_argument("--label", default="main")
    ap.add_argument("--prefix", default="bup")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=DIR",
                    help="also time h0's mrcctl from source tree DIR, interleaved (repeatable)")
    ap.add_argument("--name", default="this tree", help="this tree's name beside --variant ones")
    ap.add_argument("--no-write", action="store_true", help="print only")
    a = ap.parse_args()
    variants = {}
    for v in a.variant:
        name, _, d = v.partition("=")
        if not (Path(d) / "mrcctl").is_dir() or not (Path(d) / "bpf" / "tx.bpf.o").exists():
            raise SystemExit(f"--variant {v}: {d} is no mrc source tree with built BPF objects")
        variants[name] = Path(d).resolve()
    variants[a.name] = REPO
    # as installed: Python's bytecode cache on (an environment may turn it off)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    results = run(a, variants)
    for r in results:
        print(json.dumps({"label": r["label"], **{k: r[k] for k in KEYS}}), flush=True)
    if not a.no_write:
        write(a.out, results, "sudo python3 scripts/bench_up.py " + shlex.join(sys.argv[1:]))


if __name__ == "__main__":
    main()
