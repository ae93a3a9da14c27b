#!/usr/bin/env python3
"""Profile the idle agent of a bench_scale scenario with cProfile.

    python3 scripts/profile_agent.py [--scenario peers1024] [--seconds 20] [--prefix pb] [--out FILE]

Builds the scenario's hub host as scripts/bench_scale.py does, measures the
background agent's idle CPU from /proc for --seconds, then replaces it with
a foreground `mrcctl agent --duration` under cProfile for as long and prints
the top functions by cumulative and by own time (the .prof file is kept).
Under the shared lock: it creates namespaces.
"""

from __future__ import annotations

import argparse
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scale as bs  # noqa: E402
from lab import Lab, MRCCTL  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="peers1024")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--prefix", default="bpf")
    ap.add_argument("--out", type=Path, default=Path("/tmp/mrc-agent.prof"))
    ap.add_argument("--top", type=int, default=35)
    a = ap.parse_args()
    name = a.scenario
    evs, n_absent = (64, 0) if name == "paths256" else (8, int(name[5:]) - 1)
    with tempfile.TemporaryDirectory() as tmp, \
            Lab(Path(tmp), hosts=2, planes=bs.PLANES, evs=evs, prefix=a.prefix) as lab:
        lab.up(hosts=[1])
        cfg = lab.tb.mrc_config(0, evs=evs) + "\n" + bs.absent_peers(lab, n_absent, evs)
        lab.configs[0].write_text(cfg)
        lab.mrcctl(0, "up", timeout=300)
        time.sleep(3)
        pid = bs.agent_pid(lab)
        w = bs.window(lab, pid, a.seconds)
        print(f"background agent idle: {w}", flush=True)
        os.kill(pid, signal.SIGTERM)
        time.sleep(1)
        cmd = ["ip", "netns", "exec", lab.tb.ns(0), sys.executable, "-m", "cProfile", "-o", str(a.out),
               "-m", "mrcctl", "agent", "-c", str(lab.configs[0]), "--duration", str(a.seconds + 3)]
        subprocess.run(cmd, cwd=bs.REPO, check=True, capture_output=True, timeout=a.seconds + 120)
    st = pstats.Stats(str(a.out))
    st.sort_stats("cumulative").print_stats(a.top)
    st.sort_stats("tottime").print_stats(a.top)


if __name__ == "__main__":
    main()
