"""`mrcctl demo`: mrc on a throwaway two-host testbed, live.

Builds two network namespaces joined by N shaped veth planes, brings mrc up
in both exactly as an operator would (`ip netns exec NS mrcctl up`), runs one
TCP stream for a fixed time, blackholes one plane at 1/3 of the run and
restores it at 2/3, shows the dashboard of the sending host while it runs
(a one-line summary per second when stdout is not a terminal), prints a
final summary, and removes everything it made on the way out, Ctrl-C and
SIGTERM included.

The two ends of the stream are lab/stream.py, run as
`python -m mrcctl.cli.stream send|recv` inside the hosts.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from rich.console import Console

from ..datapath.objects import object_paths
from ..errors import MrcError
from ..instance import config as cfgmod
from ..instance.state import Instance
from ..observe.render import bitrate, human_bytes, print_status
from ..observe.source import Source
from ..observe.top import Dashboard, fold, run_live
from .fabric import Fabric
from .stream import PORT
from .testbed import Testbed

# run inside the hosts by module name, as a program of its own
STREAM = "mrcctl.cli.stream"


# ------------------------------------------------------------------ the demo

class _Interrupted(Exception):
    pass


def _interrupt(*_):
    raise _Interrupted()


def _json_line(text: str) -> dict:
    for line in reversed((text or "").splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    return {}


class Demo:
    def __init__(self, duration: float, planes: int, fault: bool, rate: str | None, out=None,
                 fabric: bool = False):
        self.duration = duration
        self.fault = fault
        self.out = out or sys.stdout
        self.prefix = f"mrcdemo{os.getpid() % 100000}"
        rate = None if rate in (None, "none") else rate
        # fabric: each plane a leaf-spine fabric, the hosts on different
        # leaves; the fault is a gray failure of one leaf-spine link
        self.fabric = fabric
        if fabric:
            self.tb = Fabric(hosts=2, planes=planes, spines=2, leaves=2, link_rate=rate, prefix=self.prefix)
        else:
            self.tb = Testbed(hosts=2, planes=planes, rates=rate, prefix=self.prefix)
        self.fault_plane = 1 if planes > 1 else 0
        self.fault_evs: list[int] = []
        self.fault_spine = 1
        self.tmp = tempfile.mkdtemp(prefix="mrcdemo-")
        self.configs: dict[int, str] = {}
        self.netns: dict[int, int] = {}
        self.procs: list[subprocess.Popen] = []
        self.phase = "starting"
        self.fault_on_at = duration / 3
        self.fault_off_at = 2 * duration / 3
        self._fault_state = 0      # 0 before, 1 blackholed, 2 restored
        self.t0 = 0.0

    # --- helpers
    def mrcctl(self, i: int, *args, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(self.tb.ns_cmd(i, [sys.executable, "-m", "mrcctl", *args]),
                              capture_output=True, text=True, timeout=timeout, cwd="/")

    def build(self) -> None:
        self.phase = "building testbed"
        self.tb.up()
        for i in self.tb.hosts():
            path = os.path.join(self.tmp, f"h{i}.toml")
            with open(path, "w") as f:
                f.write(self.tb.mrc_config(i))
            self.configs[i] = path
            self.netns[i] = os.stat(f"/run/netns/{self.tb.ns(i)}").st_ino
        self.phase = "mrcctl up"
        for i in self.tb.hosts():
            cp = self.mrcctl(i, "up", "-c", self.configs[i])
            if cp.returncode != 0:
                msg = (cp.stderr.strip().splitlines() or ["failed"])[-1]
                raise MrcError(f"demo: mrcctl up on {self.tb.ns(i)}: {msg}")
        if self.fabric:
            self.phase = "EV map"
            wire = self.wire_evs()
            self.fault_spine, self.fault_evs = self.pick_fault_link(wire)

    def wire_evs(self, timeout: float = 10.0) -> dict[int, int]:
        """h0's paths on the fault plane: EV (the path's name) -> the port
        it uses on the wire, once h0's agent has mapped that plane (the EV
        map moves EVs onto ports spread evenly over the spines; a map that
        takes longer than `timeout` is taken as it stands)."""
        dev = f"p{self.fault_plane}"
        deadline = time.monotonic() + timeout
        while True:
            cp = self.mrcctl(0, "status", "--json", "-c", self.configs[0])
            peer = json.loads(cp.stdout)["peers"][0] if cp.returncode == 0 else {}
            state = peer.get("ev_map", {}).get(dev, {}).get("state")
            if state == "mapped" or time.monotonic() > deadline:
                return {x["ev"]: x.get("wire_ev", x["ev"]) for x in peer.get("paths", []) if x["plane"] == dev}
            time.sleep(0.2)

    def pick_fault_link(self, wire: dict[int, int]) -> tuple[int, list[int]]:
        """The spine whose link from leaf 0 some but not all of h0's EVs of
        the fault plane cross (the fabric's hash of each EV's port on the
        wire decides, and without the EV map it may put every EV on one
        spine: a demo failing the other link showed no failure at all);
        else one any EV crosses. (spine, the names of those EVs)."""
        ports = {port: ev for ev, port in wire.items()}
        across = [(s, sorted(ports[x] for x in self.tb.evs_across(self.fault_plane, 0, s, 0, 1, ports)))
                  for s in range(self.tb.n_spines)]
        for s, hit in across:
            if 0 < len(hit) < len(wire):
                return s, hit
        return max(across, key=lambda a: (len(a[1]), a[0]))

    def start_stream(self) -> None:
        self.phase = "stream"
        py = [sys.executable, "-m", STREAM]
        recv = self.tb.popen(1, py + ["recv", "--bind", self.tb.overlay_addr(1), "--port", str(PORT),
                                      "--timeout", str(self.duration + 60)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
        self.procs.append(recv)
        r, _, _ = select.select([recv.stdout], [], [], 15)
        line = recv.stdout.readline() if r else ""
        if "listening" not in line:
            raise MrcError(f"demo: the receiver did not start: {line.strip() or recv.stderr.read(500)}")
        self.recv = recv
        self.send = self.tb.popen(0, py + ["send", "--to", self.tb.overlay_addr(1), "--port", str(PORT),
                                           "--seconds", str(self.duration)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
        self.procs.append(self.send)
        self.t0 = time.monotonic()

    def _set_fault(self, on: bool) -> None:
        if self.fabric:
            self.tb.link_blackhole(self.fault_plane, 0, self.fault_spine, on, direction="both")
        else:
            self.tb.blackhole(0, self.fault_plane, on, both=True)

    def fault_name(self) -> str:
        if not self.fabric:
            return f"plane {self.tb.dev(0, 1, self.fault_plane)}"
        evs = ", ".join(map(str, self.fault_evs)) or "none of h0's"
        return f"plane p{self.fault_plane} link leaf 0 - spine {self.fault_spine} (EVs {evs} cross it)"

    def tick(self, now: float) -> str:
        """Apply the fault schedule; returns a note for the display."""
        t = now - self.t0
        if self.fault and self._fault_state == 0 and t >= self.fault_on_at:
            self._set_fault(True)
            self._fault_state = 1
        elif self.fault and self._fault_state == 1 and t >= self.fault_off_at:
            self._set_fault(False)
            self._fault_state = 2
        if not self.fault:
            return "no fault injected"
        name = self.fault_name()
        return {0: f"{name} will be blackholed at t={self.fault_on_at:.0f}s",
                1: f"{name} BLACKHOLED (both ways) until t={self.fault_off_at:.0f}s",
                2: f"{name} restored at t={self.fault_off_at:.0f}s"}[self._fault_state]

    def restore(self) -> None:
        if self._fault_state == 1:
            self._set_fault(False)
            self._fault_state = 2

    def finished(self) -> bool:
        return self.send.poll() is not None

    def teardown(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=3)
        for i, path in self.configs.items():
            try:
                self.mrcctl(i, "down", "-c", path, timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self.tb.down()   # ends whatever still runs in the namespaces (agents), deletes them
        for i, ino in self.netns.items():
            Instance("mrc0", ino).remove()   # in case `down` could not run
        shutil.rmtree(self.tmp, ignore_errors=True)


def _summary_line(demo: Demo, dash, note: str) -> str:
    t = time.monotonic() - demo.t0
    tx = sum(p.tx_Bps or 0 for p in dash.paths)
    good = sum(p.state == "GOOD" for p in dash.paths)
    short = {"GOOD": "ok", "ASSUMED_BAD": "BAD", "DENIED": "DENIED"}
    planes = " ".join(f"{v.plane} {bitrate(v.tx_Bps)} {short.get(v.state, v.state.replace('MIXED ', 'ok '))}"
                      for v, _ in fold(dash.paths))
    return (f"t={t:4.1f}s  h0->h1 {bitrate(tx)}b/s  paths GOOD {good}/{len(dash.paths)}  {planes}  | {note}")


def run(duration: float = 9.0, planes: int = 4, fault: bool = True, rate: str | None = "250mbit",
        fabric: bool = False) -> int:
    if os.geteuid() != 0:
        raise MrcError("mrcctl demo needs root: it creates network namespaces and loads BPF (sudo mrcctl demo)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise MrcError(f"mrcctl demo needs `{tool}` (iproute2)")
    object_paths()   # a missing build fails here, before anything is created

    console = Console()
    interactive = console.is_terminal
    demo = Demo(duration, planes, fault, rate, fabric=fabric)
    old = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    # Ctrl-C (or kill -INT) ends the demo cleanly even when it was started
    # with SIGINT ignored, as a shell's background jobs are: Python then
    # leaves the inherited SIG_IGN in place
    old[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    outcome = "done"
    snap = None
    events = 0
    try:
        kind = "leaf-spine planes (2 spines each; links" if fabric else "planes"
        console.print(f"[bold]mrc demo[/]: 2 hosts ({demo.tb.ns(0)}, {demo.tb.ns(1)}), {planes} {kind}"
                      f"{' at ' + rate if rate and rate != 'none' else ''}{')' if fabric else ''}, "
                      f"one TCP stream for {duration:g} s", soft_wrap=True)
        demo.build()
        cfg0 = cfgmod.load(demo.configs[0])
        source = Source(cfg0, netns=demo.netns[0])
        dash = Dashboard(source, interval=0.25)
        demo.start_stream()
        hard_end = demo.t0 + duration + 45
        if interactive:
            def on_tick(now):
                dash.view.message = demo.tick(now)
                if demo.finished() or now > hard_end:
                    raise _Done()
            outcome = _live(run_live, dash, console, on_tick, hard_end)
        else:
            nxt = time.monotonic()
            while not demo.finished() and time.monotonic() < hard_end:
                note = demo.tick(time.monotonic())
                dash.sample()
                print(_summary_line(demo, dash, note), flush=True)
                nxt += 1.0
                time.sleep(max(0.0, nxt - time.monotonic()))
        demo.restore()   # the fault never outlives the stream
        if outcome == "done":
            dash.sample()
            snap = dash.snap
            source.events.poll()
            events = source.events.count
        source.close()
        if outcome != "done":
            console.print(f"demo stopped early ({outcome}); cleaning up")
            return 0 if outcome == "quit" else 130
        return _report(console, demo, snap, events)
    except (KeyboardInterrupt, _Interrupted):
        console.print("demo interrupted; cleaning up")
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # cleanup must not be cut short
        try:
            demo.teardown()
        finally:
            for s, h in old.items():
                if h is not None:     # None: a handler set outside Python, nothing to restore
                    signal.signal(s, h)


class _Done(Exception):
    pass


def _live(run_live, dash, console, on_tick, hard_end) -> str:
    try:
        reason = run_live(dash, console, until=hard_end, on_tick=on_tick)
    except _Done:
        return "done"
    return {"quit": "quit", "interrupt": "interrupt"}.get(reason, "done")


def _report(console, demo: Demo, snap: dict | None, events: int) -> int:
    try:
        out_s, _ = demo.send.communicate(timeout=60)
        out_r, _ = demo.recv.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        console.print("[bold red]the stream did not finish in time[/]")
        return 1
    s, r = _json_line(out_s), _json_line(out_r)
    if snap:
        print_status(snap, console)
    ok = bool(s.get("sha256")) and s.get("sha256") == r.get("sha256") and s.get("bytes", 0) > 0
    secs = r.get("seconds") or s.get("seconds") or 0
    gbps = (r.get("bytes", 0) * 8 / secs / 1e9) if secs else 0
    console.print(f"sent {human_bytes(s.get('bytes', 0))}, received {human_bytes(r.get('bytes', 0))} "
                  f"in {secs:.1f} s ({gbps:.2f} Gbit/s): sha256 "
                  + ("[green]match[/]" if ok else f"[bold red]MISMATCH[/] {s.get('error', '')} {r.get('error', '')}"))
    console.print(f"EV state changes logged: {events}" + ("" if events else
                                                         " (no events log: the failover agent is not running)"))
    console.print("everything the demo created is being removed")
    return 0 if ok else 1
