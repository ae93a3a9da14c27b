"""The cheap part of scripts/bench_aggregate.py: per-packet cost through
BPF_PROG_TEST_RUN runs, processes every packet fresh, and drops none. (The
traffic part needs minutes and runs as a benchmark, not in CI.)"""

from __future__ import annotations

import sys

from unit_dp import REPO, need_root


def test_per_packet_cost_smoke(bpf_objects):
    need_root()
    sys.path.insert(0, str(REPO / "scripts"))
    import bench_aggregate as bench
    seen = []
    res = bench.per_packet_cost(2000, seen.append)
    assert res["packets"] == 2000
    for k in ("mrc_tx", "mrc_rx", "bare tc redirect", "bare xdp pass"):
        assert res[k] > 0, k
    assert res["tx_ratio"] > 1 and res["rx_ratio"] > 1
    assert res["drops_during_bench"] == {}, "every packet must take the forwarding path"
    assert len(seen) == 4
