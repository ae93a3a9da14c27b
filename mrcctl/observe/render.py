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


def status_tables(snap: dict) -> list[Table]:
    """Compact tables that fit 80 columns for the foundation's fields."""
    tables = []
    for peer in snap.get("peers", []):
        paths = peer.get("paths", [])
        tx_total = sum(p.get("tx_packets", 0) for p in paths) or 1
        title = f"peer {peer['name']} ({peer.get('overlay', '?')}, spray {peer.get('spray', '?')})"
        # the box's one-space divider is the only gap between columns, so 11 columns fit 80
        t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  padding=0, expand=False)
        has_ooo = any(p.get("rx_ooo") for p in paths)
        cols = ["path", "plane", "EV", "state", "tx pkts", "tx B", "share", "rx pkts", "rx B", "rtt"]
        if has_ooo:
            cols.append("ooo")
        for col in cols:
            t.add_column(col, justify="left" if col in ("plane", "state") else "right", no_wrap=True)
        for p in paths:
            row = [str(p.get("id", "?")), str(p.get("plane", "?")), str(p.get("ev", "?")),
                   state_text(p.get("state", "UNKNOWN")),
                   si(p.get("tx_packets")), si(p.get("tx_bytes")),
                   percent(p.get("tx_packets", 0) / tx_total),
                   si(p.get("rx_packets")), si(p.get("rx_bytes")), duration_us(path_rtt_us(p))]
            if has_ooo:
                row.append(si(p.get("rx_ooo")))
            t.add_row(*row)
        tables.append(t)
    # what path health did, when it did anything: retirements, recoveries,
    # hedged units, retransmissions steered to the freshest path
    health = {k: v for k, v in snap.get("health", {}).items() if isinstance(v, int) and v}
    if health:
        tables.append(_counter_table("path health (datapath)", "counter", "count", health))
    drops = {k: v for k, v in snap.get("drops", {}).items() if v}
    if drops:
        tables.append(_counter_table("datapath verdicts by reason", "reason", "packets", drops))
    return tables


def print_status(snap: dict, console: Console | None = None) -> None:
    console = console or Console()
    ov = snap.get("overlay", {})
    console.print(f"[bold]{ov.get('device', '?')}[/] {ov.get('address', '?')} mtu {ov.get('mtu')} "
                  f"udp/{ov.get('udp_port')}  planes: {', '.join(_plane(p) for p in snap.get('planes', []))}")
    for t in status_tables(snap):
        console.print(t)


def _plane(p: dict) -> str:
    """A plane and the hook mrc receives on, e.g. "p0h1 (tc)"."""
    return f"{p['device']} ({p['rx_hook']})" if p.get("rx_hook") else p["device"]
