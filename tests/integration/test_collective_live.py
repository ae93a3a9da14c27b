"""A real collective through mrc: OpenMPI's MPI_Allreduce across a routed fabric.

Four hosts on two leaves of 2 planes x 2 spines. OpenMPI's TCP transport is
told to use mrc0 only (mrcctl/lab/mpi.py launches it into the namespaces);
every iteration's sum is checked by every rank. Then one leaf-spine link
of plane 0 drops everything both ways with its carrier up (a gray failure):
the job must still finish with correct results, where a job pinned to that
plane would wait on TCP retransmissions through the dead link.
"""

from __future__ import annotations

import pytest

from lab import Lab
from mrcctl.lab import mpi

HEALTH = """[health]
dead_after_ms = 10
probe_interval_ms = 20
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    why = mpi.missing()
    assert why is None, why    # scripts/setup.sh installs OpenMPI; its absence is a failure
    with Lab(tmp_path_factory.mktemp("coll"), 4, 2, prefix="mcol", evs=4, extra=HEALTH,
             fabric=dict(spines=2, leaves=2, link_rate="1gbit")) as lab:
        # every path GOOD before the job: hosts come up one after another and
        # the first ones' paths recover by probes only once their peers are up
        # (a CI run had the job hang before its first iteration, 1 in ~10)
        lab.up(settle=True)
        yield lab


def job(lab: Lab, tmp, iters: int) -> dict:
    """One job; a job that never began its first iteration is started once
    more. OpenMPI 4.1.4's launch fails now and then on this testbed before
    any rank talks (a daemon that dies after daemonizing never calls back:
    a traced SIGSEGV in hwloc_shmem_topology_write, 4 in 142 fresh labs;
    mrcctl/lab/mpi.py avoids the known path, and CI still saw one such hang
    in ~12 suite runs). A hang mrc caused would hang the second job too,
    and one after the first iteration is never retried."""
    hosts = list(lab.tb.hosts())
    out = {}
    for attempt in (1, 2):
        out = mpi.allreduce(lab.tb, hosts, [lab.overlay(i) for i in hosts], tmp / f"try{attempt}", "mrc0",
                            "mrc0", mib=1, iters=iters, warmup=1, timeout=60)
        if not (out["hung"] and not out["iters"]):
            break
        print(f"job {attempt} never started (launch hang): {_why(out)}")
    return out


def _why(out: dict) -> str:
    return (f"hung={out['hung']} returncode={out.get('returncode')} iterations={len(out['iters'])}; "
            f"stderr: {out['stderr_tail']}")


def test_allreduce_over_mrc_is_correct(lab, tmp_path):
    out = job(lab, tmp_path, 4)
    assert out["done"] and not out["hung"], _why(out)
    assert out["ranks"] == 4 and out["bad"] == 0
    assert len(out["iters"]) == 4 and all(r["ok"] for r in out["iters"])
    # the ranks' data went over mrc: every host sent data units to its peers
    for i in lab.tb.hosts():
        assert sum(p["tx_packets"] for p in lab.paths(i)) > 0


def test_allreduce_survives_a_gray_spine_link_failure(lab, tmp_path):
    lab.tb.link_blackhole(0, 0, 0, on=True, direction="both")
    try:
        out = job(lab, tmp_path, 6)
    finally:
        lab.tb.link_blackhole(0, 0, 0, on=False, direction="both")
    assert out["done"] and not out["hung"], _why(out)
    assert out["bad"] == 0 and len(out["iters"]) == 6 and all(r["ok"] for r in out["iters"])
