"""Human-readable output of snapshots (rich tables)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

STATE_STYLE = {"GOOD": "green", "ASSUMED_BAD": "bold red", "DENIED": "yellow", "UNKNOWN": "magenta"}


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def state_text(state: str) -> str:
    return f"[{STATE_STYLE.get(state, 'white')}]{state}[/]"


def status_tables(snap: dict) -> list[Table]:
    tables = []
    for peer in snap["peers"]:
        tx_total = sum(p["tx_packets"] for p in peer["paths"]) or 1
        t = Table(title=f"peer {peer['name']} ({peer['overlay']}, spray {peer['spray']})",
                  title_justify="left", expand=False)
        for col in ("path", "plane", "EV", "state", "tx pkts", "tx bytes", "share",
                    "rx pkts", "rx bytes", "rtt"):
            t.add_column(col, justify="right" if col not in ("plane", "state") else "left")
        for p in peer["paths"]:
            rtt = f"{p['srtt_us']} us" if p.get("srtt_us") else "-"
            t.add_row(str(p["id"]), p["plane"], str(p["ev"]), state_text(p["state"]),
                      str(p["tx_packets"]), human_bytes(p["tx_bytes"]),
                      f"{100 * p['tx_packets'] / tx_total:.1f}%",
                      str(p["rx_packets"]), human_bytes(p["rx_bytes"]), rtt)
        tables.append(t)
    drops = {k: v for k, v in snap["drops"].items() if v}
    if drops:
        t = Table(title="datapath verdicts by reason", title_justify="left")
        t.add_column("reason")
        t.add_column("packets", justify="right")
        for k, v in sorted(drops.items()):
            t.add_row(k, str(v))
        tables.append(t)
    return tables


def print_status(snap: dict, console: Console | None = None) -> None:
    console = console or Console()
    ov = snap["overlay"]
    console.print(f"[bold]{ov['device']}[/] {ov['address']} mtu {ov['mtu']} udp/{ov['udp_port']}  "
                  f"planes: {', '.join(p['device'] for p in snap['planes'])}")
    for t in status_tables(snap):
        console.print(t)
