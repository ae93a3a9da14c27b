"""Human-readable output of snapshots: compact numbers and the status tables.

`status`, `top` and `demo` share these formatters so a number reads the same
everywhere. Every field beyond the foundation's is optional: a snapshot from
an older or newer datapath renders with "-" where a value is missing.
"""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

STATE_STYLE = {"GOOD": "green", "ASSUMED_BAD": "bold red", "DENIED": "yellow", "UNKNOWN": "magenta",
               "MIXED": "bold yellow"}
_SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(n: float | None, unit: str = "") -> str:
    """4_300_000 -> "4.3M": at most 5 characters before the unit, so columns stay narrow."""
    if n is None:
        return "-"
    a = abs(n)
    for mult, prefix in _SI:
        if a >= mult * 0.9995:
            v = n / mult
            return (f"{v:.1f}" if abs(v) < 99.95 else f"{v:.0f}") + prefix + unit
    if isinstance(n, float) and a and a < 10 and n != int(n):
        return f"{n:.1f}{unit}"
    return f"{n:.0f}{unit}"


def human_bytes(n: float) -> str:
    return si(n, "B")


def bitrate(bytes_per_s: float | None) -> str:
    """Bytes per second as bits per second, network-style: "4.3G"."""
    return "-" if bytes_per_s is None else si(bytes_per_s * 8)


def duration_us(us: float | None) -> str:
    """12 -> "12us", 1500 -> "1.5ms", 2_000_000 -> "2.0s"."""
    if not us:
        return "-"
    if us < 1000:
        return f"{us:.0f}us"
    if us < 1_000_000:
        return f"{us / 1000:.1f}ms" if us < 100_000 else f"{us / 1000:.0f}ms"
    return f"{us / 1e6:.1f}s"


def percent(frac: float | None) -> str:
    if frac is None:
        return "-"
    p = 100 * frac
    if p == 0:
        return "0%"
    return f"{p:.1f}%" if p < 99.95 else "100%"


def state_text(state: str) -> str:
    return f"[{STATE_STYLE.get(state, 'white')}]{state}[/]"


def path_rtt_us(p: dict) -> float | None:
    return p.get("srtt_us") or p.get("rtt_us") or None


def _counter_table(title: str, name_col: str, count_col: str, counts: dict) -> Table:
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column(name_col)
    t.add_column(count_col, justify="right")
    for k, v in sorted(counts.items()):
        t.add_row(k, str(v))
    return t


# above this many paths in all, `status` shows a row per plane of each peer;
# above PEERS_VIEW_PEERS peers, a row per peer
PATHS_VIEW_MAX_PATHS = 64
PEERS_VIEW_PEERS = 16


def trouble(peer: dict) -> int:
    """How many of the peer's paths are out of service (not GOOD)."""
    return sum(p.get("state") != "GOOD" for p in peer.get("paths", []))


def by_trouble(peers: list[dict]) -> list[dict]:
    """Peers with the most paths out of service first; config order otherwise."""
    return sorted(peers, key=lambda pe: -trouble(pe))


def choose_view(snap: dict, view: str = "auto") -> str:
    if view != "auto":
        return view
    peers = snap.get("peers", [])
    if sum(len(p.get("paths", [])) for p in peers) <= PATHS_VIEW_MAX_PATHS:
        return "paths"
    return "planes" if len(peers) <= PEERS_VIEW_PEERS else "peers"


def _table(title: str, cols: list[str], left=("plane", "state", "peer", "overlay")) -> Table:
    # the box's one-space divider is the only gap between columns, so 11 columns fit 80
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=0, expand=False)
    for col in cols:
        t.add_column(col, justify="left" if col in left else "right", no_wrap=True)
    return t


def group_state(paths: list[dict]) -> str:
    """The state all of them share, or MIXED good/total."""
    states = {p.get("state", "UNKNOWN") for p in paths}
    if len(states) == 1:
        return states.pop()
    return f"MIXED {sum(p.get('state') == 'GOOD' for p in paths)}/{len(paths)}"


def group_state_text(st: str) -> str:
    return state_text("MIXED") + st[len("MIXED"):] if st.startswith("MIXED") else state_text(st)


