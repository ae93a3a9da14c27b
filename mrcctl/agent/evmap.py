"""Agent subsystem: the EV map of peers behind a gateway.

A leaf hashes every EV (outer UDP source port) of a plane onto one of its
uplinks; with few EVs the split is lumpy (4 EVs over 2 spines: all on one
spine one time in 8, 3:1 three times in 8), and delay cannot see it before
TCP backs off on the reordering (docs/fabric.md). So the agent asks the
fabric, as Paris traceroute maps ECMP paths: per plane of a peer behind a
gateway it sends EV traces (MRC_T_TRACE frames with the very headers the
path's data carries, TTL 2 .. 1 + ev_map.depth) from each path's configured
EV and from `candidates - 1` other ports each, and reads which router
answers with ICMP time exceeded. Then it picks, per plane, the ports that
spread the plane's EVs most evenly over the hops answered (`balance`, first
hop first), keeps a path's configured EV wherever that is as even, and
writes the chosen port into the path's mrc_paths entry (`ev`, this task its
writer after the loader). A path's identity stays its configured EV
(status `ev`, events, `path deny`); `wire_ev` in status is the port it uses.

Routers rate-limit ICMP errors per destination (Linux: 6 at once, then one
a second), so unanswered traces are sent again RETRY_S later, TRIES times
at most, and at most TRACES_PER_S leave per second. A peer is mapped again
when its gateway changes and every REFRESH_S. What was learnt goes to
`evmap.json` in the instance's run directory for `mrcctl status`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import struct
from dataclasses import dataclass, field

from ..datapath import abi as wire
from ..datapath import netdev
from . import health
from . import loop as agentmod

log = logging.getLogger("mrc.agent.evmap")

PERIOD_S = 0.05
RETRY_S = 1.0
TRIES = 4
TRACES_PER_S = 400
# planes traced at once (a peer's planes start together: one peer's more at
# most); the others wait their turn, so thousands of peers behind gateways
# cost this task the same per tick as a few
ACTIVE = 64
GATEWAYS_S = 1.0        # how often the gateways are compared with the map's
WRITE_S = 1.0           # evmap.json at most this often
NO_SOCK_S = 10.0        # a device without a packet socket is tried again after this
REFRESH_S = 300.0
EVMAP_FILE = "evmap.json"
ICMP_TIME_EXCEEDED, ICMP6_TIME_EXCEEDED = 11, 3
TAG = 0x4D00            # IP ID (IPv4) / MRC psn of a trace: TAG | TTL
_AT = wire.Path.offsets()
_EV = struct.Struct("=H")


def balance(configured: list[int], sigs: dict[int, tuple]) -> list[int]:
    """The port each of a plane's paths should use, in the order of
    `configured` (their configured EVs). `sigs`: port -> the routers that
    answered its traces, nearest first (None where none did). Greedy: each
    pick is the port whose hops are least used so far, first hop first; a
    configured port wins a tie. The configured ports stay as they are unless
    the pick spreads them more evenly."""
    known = {p: s for p, s in sigs.items() if s and s[0] is not None}
    mine = [p for p in configured if p in known]
    if len(mine) < 2:
        return list(configured)
    order = {p: i for i, p in enumerate(list(configured) + [p for p in known if p not in configured])}
    counts: dict[tuple, int] = {}
    chosen: list[int] = []
    pool = set(known)
    for _ in range(len(mine)):
        best = min(pool, key=lambda p: ([counts.get(known[p][:k + 1], 0) for k in range(len(known[p]))],
                                        p not in configured, order[p]))
        pool.discard(best)
        chosen.append(best)
        for k in range(len(known[best])):
            counts[known[best][:k + 1]] = counts.get(known[best][:k + 1], 0) + 1
    if _spread(chosen, known) >= _spread(mine, known):
        return list(configured)
    spare = [p for p in chosen if p not in mine]
    return [p if p not in known or p in chosen else spare.pop(0) for p in configured]


def _spread(ports: list[int], known: dict[int, tuple]) -> list[int]:
    """Per hop level, the most ports that share one prefix of hops."""
    depth = max(len(known[p]) for p in ports)
    out = []
    for k in range(depth):
        c: dict[tuple, int] = {}
        for p in ports:
            c[known[p][:k + 1]] = c.get(known[p][:k + 1], 0) + 1
        out.append(max(c.values()))
    return out


@dataclass
class Job:
    """One plane of one peer being mapped."""
    peer: int
    ifindex: int
    gateway: str
    daddr: str                              # the peer's address on this plane
    pids: list[int]                         # the plane's path ids
    configured: list[int]                   # their configured EVs
    ports: list[int]                        # configured first, then the other candidates
    ttls: list[int]
    answers: dict[tuple[int, int], str] = field(default_factory=dict)   # (port, ttl) -> router
    tries: dict[tuple[int, int], int] = field(default_factory=dict)
    due: float = 0.0
    done: bool = False
    result: dict[int, int] = field(default_factory=dict)                # pid -> port in use

    def pending(self) -> list[tuple[int, int]]:
        return [(p, t) for t in self.ttls for p in self.ports
                if (p, t) not in self.answers and self.tries.get((p, t), 0) < TRIES]

    def sigs(self) -> dict[int, tuple]:
        return {p: tuple(self.answers.get((p, t)) for t in self.ttls) for p in self.ports}


def candidates(peer, pids: list[int], n: int) -> list[int]:
    """The plane's configured EVs, then n - 1 more ports per path: the
    configured EV moved by whole blocks of the peer's paths (ports no other
    path of the peer uses), within 1024..65535."""
    by_id = {p.id: p for p in peer.paths}
    out = [by_id[pid].ev for pid in pids]
    span = len(peer.paths)
    for k in range(1, n):
        for pid in pids:
            port = by_id[pid].ev + k * span
            if port > 65535:
                port = 1024 + (port - 65536) % (65536 - 1024)
            if port not in out:
                out.append(port)
    return out


@agentmod.subsystem
def setup(agent: agentmod.Agent) -> None:
    cfg_map = agent.cfg.ev_map
    if cfg_map.mode == "off":
        return
    EvMapper(agent)


class EvMapper:
    def __init__(self, agent: agentmod.Agent):
        self.agent = agent
        self.jobs: dict[tuple[int, int], Job] = {}  # (peer, ifindex) -> its latest map
        self.active: dict[tuple[int, int], Job] = {}
        self.waiting: dict[int, None] = {}          # peers to map, oldest first
        self.by_trace: dict[tuple[str, int], Job] = {}   # (peer address, port) -> active job
        self.mapped: dict[int, tuple] = {}          # peer -> its gateways when mapped
        self.started: dict[int, float] = {}
        self.socks: dict[int, socket.socket] = {}   # ifindex -> AF_PACKET
        self.no_sock: dict[int, float] = {}         # ifindex -> when to try again
        self.tokens = float(TRACES_PER_S) / 10
        self.last: float | None = None         # the clock of the last tick
        self.checked = 0.0
        self.written = 0.0
        self.dirty = False
        self.peers = {p.index: p for p in agent.cfg.peers}
        self.file = agent.inst.run_dir / EVMAP_FILE
        self.icmp = []
        for fam, proto in ((socket.AF_INET, socket.IPPROTO_ICMP), (socket.AF_INET6, socket.IPPROTO_ICMPV6)):
            try:
                s = socket.socket(fam, socket.SOCK_RAW, proto)
                s.setblocking(False)
            except OSError as e:
                log.warning("EV map: no raw ICMP socket (%s): %s", fam.name, e)
                continue
            self.icmp.append(s)
            agent.add_reader(s.fileno(), lambda s=s: self._drain(s))
        agent.add_task("evmap", PERIOD_S, self.tick)
        agent.on_peers(self.peers_changed)

    # ---------------------------------------------------------------- jobs
    def peers_changed(self, cfg, touched: set[int]) -> None:
        self.peers = {p.index: p for p in cfg.peers}
        for i in touched:
            self._drop(i)
            self.mapped.pop(i, None)
            self.started.pop(i, None)
            self.waiting.pop(i, None)
        self.checked = 0.0
        self.dirty = True

    def _drop(self, peer: int) -> None:
        for key in [k for k in self.jobs if k[0] == peer]:
            job = self.jobs.pop(key)
            if self.active.pop(key, None) is not None:
                for port in job.ports:
                    self.by_trace.pop((job.daddr, port), None)

    def _check(self, now: float) -> None:
        """Queue the peers whose gateways differ from those of their map, or
        whose map is older than REFRESH_S."""
        self.checked = now
        for i, gws in self.agent.gateways.items():
            if i in self.waiting:
                continue
            if self.mapped.get(i) != tuple(sorted(gws.items())) or now - self.started.get(i, now) > REFRESH_S:
                self.waiting[i] = None

    def _start(self, peer, gws: dict[int, str], now: float) -> None:
        _t, ents, _k = self.agent.entries_of(peer)
        depth = self.agent.cfg.ev_map.depth
        by_if: dict[int, list[int]] = {}
        for path in peer.paths:
            if path.id < len(ents):
                by_if.setdefault(ents[path.id].ifindex, []).append(path.id)
        self._drop(peer.index)
        for ifindex, gw in gws.items():
            pids = by_if.get(ifindex, [])
            if len(pids) < 2:
                continue
            ports = candidates(peer, pids, self.agent.cfg.ev_map.candidates)
            job = Job(peer.index, ifindex, gw, ents[pids[0]].daddr, pids,
                      [p.ev for p in peer.paths if p.id in pids], ports, list(range(2, 2 + depth)))
            self.jobs[(peer.index, ifindex)] = self.active[(peer.index, ifindex)] = job
            for port in ports:
                self.by_trace[(job.daddr, port)] = job
        self.mapped[peer.index] = tuple(sorted(gws.items()))
        self.started[peer.index] = now
        self.dirty = True

    def tick(self, now: float) -> float | None:
        if now - self.checked >= GATEWAYS_S:
            self._check(now)
        while self.waiting and len(self.active) < ACTIVE:
            i = next(iter(self.waiting))
            del self.waiting[i]
            gws = self.agent.gateways.get(i)
            if i in self.peers and gws:
                self._start(self.peers[i], gws, now)
        self.tokens = min(TRACES_PER_S / 10, self.tokens + (now - (self.last or now)) * TRACES_PER_S)
        self.last = now
        out: dict[int, list[bytes]] = {}
        for job in list(self.active.values()):
            if now < job.due:
                continue
            todo = job.pending()
            if not todo:
                self._finish(job)
                continue
            peer = self._peer(job)
            if peer is None:
                continue
            _t, ents, _k = self.agent.entries_of(peer)
            ent = ents[job.pids[0]]
            if ent.dmac == "00:00:00:00:00:00":
                job.due = now + RETRY_S       # the gateway's MAC is not known yet
                continue
            n = min(len(todo), int(self.tokens))
            if n <= 0:
                break
            self.tokens -= n
            for port, ttl in todo[:n]:
                job.tries[(port, ttl)] = job.tries.get((port, ttl), 0) + 1
                frame = health.probe_frame(_with_ev(ent, port), job.pids[0], self.agent.cfg.udp_port,
                                           mtype=wire.MsgType.TRACE, ttl=ttl, ip_id=TAG | ttl)
                out.setdefault(job.ifindex, []).append(bytes(frame))
            job.due = now + RETRY_S
        for ifindex, frames in out.items():
            s = self._sock(ifindex, now)
            if s is not None:
                netdev.send_frames(s.fileno(), frames)
        if self.dirty and now - self.written >= WRITE_S:
            self._write()
            self.written = now
        return None

    def _peer(self, job: Job):
        return self.peers.get(job.peer)

    def _finish(self, job: Job) -> None:
        job.done = True
        if self.active.pop((job.peer, job.ifindex), None) is not None:
            for port in job.ports:
                self.by_trace.pop((job.daddr, port), None)
        self.dirty = True
        peer = self._peer(job)
        if peer is None:
            return
        ports = balance(job.configured, job.sigs())
        job.result = dict(zip(job.pids, ports))
        _t, ents, keys = self.agent.entries_of(peer)
        paths_m = self.agent.dp.map("mrc_paths")
        moved = 0
        for pid, port in job.result.items():
            if pid < len(ents) and ents[pid].ev != port:
                raw = bytearray(ents[pid].pack())
                _EV.pack_into(raw, _AT["ev"], port)
                paths_m.update(keys[pid], bytes(raw))
                moved += 1
        sigs = job.sigs()
        log.info("EV map of %s via %s: %s%s", peer.name, job.gateway,
                 ", ".join(f"{p}->{'/'.join(h or '?' for h in sigs[p])}" for p in ports),
                 f" ({moved} EVs moved)" if moved else "")

    # ---------------------------------------------------------------- I/O
    def _sock(self, ifindex: int, now: float) -> socket.socket | None:
        s = self.socks.get(ifindex)
        if s is None:
            # a device that failed is tried again only after a while: closing
            # a packet socket waits for an RCU grace period (~10 ms)
            if now < self.no_sock.get(ifindex, 0.0):
                return None
            try:
                s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
                try:
                    s.bind((socket.if_indextoname(ifindex), 0))
                except OSError:
                    s.close()
                    raise
                s.setblocking(False)
            except OSError as e:
                if ifindex not in self.no_sock:
                    log.warning("EV map: cannot send on ifindex %d: %s", ifindex, e)
                self.no_sock[ifindex] = now + NO_SOCK_S
                return None
            self.socks[ifindex] = s
        return s

    def _drain(self, s: socket.socket) -> None:
        port_no = self.agent.cfg.udp_port
        while True:
            try:
                pkt, addr = s.recvfrom(2048)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            self.answer(pkt, s.family, addr[0], port_no)

    def answer(self, pkt: bytes, family: int, router: str, port_no: int) -> None:
        """One ICMP packet from `router`: the answer to a trace of ours, or
        nothing to do with us."""
        got = parse_time_exceeded(pkt, family, port_no)
        if got is None:
            return
        _src, dst, sport, ttl = got
        job = self.by_trace.get((dst, sport))
        if job is None:
            return
        t = ttl if ttl in job.ttls else (job.ttls[0] if len(job.ttls) == 1 else None)
        if t is not None:
            job.answers[(sport, t)] = router
            if not job.pending():
                self._finish(job)

    def _write(self) -> None:
        """evmap.json: per peer name and plane, the state and each port's hops."""
        self.dirty = False
        doc: dict = {}
        for job in self.jobs.values():
            try:
                dev = socket.if_indextoname(job.ifindex)
            except OSError:
                dev = str(job.ifindex)
            sigs = job.sigs()
            peer = self.peers.get(job.peer)
            doc.setdefault(peer.name if peer else str(job.peer), {})[dev] = {
                "state": "mapped" if job.done else "tracing",
                "gateway": job.gateway,
                "hops": {str(p): list(sigs[p]) for p in job.ports},
                "ports": {str(pid): port for pid, port in job.result.items()},
            }
        tmp = self.file.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, self.file)
        except OSError as e:
            log.warning("EV map: cannot write %s: %s", self.file, e)


