"""Operator tools without root: frame layout at every terminal size, number
formats, the events tail, the Prometheus families, [metrics] validation."""

from __future__ import annotations

import json
import os

import pytest

from mrcctl.instance import config

from mrcctl.observe import render
from mrcctl.observe.source import EventTail
from mrcctl.observe.top import View, build_frame, compute_rates, fold

BASE = """
[overlay]
address = "172.31.0.1/24"
[[plane]]
device = "p0h1"
[[peer]]
name = "h1"
overlay = "172.31.0.2"
[peer.underlay]
p0h1 = "10.200.0.2"
"""


def snap(scale: int, peers=("h1",), planes=4, evs=4, bad_plane=1) -> dict:
    out = []
    for name in peers:
        paths = []
        for i in range(planes * evs):
            paths.append({"id": i, "plane": f"p{i // evs}h1", "ev": 49152 + i,
                          "state": "ASSUMED_BAD" if i // evs == bad_plane else "GOOD", "weight": 1,
                          "tx_packets": 1000 * scale * (i + 1), "tx_bytes": 1_400_000 * scale * (i + 1),
                          "rx_packets": 500 * scale, "rx_bytes": 700_000 * scale, "rx_ooo": 3 * scale,
                          "srtt_us": 120 + i})
        out.append({"name": name, "overlay": "172.31.0.2", "paths": paths,
                    "reorder": {"ooo_ratio": 0.01, "loss_ratio": 0.0}})
    return {"schema": 1, "overlay": {"device": "mrc0", "address": "172.31.0.1/24"}, "peers": out,
            "drops": {"rx_unknown_peer": 2, "rx_probe_reply": 9}}


def frame(width, height, folded=False, peers=("h1",), events=()):
    prev, cur = snap(1, peers), snap(2, peers)
    paths = compute_rates(prev, cur, 1.0)
    view = View(folded=folded)
    view.history.extend([1e6, 2e6, 4e6])
    return [t.plain for t in build_frame(cur, paths, list(events), view, width, height)]


@pytest.mark.parametrize("w,h", [(100, 30), (80, 24), (80, 20), (60, 12), (40, 8), (200, 60), (20, 5)])
def test_frame_fits_every_size(w, h):
    lines = frame(w, h)
    assert len(lines) <= h
    assert all(len(ln) <= w for ln in lines), [ln for ln in lines if len(ln) > w]
    assert lines[0].startswith("mrc top")


def test_frame_80x24_shows_every_path_and_folds_when_short():
    lines = frame(80, 24)
    assert lines[2].split()[0] == "path"
    rows = [ln for ln in lines if ln.strip().split(" ")[0].isdigit()]
    assert len(rows) == 16 and all(("GOOD" in r) or ("ASSUMED_BAD" in r) for r in rows)
    assert "q quit" in lines[-1]
    short = frame(80, 14)
    assert short[2].split()[0] == "plane"
    assert [ln.split()[0] for ln in short[3:7]] == ["p0h1", "p1h1", "p2h1", "p3h1"]
    assert "ASSUMED_BAD" in short[4]


def test_fold_sums_rates_and_summarises_states():
    paths = compute_rates(snap(1), snap(2), 0.5)
    rows = fold(paths)
    assert len(rows) == 4
    p0 = rows[0][0]
    assert p0.tx_Bps == pytest.approx(sum(p.tx_Bps for p in paths if p.plane == "p0h1"))
    assert rows[1][0].state == "ASSUMED_BAD"
    mixed = snap(2)
    mixed["peers"][0]["paths"][0]["state"] = "DENIED"
    assert fold(compute_rates(snap(1), mixed, 1))[0][0].state == "MIXED 3/4"
    # rates over the measured interval: 1000 packets of path 0 in 0.5 s
    assert paths[0].tx_pps == pytest.approx(2000)
    assert abs(sum(p.share for p in paths) - 1) < 1e-9


def test_missing_fields_render_as_dashes():
    bare = {"peers": [{"name": "h1", "paths": [{"id": 0, "plane": "p0", "ev": 1, "state": "GOOD"}]}]}
    paths = compute_rates(bare, bare, 1)
    lines = [t.plain for t in build_frame(bare, paths, [], View(), 80, 24)]
    row = next(ln for ln in lines if ln.strip().startswith("0 "))
    assert "-" in row and "GOOD" in row


def test_multi_peer_gets_a_peer_column():
    lines = frame(100, 60, peers=("h1", "h2"))
    assert lines[2].split()[0] == "peer"


