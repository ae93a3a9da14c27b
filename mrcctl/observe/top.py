"""`mrcctl top`: a live terminal dashboard of one instance.

It renders the same snapshot as `status --json` (observe.snapshot), sampled a
few times a second; rates are counter deltas over the measured interval
between two samples (the counters themselves are the datapath's per-CPU
sums). Frames are built as plain lines of rich Text, cropped to the
terminal, instead of rich Tables: it is both cheaper (the budget is < 5 % of
a core at 4 Hz) and the only way to guarantee that a small terminal gets
fewer rows and columns rather than wrapped, garbled ones.

Fields that other parts of mrc may or may not provide (RTT, loss, reorder,
the events log) are optional: a missing one renders as "-".
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field

from rich.console import Console, Group
from rich.text import Text

from ..datapath.abi import reason_is_drop
from ..errors import MrcError
from ..instance import config as cfgmod
from .render import STATE_STYLE, bitrate, duration_us, path_rtt_us, percent
from .source import Source

SPARK = "▁▂▃▄▅▆▇█"
# A path counter the loss column can use, whichever the datapath provides:
# a ratio field, or a lost-packet counter to divide by what arrived.
LOSS_RATIO_FIELDS = ("loss", "loss_ratio")
LOSS_COUNTER_FIELDS = ("rx_lost", "lost_packets", "rx_loss", "lost", "rx_gaps")
REORDER_COUNTER_FIELDS = ("rx_ooo", "rx_reordered", "reorder")
RATE_WINDOW_S = 1.0


# ------------------------------------------------------------------ rates

def _first(d: dict, names) -> tuple[str | None, float | None]:
    for n in names:
        v = d.get(n)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return n, v
    return None, None


@dataclass
class PathView:
    peer: str
    id: int
    plane: str
    ev: int | str
    state: str
    weight: int | None
    tx_Bps: float | None = None
    rx_Bps: float | None = None
    tx_pps: float | None = None
    rx_pps: float | None = None
    rtt_us: float | None = None
    loss: float | None = None
    lost: float = 0.0           # packets lost in the window (for folding)
    reorder: float | None = None
    ooo: float = 0.0            # out-of-order arrivals in the window (for folding)
    rx_win: float = 0.0         # packets received in the window (for folding)
    share: float | None = None


def compute_rates(prev: dict | None, cur: dict, dt: float) -> list[PathView]:
    """Per-path rates between two snapshots taken dt seconds apart."""
    old = {}
    if prev is not None:
        for peer in prev.get("peers", []):
            for p in peer.get("paths", []):
                old[(peer.get("name"), p.get("id"))] = p
    out = []
    for peer in cur.get("peers", []):
        views = []
        for p in peer.get("paths", []):
            v = PathView(peer=peer.get("name", "?"), id=p.get("id", -1), plane=str(p.get("plane", "?")),
                         ev=p.get("ev", "?"), state=str(p.get("state", "UNKNOWN")), weight=p.get("weight"),
                         rtt_us=path_rtt_us(p))
            o = old.get((v.peer, v.id))
            if o is not None and dt > 0:
                def d(key):
                    a, b = p.get(key), o.get(key)
                    return max(0, a - b) if isinstance(a, (int, float)) and isinstance(b, (int, float)) else None
                dtx, drx = d("tx_bytes"), d("rx_bytes")
                dtp, drp = d("tx_packets"), d("rx_packets")
                v.tx_Bps = None if dtx is None else dtx / dt
                v.rx_Bps = None if drx is None else drx / dt
                v.tx_pps = None if dtp is None else dtp / dt
                v.rx_pps = None if drp is None else drp / dt
                v.rx_win = drp or 0
                name, _ = _first(p, REORDER_COUNTER_FIELDS)
                if name is not None and drp is not None:
                    v.ooo = d(name) or 0
                    v.reorder = v.ooo / drp if drp else None
                name, _ = _first(p, LOSS_COUNTER_FIELDS)
                if name is not None:
                    v.lost = d(name) or 0
                    seen = (drp or 0) + v.lost
                    v.loss = v.lost / seen if seen else None
            if v.loss is None:
                _, ratio = _first(p, LOSS_RATIO_FIELDS)
                if ratio is not None:
                    v.loss = min(1.0, max(0.0, ratio))
            views.append(v)
        total = sum(v.tx_Bps or 0 for v in views)
        for v in views:
            v.share = (v.tx_Bps or 0) / total if total else None
        out.extend(views)
    return out


def fold(paths: list[PathView]) -> list[tuple[PathView, int]]:
    """One row per (peer, plane): sums of rates, the state if all EVs agree."""
    groups: dict[tuple[str, str], list[PathView]] = {}
    for v in paths:
        groups.setdefault((v.peer, v.plane), []).append(v)
    rows = []
    for (peer, plane), vs in groups.items():
        def tot(attr):
            vals = [getattr(v, attr) for v in vs if getattr(v, attr) is not None]
            return sum(vals) if vals else None
        states = {v.state for v in vs}
        if len(states) == 1:
            state = vs[0].state
        else:
            good = sum(v.state == "GOOD" for v in vs)
            state = f"MIXED {good}/{len(vs)}"
        rtts = [v.rtt_us for v in vs if v.rtt_us]
        f = PathView(peer=peer, id=vs[0].id, plane=plane, ev=f"{len(vs)}", state=state,
                     weight=vs[0].weight, tx_Bps=tot("tx_Bps"), rx_Bps=tot("rx_Bps"),
                     tx_pps=tot("tx_pps"), rx_pps=tot("rx_pps"),
                     rtt_us=sum(rtts) / len(rtts) if rtts else None, share=tot("share"))
        rx, lost, ooo = (sum(v.rx_win for v in vs), sum(v.lost for v in vs), sum(v.ooo for v in vs))
        if any(v.loss is not None for v in vs):
            f.loss = lost / (rx + lost) if lost else max(v.loss or 0 for v in vs)
        if any(v.reorder is not None for v in vs) and rx:
            f.reorder = ooo / rx
        rows.append((f, len(vs)))
    return rows


# ------------------------------------------------------------------ the frame

@dataclass
class Col:
    name: str
    width: int
    prio: int          # columns with the lowest prio are dropped first when narrow
    left: bool = False


@dataclass
class View:
    """What the dashboard shows; survives between frames."""
    folded: bool = False
    interval: float = 0.25      # asked for
    period: float = 0.25        # in force: longer while a sample costs more than MAX_DUTY of it
    history: deque = field(default_factory=lambda: deque(maxlen=240))
    message: str = ""


def _state_style(state: str) -> str:
    return STATE_STYLE.get(state.split(" ")[0], "white")


def _spark(values: list[float], width: int) -> str:
    vals = list(values)[-width:]
    if not vals:
        return ""
    top = max(vals) or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int(v / top * (len(SPARK) - 1) + 0.5))] if v > 0 else " "
                   for v in vals)


def _cell(text: str, col: Col) -> str:
    text = text if len(text) <= col.width else text[:max(0, col.width - 1)] + "…"
    return text.ljust(col.width) if col.left else text.rjust(col.width)


def build_frame(snap: dict | None, paths: list[PathView], events: list[dict], view: View,
                width: int, height: int | None, error: str = "") -> list[Text]:
    """The whole screen as at most `height` lines of at most `width` cells."""
    width = max(20, width)
    lines: list[Text] = []
    limit = height if height is not None else 10_000

    # --- title
    now = time.strftime("%H:%M:%S")
    if snap:
        ov = snap.get("overlay", {})
        n = len(paths)
        good = sum(p.state == "GOOD" for p in paths)
        head = Text.assemble(("mrc top ", "bold"), f"{now}  {ov.get('device', '?')} {ov.get('address', '?')}  ",
                             (f"{good}/{n} paths GOOD", "green" if good == n else "bold red"))
        peers = snap.get("peers", [])
        if len(peers) > 3:     # per-peer figures would not fit one line: `status --view peers`
            head.append(f"  {len(peers)} peers")
        for peer in peers if len(peers) <= 3 else ():
            r = peer.get("reorder")
            if isinstance(r, dict) and ("loss_ratio" in r or "ooo_ratio" in r):
                head.append(f"  {peer.get('name')}: reorder {percent(r.get('ooo_ratio'))} "
                            f"loss {percent(r.get('loss_ratio'))}")
    else:
        head = Text.assemble(("mrc top ", "bold"), now)
    lines.append(head)

    # --- sparkline of aggregate throughput
    cur = view.history[-1] if view.history else None
    label = f"tx+rx {bitrate(cur) if cur is not None else '-'}b/s "
    spark_w = max(0, width - len(label) - 1)
    lines.append(Text.assemble((label, "bold"), (_spark(view.history, spark_w), "cyan")))

    if error:
        lines.append(Text(error, style="bold red"))

    # --- rows: per path, or per plane when asked or when the terminal is too short
    multi_peer = len({p.peer for p in paths}) > 1
    events_min = 2 if limit >= 12 else 0
    fixed = len(lines) + 1 + 1  # header + footer
    avail = max(0, limit - fixed - events_min)
    folded = view.folded or len(paths) > avail
    rows = fold(paths) if folded else [(p, 1) for p in paths]
    cols = [Col("peer", max([4] + [len(p.peer) for p in paths]), 3, True)] if multi_peer else []
    if not folded:
        cols.append(Col("path", 4, 5))
    cols += [Col("plane", max([5] + [len(p.plane) for p in paths]), 9, True),
             Col("EVs" if folded else "EV", 5, 6), Col("state", 11, 10, True),
             Col("tx b/s", 6, 9), Col("rx b/s", 6, 8), Col("share", 6, 7), Col("RTT", 6, 4),
             Col("loss", 5, 2), Col("reord", 5, 1), Col("wt", 3, 0)]
    gap = 2
    while cols and sum(c.width for c in cols) + gap * (len(cols) - 1) > width:
        cols.remove(min(cols, key=lambda c: c.prio))
    header = Text((" " * gap).join(_cell(c.name, c) for c in cols), style="bold reverse")
    lines.append(header)
    row_space = max(0, limit - len(lines) - 1 - events_min)
    if len(rows) > row_space:       # what does not fit should be the healthy part
        rows = sorted(rows, key=lambda r: r[0].state == "GOOD")
    shown = rows if len(rows) <= row_space else rows[:max(0, row_space - 1)]
    for v, _n in shown:
        vals = {"peer": v.peer, "path": str(v.id), "plane": v.plane, "EV": str(v.ev), "EVs": str(v.ev),
                "state": v.state, "tx b/s": bitrate(v.tx_Bps), "rx b/s": bitrate(v.rx_Bps),
                "share": percent(v.share), "RTT": duration_us(v.rtt_us), "loss": percent(v.loss),
                "reord": percent(v.reorder), "wt": "-" if v.weight is None else str(v.weight)}
        t = Text()
        for i, c in enumerate(cols):
            if i:
                t.append(" " * gap)
            style = ""
            if c.name == "state":
                style = _state_style(v.state)
            elif c.name == "loss" and v.loss:
                style = "red"
            t.append(_cell(vals[c.name], c), style=style)
        lines.append(t)
    if len(shown) < len(rows):
        lines.append(Text(f"… {len(rows) - len(shown)} more rows (enlarge the terminal)", style="dim"))

    # --- events
    ev_space = limit - len(lines) - 1
    if ev_space >= 1:
        lines.append(Text("recent EV events" if events else "recent EV events: none", style="bold"))
        for ev in list(events)[-(ev_space - 1):] if ev_space > 1 else []:
            lines.append(format_event(ev))

    # --- footer
    drops = {k: v for k, v in (snap or {}).get("drops", {}).items() if v and reason_is_drop(k)}
    mode = "planes" if folded else "paths"
    rate = 1 / max(view.period, view.interval)
    foot = f" q quit  f fold/unfold  [{mode}]  " + (f"{rate:.0f}/s" if rate >= 1 else f"every {1 / rate:.1f} s")
    if drops:
        foot += "  drops: " + " ".join(f"{k}={v}" for k, v in sorted(drops.items()))
    if view.message:
        foot += "  " + view.message
    if len(lines) < limit:
        lines.append(Text(foot, style="dim"))
    out = lines[:limit]
    for t in out:
        t.no_wrap = True
        t.overflow = "crop"
        t.truncate(width, overflow="crop")
    return out


def format_event(ev: dict) -> Text:
    t = ev.get("time", ev.get("ts"))
    if isinstance(t, (int, float)):
        ts = time.strftime("%H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 1000):03d}"
    else:
        ts = str(t or "?")[-12:]
    path = ev.get("path", "?")
    if isinstance(path, dict):
        path = path.get("label") or path.get("id", "?")
    where = ev.get("label") or (f"{ev['plane']}/{ev['ev']}" if "plane" in ev and "ev" in ev else "")
    old, new = str(ev.get("old", "?")), str(ev.get("new", "?"))
    out = Text(f"{ts} {ev.get('peer', '?')} path {path}{' ' + where if where else ''} ")
    out.append(old, style=_state_style(old))
    out.append("→")
    out.append(new, style=_state_style(new))
    if ev.get("reason"):
        out.append(f" {ev['reason']}", style="dim")
    return out


# ------------------------------------------------------------------ the loop

class Dashboard:
    """Samples a Source and turns it into frames; shared by `top` and `demo`."""

    def __init__(self, source: Source, interval: float = 0.25, folded: bool = False):
        self.source = source
        self.view = View(folded=folded, interval=interval)
        self.samples: deque[tuple[float, dict]] = deque(maxlen=64)
        self.snap: dict | None = None
        self.paths: list[PathView] = []
        self.error = ""
        self._last_hist = None

    def sample(self) -> None:
        now = time.monotonic()
        try:
            snap = self.source.snapshot()
            self.error = ""
        except MrcError as e:
            self.error = str(e)
            self.snap, self.paths = None, []
            self.samples.clear()
            return
        except Exception as e:  # e.g. a datapath/mirror mismatch: show it, keep the terminal usable
            self.error = f"cannot read the snapshot: {type(e).__name__}: {e}"
            self.source.close()
            self.snap, self.paths = None, []
            self.samples.clear()
            return
        self.source.events.poll()
        # rates over ~1 s: the oldest sample not older than the window
        while len(self.samples) > 1 and now - self.samples[1][0] >= RATE_WINDOW_S:
            self.samples.popleft()
        base = self.samples[0] if self.samples else None
        self.paths = compute_rates(base[1] if base else None, snap, now - base[0] if base else 0)
        # the sparkline gets the rate over the last interval only, so it moves
        last = self.samples[-1] if self.samples else None
        if last is not None and now > last[0]:
            inst = compute_rates(last[1], snap, now - last[0])
            self.view.history.append(sum((p.tx_Bps or 0) + (p.rx_Bps or 0) for p in inst))
        self.samples.append((now, snap))
        self.snap = snap

    def frame(self, width: int, height: int | None) -> Group:
        return Group(*build_frame(self.snap, self.paths, list(self.source.events.recent), self.view,
                                  width, height, self.error))

    def text(self, width: int = 100) -> str:
        """The frame as plain text (for pipes and logs)."""
        return "\n".join(t.plain.rstrip() for t in build_frame(self.snap, self.paths,
                                                                list(self.source.events.recent),
                                                                self.view, width, None, self.error))


class _Terminal:
    """cbreak mode on stdin for single-key commands, always restored."""

    def __init__(self):
        self.fd = sys.stdin.fileno() if sys.stdin and sys.stdin.isatty() else None
        self.saved = None

    def __enter__(self):
        if self.fd is not None:
            import termios
            import tty
            self.saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            import termios
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)

    def keys(self, timeout: float) -> str:
        if self.fd is None:
            time.sleep(max(0.0, timeout))
            return ""
        r, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        return os.read(self.fd, 64).decode(errors="ignore") if r else ""


class _Stop(Exception):
    pass


def _raise_stop(*_):
    raise _Stop()


def run_live(dash: Dashboard, console: Console, until: float | None = None, on_tick=None) -> str:
    """Refresh in the alternate screen until q, Ctrl-C, SIGTERM or `until`.

    Returns why it stopped: "quit", "interrupt" or "done". on_tick(now) runs
    before every sample (the demo drives its fault schedule with it).
    """
    from rich.live import Live
    old_term = signal.signal(signal.SIGTERM, _raise_stop)
    reason = "done"
    try:
        with _Terminal() as term, Live(console=console, screen=True, auto_refresh=False,
                                       redirect_stdout=False, redirect_stderr=False) as live:
            nxt = time.monotonic()
            while True:
                now = time.monotonic()
                if until is not None and now >= until:
                    break
                if now >= nxt:
                    if on_tick:
                        on_tick(now)
                    dash.sample()
                    w, h = console.size
                    live.update(dash.frame(w, h), refresh=True)
                    dash.view.period = next_period(dash.view.interval, time.monotonic() - now)
                    nxt = max(nxt + dash.view.period, now + dash.view.period / 2)
                keys = term.keys(min(nxt, until or nxt) - time.monotonic())
                if "q" in keys or "Q" in keys:
                    reason = "quit"
                    break
                if "f" in keys or "F" in keys:
                    dash.view.folded = not dash.view.folded
                    w, h = console.size
                    live.update(dash.frame(w, h), refresh=True)
    except (KeyboardInterrupt, _Stop):
        reason = "interrupt"
    finally:
        signal.signal(signal.SIGTERM, old_term)
    return reason


# the share of one CPU the dashboard may take: with thousands of peers a
# sample (and its frame) costs a second or more, and back-to-back samples
# would take a core from the host it watches (whose datapath is CPU-bound)
MAX_DUTY = 0.25


def next_period(interval: float, cost: float) -> float:
    """Seconds from one sample to the next: the interval asked for, or
    longer, so that a sample that took `cost` seconds is at most MAX_DUTY
    of the period."""
    return max(interval, cost / MAX_DUTY)


def run(cfg: cfgmod.Config, interval: float = 0.25, once: bool = False, folded: bool = False,
        width: int | None = None) -> int:
    source = Source(cfg)
    dash = Dashboard(source, interval=interval, folded=folded)
    try:
        # rich prefers $COLUMNS/$LINES over the terminal's size; a parent that
        # exported them once would pin the dashboard to a stale size.
        for var in ("COLUMNS", "LINES"):
            os.environ.pop(var, None)
        console = Console(width=width) if width else Console()
        if once or not console.is_terminal:
            dash.sample()
            if dash.error:
                raise MrcError(dash.error)
            time.sleep(max(interval, 0.5))
            dash.sample()
            if dash.error:
                raise MrcError(dash.error)
            console.print(Group(*build_frame(dash.snap, dash.paths, list(source.events.recent), dash.view,
                                             console.width, None, dash.error)), crop=True, soft_wrap=False)
            return 0
        run_live(dash, console)
        return 0
    finally:
        source.close()