def _with_ev(ent: wire.Path, port: int) -> wire.Path:
    return dataclasses.replace(ent, ev=port)


def parse_time_exceeded(pkt: bytes, family: int, udp_port: int):
    """(our source, the peer's address, EV, TTL tag or None) of an ICMP /
    ICMPv6 time exceeded that quotes an EV trace to udp_port, else None.
    An IPv4 raw socket hands the IP header too; an IPv6 one does not."""
    try:
        if family == socket.AF_INET:
            ihl = (pkt[0] & 0x0F) * 4
            if pkt[ihl] != ICMP_TIME_EXCEEDED:
                return None
            q = pkt[ihl + 8:]
            qihl = (q[0] & 0x0F) * 4
            if q[0] >> 4 != 4 or q[9] != socket.IPPROTO_UDP:
                return None
            src, dst = socket.inet_ntoa(q[12:16]), socket.inet_ntoa(q[16:20])
            ip_id = struct.unpack_from("!H", q, 4)[0]
            u = q[qihl:]
            ttl = ip_id & 0xFF if ip_id & 0xFF00 == TAG else None
        else:
            if pkt[0] != ICMP6_TIME_EXCEEDED:
                return None
            q = pkt[8:]
            if q[0] >> 4 != 6 or q[6] != socket.IPPROTO_UDP:
                return None
            src = socket.inet_ntop(socket.AF_INET6, q[8:24])
            dst = socket.inet_ntop(socket.AF_INET6, q[24:40])
            u = q[40:]
            ttl = None
            if len(u) >= 8 + wire.MRC_HDR_LEN:
                psn = wire.decode_mrc_hdr(u[8:8 + wire.MRC_HDR_LEN]).psn
                ttl = psn & 0xFF if psn & 0xFF00 == TAG else None
        sport, dport = struct.unpack_from("!HH", u, 0)
    except (IndexError, struct.error, OSError, ValueError):
        return None
    if dport != udp_port:
        return None
    return src, dst, sport, ttl
