"""A testbed with mrc on every host: the integration tests' harness.

Lab(hosts, planes, ...) builds the namespaces (mrcctl.lab.testbed), writes one
mrc config per host and runs the real `mrcctl` inside each namespace with
`ip netns exec`, exactly as an operator would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from mrcctl.lab.fabric import Fabric
from mrcctl.lab.testbed import Testbed

REPO = Path(__file__).resolve().parents[2]
XFER = str(REPO / "scripts" / "xfer.py")
UDPSEQ = str(REPO / "scripts" / "udpseq.py")
MRCCTL = [sys.executable, "-m", "mrcctl"]
# What the failover tests run with: a silent path is retired after 10 ms and
# comes back after 3 probe replies 20 ms apart.
FAST_HEALTH = """[health]
dead_after_ms = 10
probe_interval_ms = 20
recover_probes = 3
"""


class Lab:
    def __init__(self, tmp: Path, hosts: int = 2, planes: int = 4, rates=None, ipv6: bool = False,
                 prefix: str | None = None, fabric: dict | None = None, **cfg):
        """fabric: routed leaf-spine planes (Fabric keywords: spines, leaves,
        link_rate, ...) instead of point-to-point veth planes."""
        self.tmp = Path(tmp)
        # MRC_LAB_PREFIX (e.g. "mt") keeps one person's namespaces apart from
        # another's on a shared machine
        self.prefix = os.environ.get("MRC_LAB_PREFIX", "") + (prefix or f"mi{os.getpid() % 10000}")
        if fabric is not None:
            self.tb = Fabric(hosts=hosts, planes=planes, host_rate=rates, ipv6=ipv6, prefix=self.prefix,
                             **fabric)
        else:
            self.tb = Testbed(hosts=hosts, planes=planes, rates=rates, ipv6=ipv6, prefix=self.prefix)
        self.family = 6 if ipv6 else 4
        self.cfg_kw = cfg
        self.configs: dict[int, Path] = {}

    def __enter__(self):
        self.tb.up()
        try:
            for i in self.tb.hosts():
                self.write_config(i, **self.cfg_kw)
        except BaseException:
            # __exit__ does not run when __enter__ fails: the namespaces
            # would outlive the test
            self.tb.down()
            raise
        return self

    def __exit__(self, *exc):
        for i in self.tb.hosts():
            self.mrcctl(i, "down", check=False)
        self.tb.down()

    def write_config(self, i: int, **kw) -> Path:
        kw.setdefault("family", self.family)
        path = self.tmp / f"h{i}.toml"
        path.write_text(self.tb.mrc_config(i, **kw))
        self.configs[i] = path
        return path

    def mrcctl(self, i: int, *args, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        args = list(args)
        if args and args[0] in ("up", "down", "status", "events", "path") and "-c" not in args:
            args += ["-c", str(self.configs[i])]
        cp = subprocess.run(["ip", "netns", "exec", self.tb.ns(i), *MRCCTL, *args],
                            capture_output=True, text=True, timeout=timeout, cwd=REPO)
        if check and cp.returncode != 0:
            raise AssertionError(f"mrcctl {' '.join(args)} on h{i} failed ({cp.returncode}): "
                                 f"{cp.stderr.strip()}")
        return cp

    def up(self, hosts=None, settle: bool = False):
        hosts = list(hosts if hosts is not None else self.tb.hosts())
        for i in hosts:
            self.mrcctl(i, "up")
        if settle:
            self.settle(hosts)

    def settle(self, hosts=None, timeout: float = 5.0):
        """Wait until every path of the given hosts is GOOD. Hosts come up one
        after another, so the first one's probes time out (probe_loss) until
        its peers are up, and its paths recover by probes a few hundred ms
        later: a test that measures how traffic splits must start after that,
        or the slot walk's detour around the recovering paths is what it
        measures."""
        hosts = list(hosts if hosts is not None else self.tb.hosts())
        deadline = time.monotonic() + timeout
        while True:
            bad = [(i, p["plane"], p["ev"], p["state"]) for i in hosts for p in self.paths(i)
                   if p["state"] != "GOOD"]
            bad += [(i, "no MAC", slot) for i in hosts for slot in self.unresolved(i)]
            if not bad:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"paths not GOOD and resolved {timeout:.0f} s after up: {bad}")
            time.sleep(0.05)
        if isinstance(self.tb, Fabric) and 'mode = "off"' not in self.cfg_kw.get("extra", ""):
            # the EV map moves EVs onto other ports once the spines have
            # answered: what a test measures must start after that
            self.wait_ev_map(hosts)

    def wait_ev_map(self, hosts=None, timeout: float = 15.0) -> dict[int, dict]:
        """Wait until every plane of the given hosts' peers on another leaf
        is mapped (`ev_map` in status; the routers' ICMP rate limit paces
        the traces; a peer on the same leaf has no spine to answer, and its
        map ends unanswered, changing nothing). Returns host -> its first
        such peer's map."""
        hosts = list(hosts if hosts is not None else self.tb.hosts())
        deadline = time.monotonic() + timeout
        while True:
            peers = {i: [p for p in json.loads(self.mrcctl(i, "status", "--json").stdout)["peers"]
                         if self.tb.leaf_of(int(p["name"][1:])) != self.tb.leaf_of(i)] for i in hosts}
            if all(p.get("ev_map") and all(v["state"] == "mapped" for v in p["ev_map"].values())
                   for ps in peers.values() for p in ps):
                return {i: ps[0]["ev_map"] for i, ps in peers.items() if ps}
            if time.monotonic() > deadline:
                raise AssertionError(f"EV map not done {timeout:.0f} s after up: "
                                     f"{ {i: [p.get('ev_map') for p in ps] for i, ps in peers.items()} }")
            time.sleep(0.3)

    def unresolved(self, i: int) -> list[int]:
        """Slots of host i's configured paths without a next-hop MAC yet:
        `up` leaves them to the agent's neighbour task (mrc_tx sends them
        through bpf_redirect_neigh meanwhile, but cannot hedge onto them)."""
        return [k for k, e in enumerate(self.path_entries(i)) if e.ifindex and e.dmac == "00:00:00:00:00:00"]

    def instance(self, i: int):
        """Host i's mrc0 instance record (instance.state.Instance)."""
        from mrcctl.instance.state import Instance

        ino = int(self.tb.exec(i, ["stat", "-L", "-c", "%i", "/proc/self/ns/net"]).stdout)
        return Instance("mrc0", netns=ino)

    def path_entries(self, i: int) -> list:
        """Every slot of host i's mrc_paths, unpacked (abi.Path)."""
        from mrcctl.datapath import abi as wire
        from mrcctl.datapath.libbpf import Map

        state = self.instance(i).read()
        with Map.from_id(state["map_ids"]["mrc_paths"]) as paths:
            raws = paths.lookup_range(0, paths.max_entries)
        return [wire.Path.unpack(r) for r in raws]

    def events(self, i: int, since: float) -> list[dict]:
        """Host i's EV events (mrcctl events --json) at or after wall time `since`."""
        out = self.mrcctl(i, "events", "--json").stdout
        return [e for e in map(json.loads, out.splitlines()) if e["time"] >= since]

    def status(self, i: int) -> dict:
        return json.loads(self.mrcctl(i, "status", "--json").stdout)

    def spines(self, p: int, i: int, j: int) -> dict[int, int | None]:
        """Host i's paths to host j on fabric plane p: configured EV (the
        path's name) -> the spine host i's leaf sends it through, the
        kernel's answer for the port it uses on the wire (`wire_ev`: the EV
        map may have moved it)."""
        paths = [x for x in self.paths(i, f"h{j}") if x["plane"] == f"p{p}"]
        wire = self.tb.ev_spines(p, i, j, [x["wire_ev"] for x in paths])
        return {x["ev"]: wire[x["wire_ev"]] for x in paths}

    def paths(self, i: int, peer: str | None = None) -> list[dict]:
        snap = self.status(i)
        peers = [p for p in snap["peers"] if peer is None or p["name"] == peer]
        return [path for p in peers for path in p["paths"]]

    def overlay(self, i: int) -> str:
        return self.tb.overlay_addr(i)

    def start_receiver(self, dst: int, port: int = 5001, timeout: float = 60, timeline: str | None = None):
        ready = self.tmp / f"ready-{dst}-{port}"
        ready.unlink(missing_ok=True)
        cmd = [sys.executable, XFER, "recv", "--bind", self.overlay(dst), "--port", str(port),
               "--timeout", str(timeout), "--ready-file", str(ready)]
        if timeline:
            cmd += ["--timeline", timeline]
        proc = self.tb.popen(dst, cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"receiver did not start: {proc.stderr.read() if proc.stderr else ''}")
            time.sleep(0.02)
        return proc

    def start_sender(self, src: int, dst: int, nbytes: str = "64M", port: int = 5001, seed: int = 1,
                     timeout: float = 60, max_rate: str | None = None, seconds: float | None = None):
        """max_rate: the socket's pacing rate in bytes/s (xfer.py --max-rate);
        seconds: send for this long, nbytes at a time (xfer.py --seconds)."""
        cmd = [sys.executable, XFER, "send", "--to", self.overlay(dst), "--port", str(port),
               "--bytes", nbytes, "--seed", str(seed), "--timeout", str(timeout)]
        if max_rate:
            cmd += ["--max-rate", max_rate]
        if seconds:
            cmd += ["--seconds", str(seconds)]
        return self.tb.popen(src, cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    @staticmethod
    def result(proc, timeout: float = 120) -> dict:
        out, err = proc.communicate(timeout=timeout)
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if not lines or "error" in lines[-1] or proc.returncode != 0:
            raise AssertionError(f"xfer failed ({proc.returncode}): {out} {err}")
        return lines[-1]

    def transfer(self, src: int, dst: int, nbytes: str = "64M", port: int = 5001, seed: int = 1,
                 timeout: float = 60, max_rate: str | None = None) -> tuple[dict, dict]:
        recv = self.start_receiver(dst, port, timeout)
        send = self.start_sender(src, dst, nbytes, port, seed, timeout, max_rate)
        return self.result(send, timeout + 30), self.result(recv, timeout + 30)

    def qdisc_counter(self, i: int, dev: str, key: str, kind: str | None = None) -> int:
        """Counter `key` (tc -s -j: drops, overlimits, ...) summed over host
        i's qdiscs on dev, only those of `kind` if given."""
        out = self.tb.exec(i, ["tc", "-s", "-j", "qdisc", "show", "dev", dev]).stdout
        return sum(q.get(key, 0) for q in json.loads(out or "[]") if kind in (None, q.get("kind")))

    def link_stats(self, i: int, dev: str) -> dict:
        """`ip -s` stats64 of host i's dev: {"rx": {...}, "tx": {...}}."""
        link = json.loads(self.tb.exec(i, ["ip", "-s", "-j", "link", "show", "dev", dev]).stdout)
        return link[0].get("stats64", {})

    def plane_drops(self, i: int) -> int:
        """Packets host i's plane devices dropped on transmit, qdisc and
        device together: the wire losses a receiver may legitimately see."""
        total = 0
        for j in self.tb.peers(i):
            for dev in self.tb.planes(i, j):
                total += self.qdisc_counter(i, dev, "drops")
                total += self.link_stats(i, dev).get("tx", {}).get("dropped", 0)
        return total

    def nstat(self, i: int) -> dict[str, int]:
        """Absolute kernel counters of host i (nstat -a, without touching its history)."""
        out = self.tb.exec(i, ["nstat", "-a", "-s", "-z", "-j"]).stdout
        data = json.loads(out)
        flat = {}
        for group in data.values():
            flat.update(group)
        return flat