def _median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if x)
    return xs[len(xs) // 2] if xs else None


def _sum(paths: list[dict], key: str) -> int:
    return sum(p.get(key) or 0 for p in paths)


def _path_table(peer: dict) -> Table:
    paths = peer.get("paths", [])
    tx_total = _sum(paths, "tx_packets") or 1
    title = f"peer {peer['name']} ({peer.get('overlay', '?')}, spray {peer.get('spray', '?')})"
    has_ooo = any(p.get("rx_ooo") for p in paths)
    has_mtu = any(p.get("mtu") for p in paths)     # an ICMP narrowed a path (bpf/pmtu.h)
    cols = ["path", "plane", "EV", "state", "tx pkts", "tx B", "share", "rx pkts", "rx B", "rtt"]
    t = _table(title, cols + (["ooo"] if has_ooo else []) + (["mtu"] if has_mtu else []))
    for p in paths:
        row = [str(p.get("id", "?")), str(p.get("plane", "?")), str(p.get("ev", "?")),
               state_text(p.get("state", "UNKNOWN")),
               si(p.get("tx_packets")), si(p.get("tx_bytes")),
               percent(p.get("tx_packets", 0) / tx_total),
               si(p.get("rx_packets")), si(p.get("rx_bytes")), duration_us(path_rtt_us(p))]
        if has_ooo:
            row.append(si(p.get("rx_ooo")))
        if has_mtu:
            row.append(str(p.get("mtu") or "-"))
        t.add_row(*row)
    return t


def _plane_table(peer: dict) -> Table:
    paths = peer.get("paths", [])
    tx_total = _sum(paths, "tx_packets") or 1
    planes: dict[str, list[dict]] = {}
    for p in paths:
        planes.setdefault(str(p.get("plane", "?")), []).append(p)
    title = f"peer {peer['name']} ({peer.get('overlay', '?')}, spray {peer.get('spray', '?')}, per plane)"
    t = _table(title, ["plane", "EVs", "state", "tx pkts", "tx B", "share", "rx pkts", "rx B", "rtt"])
    for plane, ps in planes.items():
        st = group_state(ps)
        t.add_row(plane, str(len(ps)), group_state_text(st),
                  si(_sum(ps, "tx_packets")), si(_sum(ps, "tx_bytes")), percent(_sum(ps, "tx_packets") / tx_total),
                  si(_sum(ps, "rx_packets")), si(_sum(ps, "rx_bytes")),
                  duration_us(_median([path_rtt_us(p) for p in ps])))
    return t


def _peer_table(peers: list[dict]) -> Table:
    t = _table(f"{len(peers)} peers, in trouble first (status --peer NAME for paths)",
               ["peer", "overlay", "GOOD", "state", "tx B", "rx B", "rtt", "loss"])
    for peer in peers:
        ps = peer.get("paths", [])
        st = group_state(ps).split()[0] if ps else "-"     # the counts are in the GOOD column
        r = peer.get("reorder") or {}
        t.add_row(str(peer.get("name")), str(peer.get("overlay", "?")),
                  f"{sum(p.get('state') == 'GOOD' for p in ps)}/{len(ps)}",
                  group_state_text(st),
                  si(_sum(ps, "tx_bytes")), si(_sum(ps, "rx_bytes")),
                  duration_us(_median([path_rtt_us(p) for p in ps])), percent(r.get("loss_ratio")))
    return t


def status_tables(snap: dict, view: str = "auto") -> list[Table]:
    """Compact tables that fit 80 columns: a row per path, per plane of each
    peer or per peer (choose_view), peers in trouble first."""
    tables = []
    peers = by_trouble(snap.get("peers", []))
    view = choose_view(snap, view)
    if view == "peers":
        tables.append(_peer_table(peers))
    else:
        tables += [(_path_table if view == "paths" else _plane_table)(peer) for peer in peers]
    # what path health did, when it did anything: retirements, recoveries,
    # hedged units, retransmissions steered to the freshest path
    health = {k: v for k, v in snap.get("health", {}).items() if isinstance(v, int) and v}
    if health:
        tables.append(_counter_table("path health (datapath)", "counter", "count", health))
    drops = {k: v for k, v in snap.get("drops", {}).items() if v}
    if drops:
        tables.append(_counter_table("datapath verdicts by reason", "reason", "packets", drops))
    return tables


def _auth_text(peers: list[str]) -> str:
    """The authenticated peers, named while few (a cluster key covers all)."""
    if not peers:
        return "off"
    return ", ".join(peers) if len(peers) <= 3 else f"{len(peers)} peers"


def print_status(snap: dict, console: Console | None = None, view: str = "auto") -> None:
    console = console or Console()
    ov = snap.get("overlay", {})
    addrs = " ".join(ov.get("addresses") or [ov.get("address", "?")])
    if ov.get("prefixes"):
        addrs += f" (+{', '.join(ov['prefixes'])})"
    console.print(f"[bold]{ov.get('device', '?')}[/] {addrs} mtu {ov.get('mtu')} "
                  f"udp/{ov.get('udp_port')}  planes: {', '.join(_plane(p) for p in snap.get('planes', []))}"
                  f"  auth: {_auth_text(snap.get('auth', {}).get('peers', []))}")
    # what reaches the stack from each plane besides MRC (bpf/acl.h)
    planes = snap.get("planes", [])
    if all(p.get("allow_underlay") is None for p in planes):
        console.print("  allow_underlay: everything on every plane (no lists)")
    else:
        for p in planes:
            allow = p.get("allow_underlay")
            console.print(f"  {p['device']} allow_underlay: "
                          + ("everything (no list)" if allow is None else "; ".join(allow)))
    for t in status_tables(snap, view):
        console.print(t)


def _plane(p: dict) -> str:
    """A plane and the hook mrc receives on, e.g. "p0h1 (tc)"."""
    return f"{p['device']} ({p['rx_hook']})" if p.get("rx_hook") else p["device"]
