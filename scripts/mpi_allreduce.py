"""One MPI rank of the collective benchmark: MPI_Allreduce through mpi4py.

Run by mpirun (scripts/bench_fabric.py starts it) under the distribution's
/usr/bin/python3, which is where python3-mpi4py lives; it imports nothing of
mrc. Every rank fills its buffer from its rank, so the sum is known and each
iteration's result is checked, not just timed. Rank 0 prints one JSON line
per iteration as it finishes (flushed, so the caller can time a fault
against the iterations) and a summary line at the end.

    mpirun ... python3 mpi_allreduce.py --mib 8 --iters 40 --warmup 3
"""

import argparse
import json
import sys
import time

import numpy as np
from mpi4py import MPI


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=float, default=8.0, help="buffer size per rank (MiB)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    n = int(args.mib * (1 << 20)) // 4
    send = np.full(n, rank + 1, dtype=np.float32)
    recv = np.empty(n, dtype=np.float32)
    expect = size * (size + 1) / 2      # sum of rank + 1 over the ranks
    nbytes = n * 4
    bad = 0
    for it in range(args.warmup + args.iters):
        comm.Barrier()
        t0 = time.perf_counter()
        comm.Allreduce(send, recv, op=MPI.SUM)
        dt = time.perf_counter() - t0
        ok = bool(recv[0] == expect and recv[-1] == expect and np.all(recv == expect))
        # the slowest rank sets the collective's time; every rank must agree it was right
        dt_max = comm.reduce(dt, op=MPI.MAX, root=0)
        all_ok = comm.reduce(int(ok), op=MPI.MIN, root=0)
        if rank == 0:
            if not all_ok:
                bad += 1
            if it >= args.warmup:
                # bus bandwidth as nccl-tests define it for allreduce: 2 (n-1)/n bytes per byte
                busbw = nbytes * 2 * (size - 1) / size * 8 / dt_max / 1e9
                print(json.dumps({"iter": it - args.warmup, "t": time.time(), "seconds": dt_max,
                                  "busbw_gbit": busbw, "ok": bool(all_ok)}), flush=True)
    if rank == 0:
        print(json.dumps({"done": True, "ranks": size, "bytes": nbytes, "bad": bad}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
