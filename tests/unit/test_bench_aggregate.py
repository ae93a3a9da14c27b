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
    progs = ("bare tc redirect", "floor tc clock + encap", "mrc_tx", "bare xdp pass", "floor xdp decap",
             "mrc_rx", "mrc_rx 16K units", "bare tc ok", "floor tc decap", "mrc_rx_tc")
    for k in progs:
        assert res[k] > 0, k
    assert res["tx_ratio"] > 1 and res["rx_ratio"] > 1 and res["rx_units_ratio"] > 1
    assert res["rx_tc_ratio"] > 1
    assert res["drops_during_bench"] == {}, "every packet must take the forwarding path"
    assert [s["per_packet_ns"] for s in seen] == [*progs[:6], "bare xdp pass", *progs[6:]]


def test_generated_section_goes_into_a_fresh_out_dir(tmp_path):
    """scripts.write_section: a benchmark's --out DIR need not exist (bench_evs
    lost a run's results to a FileNotFoundError), and a second write
    replaces its section, keeping the text around it."""
    sys.path.insert(0, str(REPO))
    from scripts import write_section
    f = tmp_path / "new" / "dir" / "x.md"
    write_section(f, "Title", "<!-- b -->", "<!-- e -->", ["one"])
    assert f.read_text() == "# Title\n\n<!-- b -->\none\n<!-- e -->\n"
    f.write_text(f.read_text() + "hand-written\n")
    write_section(f, "Title", "<!-- b -->", "<!-- e -->", ["two"])
    assert f.read_text() == "# Title\n\n<!-- b -->\ntwo\n<!-- e -->\nhand-written\n"


def test_a_results_doc_names_the_flags_that_differ_from_their_defaults():
    """scripts.command: what bench_evs and bench_cross write as their command."""
    import argparse
    sys.path.insert(0, str(REPO))
    from scripts import command
    ap = argparse.ArgumentParser()
    ap.add_argument("--evs", default="4,8,16")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--ecn-rate", default=None)
    assert command("bench_evs.py", ap, ap.parse_args([]), ("evs", "trials", "ecn_rate")) == \
        "sudo python3 scripts/bench_evs.py"
    a = ap.parse_args(["--evs", "4,8", "--ecn-rate", "450mbit"])
    assert command("bench_evs.py", ap, a, ("evs", "trials", "ecn_rate")) == \
        "sudo python3 scripts/bench_evs.py --evs 4,8 --ecn-rate 450mbit"