def test_top_with_many_peers_shows_trouble_first():
    names = tuple(f"n{i:03d}" for i in range(100))
    prev, cur = snap(1, names, bad_plane=9), snap(2, names, bad_plane=9)     # all GOOD ...
    cur["peers"][77]["paths"][5]["state"] = "ASSUMED_BAD"                    # ... but one EV
    view = View(folded=True)
    lines = [t.plain for t in build_frame(cur, compute_rates(prev, cur, 1.0), [], view, 100, 24)]
    assert "100 peers" in lines[0] and len(lines[0]) <= 100
    rows = [ln.split() for ln in lines[3:]]
    assert rows[0][:2] == ["n077", "p1h1"] and rows[0][3] == "MIXED"
    assert any("more rows" in ln for ln in lines)


def test_top_slows_down_rather_than_take_a_core():
    """A sample of thousands of peers costs a second or more: the dashboard
    then samples less often (at most MAX_DUTY of one CPU) and says so."""
    from mrcctl.observe import top
    assert top.next_period(0.25, 0.01) == 0.25
    assert top.next_period(0.25, 1.5) == 1.5 / top.MAX_DUTY
    view = View(folded=True, interval=0.25, period=top.next_period(0.25, 1.5))
    names = tuple(f"n{i:03d}" for i in range(10))
    cur = snap(2, names)
    lines = [t.plain for t in build_frame(cur, compute_rates(snap(1, names), cur, 1.0), [], view, 100, 24)]
    assert any("every 6.0 s" in ln for ln in lines), lines
    view.period = 0.25
    lines = [t.plain for t in build_frame(cur, compute_rates(snap(1, names), cur, 1.0), [], view, 100, 24)]
    assert any("4/s" in ln for ln in lines), lines


def test_event_lines(tmp_path):
    f = tmp_path / "events.jsonl"
    tail = EventTail(f)
    tail.poll()                       # no file yet: no events, no error
    assert tail.count == 0
    ev = {"time": 1_700_000_000.25, "peer": "h1", "path": 5, "plane": "p1h1", "ev": 49157,
          "old": "GOOD", "new": "ASSUMED_BAD", "reason": "dead", "source": "datapath"}
    f.write_text(json.dumps(ev) + "\n" + json.dumps({**ev, "old": "ASSUMED_BAD", "new": "GOOD"}) + "\n")
    tail.poll()
    assert tail.count == 2 and tail.recent[-1]["new"] == "GOOD"
    with open(f, "a") as fh:
        fh.write('{"time": 1, "peer"')       # half a line: not counted yet
    tail.poll()
    assert tail.count == 2
    with open(f, "a") as fh:
        fh.write(': "h1", "old": "GOOD", "new": "DENIED"}\n')
    tail.poll()
    assert tail.count == 3 and tail.recent[-1]["new"] == "DENIED"
    # rotation: the count goes on
    os.replace(f, tmp_path / "events.jsonl.1")
    f.write_text(json.dumps(ev) + "\n")
    tail.poll()
    assert tail.count == 4
    lines = frame(100, 30, events=list(tail.recent))
    assert any("p1h1/49157" in ln and "GOOD→ASSUMED_BAD" in ln for ln in lines)


def test_compact_numbers():
    assert render.si(0) == "0" and render.si(999) == "999" and render.si(4_300_000) == "4.3M"
    assert render.si(12_345) == "12.3k" and render.si(123_456_789) == "123M"
    assert render.bitrate(125_000_000) == "1.0G"
    assert render.duration_us(1500) == "1.5ms" and render.duration_us(None) == "-"
    assert render.percent(0.0123) == "1.2%" and render.percent(None) == "-"


def _status_text(s: dict, view: str = "auto") -> str:
    from rich.console import Console
    console = Console(width=80, record=True, force_terminal=False)
    s.update(planes=[{"device": "p0h1", "weight": 1}], overlay={"device": "mrc0", "address": "a", "mtu": 1444,
                                                                "udp_port": 4794})
    render.print_status(s, console, view=view)
    text = console.export_text()
    assert all(len(ln) <= 80 for ln in text.splitlines()) and "…" not in text
    return text


