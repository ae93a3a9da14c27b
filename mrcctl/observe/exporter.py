"""Prometheus metrics of one instance, read from the snapshot at scrape time.

Served by the agent when the config has `[metrics] listen = "HOST:PORT"`, or
in the foreground by `mrcctl exporter -c FILE [--listen HOST:PORT]`. The
collector renders observe.snapshot.snapshot(), the same dict `status --json` prints, so
a scrape and a `status` taken at the same moment agree; there is no cache
between the datapath's counters and the scrape.

Metric names and labels are documented in docs/operator-guide.md.
"""

from __future__ import annotations

import logging
import re
import signal
import statistics
import threading

from ..datapath.abi import PathState, reason_is_drop
from ..errors import InputError, MrcError
from ..instance import config as cfgmod
from .source import Source

log = logging.getLogger("mrc.exporter")

DEFAULT_LISTEN = "127.0.0.1:9477"
STATES = tuple(s.name for s in PathState)
PATH_LABELS = ["peer", "plane", "ev"]
PATH_PREFIX, PEER_PREFIX, PLANE_PREFIX = "mrc_path_", "mrc_peer_", "mrc_plane_"
# snapshot path key -> (metric name, help); counters get "_total" from prometheus-client
PATH_COUNTERS = {
    "tx_packets": ("mrc_path_tx_packets", "Packets (wire segments) sprayed on the path."),
    "tx_bytes": ("mrc_path_tx_bytes", "Bytes sprayed on the path, encapsulation included."),
    "rx_packets": ("mrc_path_rx_packets", "MRC packets received on the path."),
    "rx_bytes": ("mrc_path_rx_bytes", "Bytes received on the path."),
    "rx_ooo": ("mrc_path_rx_out_of_order_packets", "Packets that arrived with a PSN below the highest seen."),
    "rx_dup": ("mrc_path_rx_duplicate_packets", "Duplicate packets (by PSN) received on the path."),
    "rx_ce": ("mrc_path_rx_ce_packets", "Packets received on the path with CE marked by the fabric (RFC 6040)."),
    "rx_lost_units": ("mrc_path_rx_lost_units", "Units of the peer's path that never arrived (gaps in its unit count)."),
    "rx_lost_segs": ("mrc_path_rx_lost_segments", "Wire packets missing from units of the peer's path that arrived in part."),
    "probes_rx": ("mrc_path_probes_received", "EV probe replies received on the path."),
}
# keys rendered some other way, never as generic gauges
_HANDLED = set(PATH_COUNTERS) | {"id", "plane", "ev", "remote", "state", "weight", "rtt_us", "srtt_us",
                                 "evidence_age_ms"}
_NAME_RE = re.compile(r"[^a-zA-Z0-9_]")


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class SnapshotCollector:
    """A prometheus-client custom collector over one instance's snapshot."""

    def __init__(self, cfg: cfgmod.Config, source=None, per_path: bool | None = None):
        self.cfg = cfg
        self.per_path = cfg.metrics_per_path if per_path is None else per_path
        self.source = source or Source(cfg)
        # the HTTP server is threaded; map handles and the event tail are not
        self._lock = threading.Lock()

    def set_config(self, cfg: cfgmod.Config) -> None:
        """Scrapes from now on describe `cfg`'s peers (the agent's peers
        changed while it runs)."""
        with self._lock:
            self.cfg = self.source.cfg = cfg

    def describe(self):
        return []      # no registration-time scrape (the instance may not be up yet)

    def collect(self):
        with self._lock:
            try:
                snap = self.source.snapshot()
                err = None
            except MrcError as e:
                snap, err = None, str(e)
            except Exception as e:  # a scrape must answer (mrc_up 0) rather than fail
                log.warning("snapshot failed: %s: %s", type(e).__name__, e)
                self.source.close()
                snap, err = None, str(e)
            self.source.events.poll()
            events = self.source.events.count
        return list(families(snap, events, err, per_path=self.per_path))


