"""OpenMPI jobs across testbed namespaces: a real collective client.

mpirun runs inside the first host's namespace; its rsh launcher is a small
script that maps a host name (the host's address on the out-of-band device)
to `ip netns exec NS`, so OpenMPI starts its daemons in the other namespaces
as it would over ssh. The ranks run scripts/mpi_allreduce.py under the
distribution's python3 (python3-mpi4py is not visible to a venv).

Which devices carry the data is OpenMPI's own choice, told by
``btl_tcp_if_include``: one plane (``p0``), its multi-rail striping over every
plane (``p0,p1``), or mrc's overlay (``mrc0``). The out-of-band channel stays on
a device the caller names, one that no injected fault touches.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from ..datapath.objects import bpf_dir

MPI_PYTHON = "/usr/bin/python3"
RANK_SCRIPT = bpf_dir().parent / "scripts" / "mpi_allreduce.py"


def missing() -> str | None:
    """Why OpenMPI jobs cannot run here, or None when they can."""
    if not shutil.which("mpirun"):
        return "mpirun not found (install openmpi-bin: scripts/setup.sh does)"
    cp = subprocess.run([MPI_PYTHON, "-c", "import mpi4py, numpy"], capture_output=True, text=True)
    if cp.returncode != 0:
        return f"{MPI_PYTHON} cannot import mpi4py and numpy (install python3-mpi4py python3-numpy)"
    return None


def write_launcher(path: Path, hosts: dict[str, str]) -> Path:
    """An rsh agent for OpenMPI: `AGENT [options] HOST CMD...` runs CMD in
    HOST's namespace. hosts: host name -> namespace."""
    cases = "\n".join(f'  {name}) ns={ns} ;;' for name, ns in hosts.items())
    path.write_text(f"""#!/bin/sh
# OpenMPI rsh agent for the mrc testbed (mrcctl/lab/mpi.py)
while [ "${{1#-}}" != "$1" ]; do shift; done
host=$1; shift
case "$host" in
{cases}
  *) echo "unknown host $host" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" sh -c "$*"
""")
    path.chmod(0o755)
    return path


def mpirun_cmd(launcher: Path, names: list[str], btl_if: str, oob_if: str, script_args: list[str],
               yield_idle: bool = False) -> list[str]:
    """yield_idle: ranks waiting for data give the CPU away (sched_yield)
    instead of polling flat out. OpenMPI polls unless it knows a node is
    oversubscribed, and it takes each namespace for a node of its own; on a
    testbed whose hosts share a few CPUs a polling rank takes CPU the other
    hosts' kernels need to move its data."""
    return ["mpirun", "--allow-run-as-root", "-np", str(len(names)),
            "--host", ",".join(f"{n}:1" for n in names), "--bind-to", "none",
            "--mca", "plm_rsh_agent", str(launcher), "--mca", "routed", "direct",
            "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
            "--mca", "btl_tcp_if_include", btl_if, "--mca", "oob_tcp_if_include", oob_if,
            # no topology in shared memory at a guessed address hole: in 1 of
            # 30-45 jobs a daemon died there (SIGSEGV in hwloc_shmem_topology_write,
            # next to the stack) before it called back, and mpirun waited forever
            "--mca", "rtc_hwloc_vmhole", "none",
            *(["--mca", "mpi_yield_when_idle", "1"] if yield_idle else []),
            MPI_PYTHON, str(RANK_SCRIPT), *script_args]


def allreduce(tb, hosts: list[int], names: list[str], tmp: Path, btl_if: str, oob_if: str = "mrc0",
              mib: float = 8.0, iters: int = 20, warmup: int = 2, timeout: float = 120.0,
              on_iter: Callable[[dict], None] | None = None, yield_idle: bool = False) -> dict:
    """Run an MPI_Allreduce job over `hosts` (namespaces of testbed `tb`,
    known to OpenMPI as `names`, their addresses on `oob_if`). Returns the
    per-iteration records rank 0 printed, `done` (the job ended by itself),
    `hung` (it hit `timeout` and was killed) and the tail of its stderr.
    on_iter is called with each iteration record as it arrives."""
    tmp.mkdir(parents=True, exist_ok=True)
    launcher = write_launcher(tmp / "mpi-agent.sh", {n: tb.ns(i) for i, n in zip(hosts, names)})
    cmd = mpirun_cmd(launcher, names, btl_if, oob_if,
                     ["--mib", str(mib), "--iters", str(iters), "--warmup", str(warmup)], yield_idle)
    err_path = tmp / f"mpirun-{btl_if.replace(',', '+')}.err"
    with open(err_path, "w") as err:
        # its own session: a rank stuck on a dead path is ended with the whole group
        proc = subprocess.Popen(tb.ns_cmd(hosts[0], cmd), stdout=subprocess.PIPE, stderr=err, text=True,
                                start_new_session=True, env={**os.environ, "OMPI_MCA_plm_rsh_no_tree_spawn": "1"})
        lines: queue.Queue = queue.Queue()
        eof = threading.Event()

        def read() -> None:
            for x in proc.stdout:
                lines.put(x)
            eof.set()
        threading.Thread(target=read, daemon=True).start()
        out: dict = {"iters": [], "done": False, "hung": False, "btl_if": btl_if}
        deadline = time.monotonic() + timeout
        drained_by = None
        while True:
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                # mpirun may exit before the reader has queued its last
                # lines (the "done" record among them): stop at the pipe's
                # end, or 5 s after the exit if a straggler holds it open
                if proc.poll() is not None and lines.empty():
                    drained_by = drained_by or time.monotonic() + 5
                    if eof.is_set() or time.monotonic() > drained_by:
                        break
                if time.monotonic() > deadline:
                    out["hung"] = True
                    break
                continue
            if not line.startswith("{"):
                continue
            rec = json.loads(line)
            if rec.get("done"):
                out["done"] = True
                out["bad"] = rec["bad"]
                out["bytes"] = rec["bytes"]
                out["ranks"] = rec["ranks"]
            else:
                out["iters"].append(rec)
                if on_iter:
                    on_iter(rec)
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=10)
        out["returncode"] = proc.returncode
    out["stderr_tail"] = err_path.read_text()[-2000:]
    return out


def summary(job: dict) -> dict:
    """Bus bandwidth and iteration-time distribution of one job."""
    secs = sorted(r["seconds"] for r in job["iters"])
    if not secs:
        return {"iterations": 0, "done": job["done"], "hung": job["hung"]}
    med = secs[len(secs) // 2]
    return {"iterations": len(secs), "done": job["done"], "hung": job["hung"],
            "all_correct": job["done"] and job.get("bad", 1) == 0 and all(r["ok"] for r in job["iters"]),
            "busbw_gbit_median": round(sorted(r["busbw_gbit"] for r in job["iters"])[len(secs) // 2], 3),
            "iter_ms_median": round(med * 1000, 1), "iter_ms_p90": round(secs[int(0.9 * (len(secs) - 1))] * 1000, 1),
            "iter_ms_max": round(secs[-1] * 1000, 1), "worst_over_median": round(secs[-1] / med, 2)}