def test_status_views_put_trouble_first():
    s = snap(1, peers=("calm", "hurt"))
    for p in s["peers"][0]["paths"]:
        p["state"] = "GOOD"
    text = _status_text(s)                                 # 32 paths: a row each
    assert text.index("peer hurt") < text.index("peer calm")
    assert render.choose_view(s) == "paths"
    text = _status_text(s, "planes")
    rows = [ln.split() for ln in text.splitlines() if ln.strip().startswith("p1h1")]
    assert rows[0][:3] == ["p1h1", "4", "ASSUMED_BAD"] and rows[1][:3] == ["p1h1", "4", "GOOD"]
    many = snap(1, peers=tuple(f"n{i:04d}" for i in range(200)), evs=8)
    many["peers"][150]["paths"][0]["state"] = "DENIED"
    assert render.choose_view(many) == "peers"
    text = _status_text(many)
    rows = [ln.split() for ln in text.splitlines() if ln.strip().startswith("n0")]
    assert len(rows) == 200
    assert rows[0][0] == "n0150" and rows[0][2] == "23/32" and rows[0][3] == "MIXED"
    assert rows[1][0] == "n0000" and rows[1][2] == "24/32"
    mixed = snap(1, peers=("a",) * 2, evs=32)
    assert render.choose_view(mixed) == "planes"


def test_status_peer_filter_names_unknown_peers():
    from mrcctl.errors import InputError
    from mrcctl.observe.snapshot import snapshot
    cfg = config.parse(BASE)
    with pytest.raises(InputError, match="no peer named nope"):
        snapshot(cfg, peers={"nope"})


def test_status_table_fits_80_columns():
    from rich.console import Console
    console = Console(width=80, record=True, force_terminal=False)
    s = snap(123456)
    s.update(planes=[{"device": "p0h1", "weight": 1}], overlay={"device": "mrc0", "address": "a", "mtu": 1444,
                                                                "udp_port": 4794})
    for p in s["peers"][0]["paths"]:
        p["tx_bytes"] *= 1000
    s["health"] = {"dead": 4, "recovered": 0, "retx_steered": 17, "agent": {"probes_sent": 9}}
    render.print_status(s, console)
    text = console.export_text()
    assert all(len(ln) <= 80 for ln in text.splitlines())
    assert "…" not in text                           # nothing squeezed
    assert "ASSUMED_BAD" in text and "1.7G" in text
    assert "retx_steered" in text and "17" in text and "recovered" not in text   # non-zero only


def test_exporter_families_from_a_snapshot():
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.registry import CollectorRegistry

    from mrcctl.observe.exporter import families
    s = snap(3)
    s["peers"][0]["paths"][0]["rx_ooo_hist"] = {"1": 4, "2-3": 1}

    class C:
        def collect(self):
            return list(families(s, 7, per_path=True))
    reg = CollectorRegistry(auto_describe=False)
    reg.register(C())
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    assert fams["mrc_failover_events"].samples[0].value == 7
    tx = fams["mrc_path_tx_packets"]
    assert tx.type == "counter" and len(tx.samples) == 16
    assert {s.labels["ev"] for s in tx.samples} == {str(49152 + i) for i in range(16)}
    assert set(tx.samples[0].labels) == {"peer", "plane", "ev"}
    state = [x for x in fams["mrc_path_state"].samples if x.labels["ev"] == "49156" and x.value == 1]
    assert [x.labels["state"] for x in state] == ["ASSUMED_BAD"]
    drops = {x.labels["reason"] for x in fams["mrc_drop_packets"].samples}
    assert drops == {"rx_unknown_peer"}      # probe handling is not a drop
    assert fams["mrc_path_rtt_seconds"].samples[0].value == pytest.approx(120e-6)
    assert {x.labels["bucket"] for x in fams["mrc_path_rx_ooo_hist"].samples} == {"1", "2-3"}
    assert fams["mrc_peer_reorder_ooo_ratio"].samples[0].value == 0.01
    down = {f.name: f for f in text_string_to_metric_families(
        generate_latest(_reg(lambda: families(None, 0))).decode())}
    assert down["mrc_up"].samples[0].value == 0


def _reg(fn):
    from prometheus_client.registry import CollectorRegistry

    class C:
        def collect(self):
            return list(fn())
    reg = CollectorRegistry(auto_describe=False)
    reg.register(C())
    return reg


def _scrape(s: dict, per_path: bool = False) -> dict:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from mrcctl.observe.exporter import families
    return {f.name: f for f in text_string_to_metric_families(
        generate_latest(_reg(lambda: families(s, 0, per_path=per_path))).decode())}