def families(snap: dict | None, events: int, error: str | None = None, per_path: bool = False):
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    up = GaugeMetricFamily("mrc_up", "1 if the instance's datapath could be read at scrape time.")
    up.add_metric([], 0 if snap is None else 1)
    yield up
    ev = CounterMetricFamily("mrc_failover_events", "EV state changes recorded in the instance's events log.")
    ev.add_metric([], events)
    yield ev
    if snap is None:
        return
    ov = snap.get("overlay", {})
    info = GaugeMetricFamily("mrc_info", "Instance description (value is always 1).",
                             labels=["device", "address", "schema"])
    info.add_metric([str(ov.get("device")), str(ov.get("address")), str(snap.get("schema"))], 1)
    yield info

    if per_path:
        yield from _path_families(snap)
    yield from _aggregate_families(snap)

    drops = CounterMetricFamily("mrc_drop_packets", "Packets the datapath dropped, by reason.", labels=["reason"])
    verdicts = CounterMetricFamily("mrc_datapath_verdict_packets",
                                   "Every datapath verdict counter (drops and probe handling), by reason.",
                                   labels=["reason"])
    for reason, n in sorted(snap.get("drops", {}).items()):
        if not _is_num(n):
            continue
        verdicts.add_metric([reason], n)
        if reason_is_drop(reason):
            drops.add_metric([reason], n)
    yield drops
    yield verdicts
    psn = CounterMetricFamily("mrc_peer_tx_psn", "Packet sequence numbers used toward the peer.", labels=["peer"])
    for peer in snap.get("peers", []):
        if _is_num(peer.get("tx_psn")):
            psn.add_metric([str(peer.get("name"))], peer["tx_psn"])
    yield psn
    peer_extra: dict[str, GaugeMetricFamily] = {}
    for peer in snap.get("peers", []):
        for key, v in peer.items():
            if isinstance(v, dict):   # e.g. "reorder": the receiver's per-peer accounting
                _generic(peer_extra, f"mrc_peer_{_NAME_RE.sub('_', key)}_", f"peers[].{key}", ["peer"],
                         [str(peer.get("name"))], v)
    yield from peer_extra.values()


def _path_families(snap: dict):
    """One series per path (opt-in: 4,096 peers x 32 paths would be millions)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    counters = {k: CounterMetricFamily(name, doc, labels=PATH_LABELS) for k, (name, doc) in PATH_COUNTERS.items()}
    state = GaugeMetricFamily("mrc_path_state", "1 for the path's current state, 0 for the others.",
                              labels=PATH_LABELS + ["state"])
    weight = GaugeMetricFamily("mrc_path_weight", "Spraying weight of the path.", labels=PATH_LABELS)
    rtt = GaugeMetricFamily("mrc_path_rtt_seconds", "Smoothed round-trip time of the path.", labels=PATH_LABELS)
    age = GaugeMetricFamily("mrc_path_evidence_age_seconds",
                            "Time since the last evidence that the path delivers.", labels=PATH_LABELS)
    extra: dict[str, GaugeMetricFamily] = {}
    for peer in snap.get("peers", []):
        for p in peer.get("paths", []):
            labels = [str(peer.get("name")), str(p.get("plane")), str(p.get("ev"))]
            for key, fam in counters.items():
                if _is_num(p.get(key)):
                    fam.add_metric(labels, p[key])
            cur = str(p.get("state", "UNKNOWN"))
            for s in STATES + (() if cur in STATES else (cur,)):
                state.add_metric(labels + [s], 1 if s == cur else 0)
            if _is_num(p.get("weight")):
                weight.add_metric(labels, p["weight"])
            r = p.get("srtt_us") or p.get("rtt_us")
            if _is_num(r) and r:
                rtt.add_metric(labels, r / 1e6)
            if _is_num(p.get("evidence_age_ms")):
                age.add_metric(labels, p["evidence_age_ms"] / 1e3)
            # fields added to the snapshot later still reach Prometheus, as gauges
            _generic(extra, "mrc_path_", "paths[]", PATH_LABELS, labels,
                     {k: v for k, v in p.items() if k not in _HANDLED})
    yield from counters.values()
    yield from (state, weight, rtt, age)
    yield from extra.values()


def _aggregate_families(snap: dict):
    """Per-peer and per-plane sums of the path counters, and path counts by
    state: a fixed number of series per peer and per plane."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    by_peer = {k: CounterMetricFamily(PEER_PREFIX + name[len(PATH_PREFIX):], doc.replace("the path", "the peer's paths"),
                                      labels=["peer"]) for k, (name, doc) in PATH_COUNTERS.items()}
    by_plane = {k: CounterMetricFamily(PLANE_PREFIX + name[len(PATH_PREFIX):],
                                       doc.replace("the path", "the plane's paths (all peers)"), labels=["plane"])
                for k, (name, doc) in PATH_COUNTERS.items()}
    peer_paths = GaugeMetricFamily("mrc_peer_paths", "The peer's paths in each state.", labels=["peer", "state"])
    plane_paths = GaugeMetricFamily("mrc_plane_paths", "The plane's paths (all peers) in each state.",
                                    labels=["plane", "state"])
    peer_rtt = GaugeMetricFamily("mrc_peer_rtt_seconds", "Median smoothed RTT over the peer's paths with a sample.",
                                 labels=["peer"])
    peer_age = GaugeMetricFamily("mrc_peer_evidence_age_seconds",
                                 "Oldest evidence among the peer's GOOD paths (how long a silent path has gone "
                                 "unnoticed).", labels=["peer"])
    plane_sums: dict[str, dict[str, float]] = {}
    plane_states: dict[str, dict[str, int]] = {}
    for peer in snap.get("peers", []):
        name = str(peer.get("name"))
        sums = dict.fromkeys(PATH_COUNTERS, 0)
        states = dict.fromkeys(STATES, 0)
        rtts, ages = [], []
        for p in peer.get("paths", []):
            plane = str(p.get("plane"))
            psums = plane_sums.setdefault(plane, dict.fromkeys(PATH_COUNTERS, 0))
            for key in PATH_COUNTERS:
                if _is_num(p.get(key)):
                    sums[key] += p[key]
                    psums[key] += p[key]
            cur = str(p.get("state", "UNKNOWN"))
            states[cur] = states.get(cur, 0) + 1
            pst = plane_states.setdefault(plane, dict.fromkeys(STATES, 0))
            pst[cur] = pst.get(cur, 0) + 1
            r = p.get("srtt_us") or p.get("rtt_us")
            if _is_num(r) and r:
                rtts.append(r)
            if cur == "GOOD" and _is_num(p.get("evidence_age_ms")):
                ages.append(p["evidence_age_ms"])
        for key, fam in by_peer.items():
            fam.add_metric([name], sums[key])
        for st, n in states.items():
            peer_paths.add_metric([name, st], n)
        if rtts:
            peer_rtt.add_metric([name], statistics.median(rtts) / 1e6)
        if ages:
            peer_age.add_metric([name], max(ages) / 1e3)
    for plane, psums in plane_sums.items():
        for key, fam in by_plane.items():
            fam.add_metric([plane], psums[key])
        for st, n in plane_states[plane].items():
            plane_paths.add_metric([plane, st], n)
    yield from by_peer.values()
    yield from by_plane.values()
    yield from (peer_paths, plane_paths, peer_rtt, peer_age)


def _generic(fams: dict, prefix: str, where: str, label_names: list[str], labels: list[str], fields: dict):
    """Numbers as gauges named after their key; a dict of numbers (a
    histogram such as {"1": 5, "2-3": 1}) as one gauge with a "bucket" label."""
    from prometheus_client.core import GaugeMetricFamily
    for key, v in fields.items():
        name = prefix + _NAME_RE.sub("_", key)
        if _is_num(v):
            fam = fams.get(name)
            if fam is None:
                fam = fams[name] = GaugeMetricFamily(name, f"Snapshot field {where}.{key}.", labels=label_names)
            fam.add_metric(labels, v)
        elif isinstance(v, dict) and v and all(_is_num(x) for x in v.values()):
            fam = fams.get(name)
            if fam is None:
                fam = fams[name] = GaugeMetricFamily(name, f"Snapshot field {where}.{key}, by bucket.",
                                                     labels=label_names + ["bucket"])
            for b, x in v.items():
                fam.add_metric(labels + [str(b)], x)


def parse_listen(addr: str) -> tuple[str, int]:
    try:
        return cfgmod.parse_listen("--listen", addr)
    except cfgmod.ConfigError as e:
        raise InputError(str(e)) from None


def serve(cfg: cfgmod.Config, listen: str, per_path: bool | None = None,
          collector: SnapshotCollector | None = None):
    """Start the HTTP server in a daemon thread; returns (server, thread)."""
    from prometheus_client import CollectorRegistry, start_http_server
    host, port = parse_listen(listen)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector or SnapshotCollector(cfg, per_path=per_path))
    try:
        return start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise MrcError(f"cannot listen on {listen}: {e.strerror or e}") from None


def run(cfg: cfgmod.Config, listen: str | None, per_path: bool | None = None) -> None:
    """Foreground exporter until SIGTERM/SIGINT."""
    listen = listen or cfg.metrics_listen or DEFAULT_LISTEN
    server, thread = serve(cfg, listen, per_path)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"serving http://{listen}/metrics", flush=True)
    while not stop.wait(1.0):
        pass
    server.shutdown()
    server.server_close()