def test_exporter_aggregates_by_default_and_series_per_peer_are_fixed():
    fams = _scrape(snap(2, peers=("h1", "h2")))
    assert not [n for n in fams if n.startswith("mrc_path_")]          # per-path is opt-in
    tx = {x.labels["peer"]: x.value for x in fams["mrc_peer_tx_packets"].samples}
    assert tx == {"h1": sum(2000 * (i + 1) for i in range(16)), "h2": tx["h1"]}
    planes = {x.labels["plane"]: x.value for x in fams["mrc_plane_tx_bytes"].samples}
    assert planes["p0h1"] == 2 * sum(2_800_000 * (i + 1) for i in range(4))      # both peers' EVs 0-3
    bad = {(x.labels["peer"], x.labels["state"]): x.value for x in fams["mrc_peer_paths"].samples}
    assert bad[("h1", "ASSUMED_BAD")] == 4 and bad[("h1", "GOOD")] == 12 and bad[("h1", "DENIED")] == 0
    assert {(x.labels["plane"], x.labels["state"]): x.value
            for x in fams["mrc_plane_paths"].samples}[("p1h1", "ASSUMED_BAD")] == 8
    assert fams["mrc_peer_rtt_seconds"].samples[0].value == pytest.approx(127.5e-6)

    def series(s, per_path=False):
        return sum(len(f.samples) for f in _scrape(s, per_path).values())

    def full(s):       # every per-peer field a real snapshot has (observe/snapshot.py)
        for pe in s["peers"]:
            pe["tx_psn"] = 7
            pe["reorder"] = {**dict.fromkeys(("rx_packets", "ooo", "dup", "lost", "late", "unmarked",
                                              "net_lost", "resync", "ooo_ratio", "loss_ratio"), 0),
                             "hist": {str(b): 0 for b in range(16)}}
            for p in pe["paths"]:
                p["evidence_age_ms"] = 1.0
        return s
    # what one more peer costs does not depend on its number of paths
    one, two = series(full(snap(1, peers=("a",)))), series(full(snap(1, peers=("a", "b"))))
    wide = series(full(snap(1, peers=("a", "b"), planes=4, evs=32)))
    assert two - one == PER_PEER_SERIES and wide == two
    assert series(snap(1, peers=("a", "b")), per_path=True) >= series(snap(1, peers=("a", "b"))) + 2 * 16 * 10


# as docs/operator-guide.md states: 10 counters, 3 path-state counts, RTT, evidence age, tx PSN,
# and the reorder table (10 numbers and 16 histogram buckets)
PER_PEER_SERIES = 10 + 3 + 1 + 1 + 1 + 10 + 16


def test_metrics_config():
    assert config.parse(BASE).metrics_per_path is False
    assert config.parse(BASE + '[metrics]\nper_path = true\n').metrics_per_path is True
    with pytest.raises(config.ConfigError, match="true or false"):
        config.parse(BASE + '[metrics]\nper_path = 1\n')
    assert config.parse(BASE).metrics_listen is None
    assert config.parse(BASE + '[metrics]\nlisten = "127.0.0.1:9477"\n').metrics_listen == "127.0.0.1:9477"
    assert config.parse(BASE + '[metrics]\nlisten = "[::1]:9477"\n').metrics_listen == "[::1]:9477"
    for bad, msg in (('listen = "9477"', "HOST:PORT"), ('listen = "1.2.3.4:0"', "HOST:PORT"),
                     ('listen = 9477', "string"), ('port = 1', "unknown key")):
        with pytest.raises(config.ConfigError, match=msg):
            config.parse(BASE + f"[metrics]\n{bad}\n")


def test_suspect_threshold_defaults_to_a_quarter_of_dead_after():
    """Units on a path not yet suspect are lost with it; one-way traffic has
    no TCP to resend them, and at half of dead_after it lost over 10 ms of a
    dead plane's share (docs/benchmarks/failover-trials.md)."""
    assert config.parse(BASE).health.hedge_after == 5.0
    assert config.parse(BASE + "[health]\ndead_after_ms = 40\n").health.hedge_after == 10.0
    assert config.parse(BASE + "[health]\nhedge_after_ms = 7.5\n").health.hedge_after == 7.5


def test_demo_needs_root(monkeypatch, capsys):
    from mrcctl import cli
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit) as e:
        cli.main(["demo", "--duration", "5"])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert "needs root" in err and len(err.strip().splitlines()) == 1


def test_status_shows_a_path_mtu_column_only_when_an_icmp_narrowed_a_path():
    from rich.console import Console

    def text(paths):
        snap = {"peers": [{"name": "h1", "paths": paths}]}
        con = Console(width=120, record=True)
        for t in render.status_tables(snap, "paths"):
            con.print(t)
        return con.export_text()

    plain = [{"id": i, "plane": "p0", "ev": 49152 + i, "state": "GOOD", "mtu": None} for i in range(2)]
    assert " mtu" not in text(plain)
    narrowed = [dict(plain[0], mtu=1200), plain[1]]
    out = text(narrowed)
    assert " mtu" in out and "1200" in out
