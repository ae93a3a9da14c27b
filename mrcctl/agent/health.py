"""Agent subsystem: path health in the control plane.

The datapath judges liveness and recovers paths on its own (bpf/judge.h, bpf/evidence.h);
this module feeds it and reports on it:

* EV probes: per path, an MRC PROBE frame out of the path's plane, to the
  peer's underlay address and MRC port, from the path's EV. The peer's XDP
  program answers; ours records RTT and evidence and, for an ASSUMED_BAD
  path, counts consecutive replies until it returns to GOOD. Probes go out of
  an AF_PACKET socket per plane with prebuilt frames: no UDP socket has to
  own the EV ports (which overlap the kernel's ephemeral range), and only
  the probe sequence number, timestamp and nonce change per probe (the
  nonce is recorded in mrc_probe_nonce first: ours counts only replies that
  echo it). GOOD paths are
  probed only when data feedback has not refreshed their evidence within a
  probe interval, so under load probing costs next to nothing.
* Link events: a netlink monitor; a plane that goes down or loses carrier
  has its paths forced to ASSUMED_BAD at once; its return resumes probing.
* EV events: state changes from the ring buffer (datapath) and from the
  agent itself are appended to events.jsonl in the instance's run dir
  (rotated at EVENTS_MAX_BYTES, one old file kept); `mrcctl events` reads it.
* Slot tables: after any state change, each peer's spray table is rebuilt
  from the GOOD paths, so the datapath stops stepping over dead slots.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import struct
import time
from dataclasses import dataclass, field

from ..datapath import abi as wire
from ..datapath.libbpf import RingBuffer
from ..instance.events import EventLog, event_record, events_path
from ..instance.slots import rebuild_slots
from . import loop as agentmod

log = logging.getLogger("mrc.health")

HEALTH_FILE = "health.json"
ETH_P_ALL = 0x0003
IFF_UP = 0x1
IFF_LOWER_UP = 0x10000
RTMGRP_LINK = 0x1
# GOOD paths whose evidence is stale get probed; this many probes in a row
# unanswered retire the path from the agent. The datapath cannot see this
# case: with the reverse stream silent (TCP waiting out an RTO) it has no
# data evidence to judge by, and a retransmission could keep landing on
# dead paths while a restored one sits unused.
PROBE_LOSS = 3
# ... and only when the path's evidence is this old: under load, probes
# queue behind data and answer late, while the data feedback is fresh.
PROBE_STALE_NS = 100_000_000
# A peer whose tx PSN has not moved for this long is idle: its GOOD paths
# are not probed (the datapath judges them from data as soon as it flows)
IN_USE_NS = 1_000_000_000
# ... its paths are read this often (one batch per peer); those found
# ASSUMED_BAD are probed every interval, in use or not, so that they are
# back in service when traffic returns
IDLE_LOOK_NS = 1_000_000_000
# The agent's own event reason: the datapath cannot see probe silence, so
# enum mrc_ev_reason has no member for it.
PROBE_LOSS_REASON = "probe_loss"


# ------------------------------------------------------------------ probes


def probe_frame(path: wire.Path, path_id: int, udp_port: int) -> bytearray:
    """Ethernet + IP + UDP + MRC PROBE for one path; the MRC header's psn
    (probe sequence) and tx_ts are patched per probe (PROBE_PSN_OFF/TS_OFF
    from the end)."""
    mrc = wire.encode_mrc_hdr(wire.MsgType.PROBE, path_id=path_id)
    udp = struct.pack("!HHHH", path.ev, udp_port, 8 + len(mrc), 0)
    if path.family == 4:
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp) + len(mrc), 0, 0x4000, 64, 17, 0,
                         socket.inet_aton(path.saddr), socket.inet_aton(path.daddr))
        ip = ip[:10] + struct.pack("!H", wire.inet_csum(ip)) + ip[12:]
        etype = 0x0800
    else:
        ip = struct.pack("!IHBB16s16s", 6 << 28 | (path.ev & 0xFFFFF), len(udp) + len(mrc), 17, 64,
                         socket.inet_pton(socket.AF_INET6, path.saddr),
                         socket.inet_pton(socket.AF_INET6, path.daddr))
        etype = 0x86DD
    eth = wire.mac_bytes(path.dmac) + wire.mac_bytes(path.smac) + struct.pack("!H", etype)
    return bytearray(eth + ip + udp + mrc)


_LIVE_AT = wire.PathLive.offsets()
_U32, _U64 = struct.Struct("=I"), struct.Struct("=Q")

# offsets of psn and tx_ts inside the MRC header (which ends the frame)
_PSN_OFF = wire.MRC_HDR_LEN - 4
_TS_OFF = wire.MRC_HDR_LEN - 8
# ... and of the nonce halves (seq0, fb_ts), counted from the frame's end
_NONCE_HI_END = wire.MRC_HDR_LEN - 16
_NONCE_LO_END = wire.MRC_HDR_LEN - 24


@dataclass
class ProbePath:
    peer: int
    path: int
    key: bytes
    plane: str
    frame: bytearray
    ent: wire.Path | None = None              # the mrc_paths entry the frame was built from
    seq: int = 0
    sent: int = 0
    last_ns: int = 0                          # when it was last probed
    nonces: wire.ProbeNonce | None = None     # outstanding probes (mrc_probe_nonce)


@dataclass
class PeerActivity:
    psn: int = -1            # the tx PSN last seen (mrc_peer_seq)
    in_use_until: int = 0    # monotonic ns
    look_at: int = 0         # when an idle peer's paths are next read
    bad: list = field(default_factory=list)   # its ASSUMED_BAD paths at that look


class Prober:
    """Which paths to probe, and when, at a cost that does not grow with
    idle paths:

    * a peer is *in use* while its tx PSN moves (and IN_USE_NS after); its
      GOOD paths are probed when data feedback has left their evidence
      stale, its other paths every interval;
    * an idle peer's GOOD paths are not probed at all: no traffic depends
      on them, and the datapath judges them from data evidence as soon as
      traffic starts. Its paths are read every IDLE_LOOK_NS and the
      ASSUMED_BAD ones probed every interval, so they are back when
      traffic returns;
    * at most health.probe_budget probes a second leave the host, the
      least recently probed due paths first, so none starves;
    * the datapath is read a peer at a time (one batch lookup per peer and
      map), not a path at a time.
    """

    def __init__(self, agent: agentmod.Agent):
        self.agent = agent
        self.cfg = agent.cfg
        self.paths: list[ProbePath] = []
        self.by_peer: dict[int, list[ProbePath]] = {}
        self.activity = {peer.index: PeerActivity() for peer in self.cfg.peers}
        self.socks: dict[str, socket.socket] = {}
        self.down: set[str] = set()
        self.sent = 0
        self.errors = 0
        self.deferred = 0        # due probes the budget held back
        self.interval_ns = int(self.cfg.health.probe_interval_ms * 1e6)
        self.budget = self.cfg.health.probe_budget
        self.tokens = 0.0
        self.last_ns = 0
        self.refresh()

    def refresh(self, _now: float = 0.0) -> None:
        """(Re)build frames from mrc_paths: MACs may change (neighbours)."""
        old = {(p.peer, p.path): p for p in self.paths}
        out = []
        for peer, path, key, ent in self.agent.path_entries():
            prev = old.get((peer.index, path.id))
            if ent.dmac == "00:00:00:00:00:00":
                # Neighbour unresolved (the peer's link flapped): keep
                # probing the last MAC known. A path out of the spray
                # table carries no traffic that would resolve it, and
                # the probes are what bring it back.
                if prev is not None:
                    out.append(prev)
                continue
            if prev is not None and prev.ent == ent:
                out.append(prev)        # unchanged: no new frame
                continue
            pp = ProbePath(peer.index, path.id, key, path.plane.device,
                           probe_frame(ent, path.id, self.cfg.udp_port), ent)
            if prev is not None:
                pp.seq, pp.sent, pp.nonces, pp.last_ns = prev.seq, prev.sent, prev.nonces, prev.last_ns
            out.append(pp)
            if path.plane.device not in self.socks:
                self._open(path.plane.device)
        self.paths = out
        self.by_peer = {}
        for pp in out:
            self.by_peer.setdefault(pp.peer, []).append(pp)

    def _open(self, dev: str) -> None:
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)   # protocol 0: send only
        s.bind((dev, 0))
        s.setblocking(False)
        self.socks[dev] = s

    def in_use(self) -> int:
        now = time.monotonic_ns()
        return sum(now < a.in_use_until for a in self.activity.values())

    def tick(self, _now: float) -> list[ProbePath]:
        """Send due probes; returns the GOOD paths that left the last
        PROBE_LOSS probes unanswered."""
        dp = self.agent.dp
        live_m, seq_m = dp.map("mrc_live"), dp.map("mrc_peer_seq")
        now = time.monotonic_ns()
        dt = now - self.last_ns if self.last_ns else self.interval_ns
        self.last_ns = now
        # a bucket of at most one interval's worth (at least one probe)
        self.tokens = min(max(1.0, self.budget * self.interval_ns / 1e9), self.tokens + self.budget * dt / 1e9)
        seqs = seq_m.lookup_range(0, len(self.cfg.peers))
        bad: list[ProbePath] = []
        stale: list[ProbePath] = []
        silent = []
        for peer in self.cfg.peers:
            pps = self.by_peer.get(peer.index)
            if not pps:
                continue
            act = self.activity[peer.index]
            if peer.index < len(seqs):
                psn = wire.PeerSeq.unpack(seqs[peer.index]).psn
                if psn != act.psn:
                    act.psn, act.in_use_until = psn, now + IN_USE_NS
            in_use = now < act.in_use_until
            if not in_use:
                if now < act.look_at:
                    # between looks, the dead paths found at the last one
                    bad += [pp for pp in act.bad if now - pp.last_ns >= self.interval_ns]
                    continue
                act.look_at = now + IDLE_LOOK_NS
            lives = live_m.lookup_range(wire.path_idx(peer.index, 0), len(peer.paths))
            act.bad = []
            for pp in pps:
                if pp.plane in self.down or pp.path >= len(lives):
                    continue
                # three fields of mrc_live, not the whole struct: this loop
                # runs over every path of every peer in use each interval
                raw = lives[pp.path]
                state = _U32.unpack_from(raw, _LIVE_AT["state"])[0]
                if state != wire.PathState.GOOD:
                    if state == wire.PathState.ASSUMED_BAD:
                        act.bad.append(pp)
                    if in_use or state == wire.PathState.ASSUMED_BAD:
                        bad.append(pp)
                    continue
                # GOOD: only for a peer in use, and only without fresh data feedback
                last_ack = _U64.unpack_from(raw, _LIVE_AT["last_ack_ns"])[0]
                if not in_use or now - last_ack < self.interval_ns:
                    continue
                if ((pp.seq - _U32.unpack_from(raw, _LIVE_AT["probe_seq"])[0]) & 0xFFFFFFFF) >= PROBE_LOSS \
                        and pp.sent >= PROBE_LOSS and now - last_ack > PROBE_STALE_NS:
                    silent.append(pp)
                stale.append(pp)
        allowed = int(self.tokens)
        due = bad + stale
        if len(due) > allowed:
            # least recently probed first: out-of-service paths probed every
            # interval must not starve the silent GOOD ones, whose silence
            # is only found out by probing them
            self.deferred += len(due) - allowed
            due.sort(key=lambda pp: pp.last_ns)
        nonce_m = dp.map("mrc_probe_nonce")
        for pp in due[:allowed]:
            pp.last_ns = now
            self._send(pp, nonce_m)
            self.tokens -= 1
        return silent

    def _send(self, pp: ProbePath, nonce_m) -> None:
        pp.seq = (pp.seq + 1) & 0xFFFFFFFF
        f = pp.frame
        n = len(f)
        struct.pack_into("!I", f, n - _PSN_OFF, pp.seq)
        struct.pack_into("!I", f, n - _TS_OFF, (time.monotonic_ns() // 1000) & 0xFFFFFFFF)
        # An unpredictable nonce per probe, known to rx before the probe
        # leaves: only a reply echoing it counts (issue #13.8).
        nonce = int.from_bytes(os.urandom(8), "big") or 1
        hdr = wire.probe_nonce_fields(nonce)
        struct.pack_into("!I", f, n - _NONCE_HI_END, hdr["seq0"])
        struct.pack_into("!I", f, n - _NONCE_LO_END, hdr["fb_ts"])
        if pp.nonces is None:
            pp.nonces = wire.ProbeNonce()
        pp.nonces.add(pp.seq, nonce)
        try:
            nonce_m.update(pp.key, pp.nonces.pack())
        except OSError:
            self.errors += 1
            return
        try:
            self.socks[pp.plane].send(f)
            pp.sent += 1
            self.sent += 1
        except OSError:
            self.errors += 1   # plane down / queue full: the sequence gap restarts recovery

    def close(self) -> None:
        for s in self.socks.values():
            s.close()


# ------------------------------------------------------------------ the subsystem

class Health:
    def __init__(self, agent: agentmod.Agent):
        self.agent = agent
        self.cfg = agent.cfg
        self.dp = agent.dp
        self.log = EventLog(events_path(agent.inst))
        self.prober = Prober(agent)
        self.dirty = True
        self.events = 0
        self.plane_index = {p.device: p.index for p in self.cfg.planes}
        # monotonic ns -> wall clock, for ring buffer timestamps
        self.mono_off = time.time() - time.monotonic()
        self.ring = RingBuffer(self.dp.map("mrc_events"), self._on_ring)
        agent.add_reader(self.dp.map("mrc_events").fd, self._drain)
        self._link_setup()
        agent.add_task("probe", self.cfg.health.probe_interval_ms / 1000, self._probe)
        agent.add_task("probe-frames", 1.0, self.prober.refresh)
        agent.add_task("slots", 1.0, self._slots)
        agent.add_task("health-report", 1.0, self._report)

    def _probe(self, now: float) -> None:
        silent = self.prober.tick(now)
        if silent:
            self._retire_silent(silent)

    def _retire_silent(self, silent: list[ProbePath]) -> None:
        live_m = self.dp.map("mrc_live")
        now = time.monotonic_ns()
        by_peer: dict[int, list[ProbePath]] = {}
        for pp in silent:
            by_peer.setdefault(pp.peer, []).append(pp)
        for peer_idx, pps in by_peer.items():
            peer = self.cfg.peers[peer_idx]
            good = sum(self.dp.usable(peer_idx, path.id) for path in peer.paths)
            for pp in pps:
                if good - 1 < max(peer.min_active, 1):
                    break   # never retire the last usable paths on probe silence alone
                lv = wire.PathLive.unpack(live_m.lookup(pp.key))
                if lv.state != wire.PathState.GOOD:
                    continue
                lv.state, lv.bad_ns, lv.probe_ok = wire.PathState.ASSUMED_BAD, now, 0
                live_m.update(pp.key, lv.pack())
                good -= 1
                self.log.append(event_record(self.cfg, peer_idx, pp.path, wire.PathState.GOOD,
                                             wire.PathState.ASSUMED_BAD, PROBE_LOSS_REASON, "agent"))
                self.events += 1
                self.dirty = True
        self._slots(0)

    # ---- datapath events
    def _drain(self) -> None:
        self.ring.consume()
        self._slots(0)

    def _on_ring(self, data: bytes) -> None:
        ev = wire.Event.unpack(data)
        try:
            reason = wire.EvReason(ev.reason).label
        except ValueError:
            reason = str(ev.reason)
        self.log.append(event_record(self.cfg, ev.peer, ev.path, ev.old_state, ev.new_state, reason,
                                     "datapath", ts=ev.ts_ns / 1e9 + self.mono_off, age_us=ev.age_us))
        self.events += 1
        self.dirty = True

    def _slots(self, _now: float) -> None:
        if self.dirty:
            self.dirty = False
            rebuild_slots(self.dp, self.cfg)

    # ---- link events
    def _link_setup(self) -> None:
        """A raw rtnetlink socket on the link group only wakes us up; the
        state is then read afresh (pyroute2's own socket buffers messages
        it has read, which a selector cannot see, and events came late)."""
        from pyroute2 import IPRoute
        self.ipr = IPRoute()
        self.nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self.nl.bind((0, RTMGRP_LINK))
        self.nl.setblocking(False)
        self.agent.add_reader(self.nl.fileno(), self._on_netlink)
        self._scan_links(initial=True)

    def _on_netlink(self) -> None:
        while True:
            try:
                if not self.nl.recv(65536):
                    break
            except BlockingIOError:
                break
            except OSError:   # ENOBUFS: events were lost, the scan below catches up
                break
        self._scan_links()

    def _scan_links(self, initial: bool = False) -> None:
        seen = set()
        for link in self.ipr.get_links():
            dev = link.get_attr("IFLA_IFNAME")
            if dev in self.plane_index:
                seen.add(dev)
                self._link_state(dev, link.get("flags", 0), initial)
        for dev in set(self.plane_index) - seen:   # deleted
            self._link_state(dev, 0, initial)

    def _link_state(self, dev: str, flags: int, initial: bool = False) -> None:
        up = bool(flags & IFF_UP) and bool(flags & IFF_LOWER_UP)
        was_down = dev in self.prober.down
        if not up and not was_down:
            self.prober.down.add(dev)
            self._force_bad(dev)
        elif up and was_down:
            self.prober.down.discard(dev)
            if not initial:
                self._log_plane(dev, wire.EvReason.LINK_UP.label)

    def _plane_paths(self, dev: str):
        for peer in self.cfg.peers:
            for path in peer.paths:
                if path.plane.device == dev:
                    yield peer, path

    def _force_bad(self, dev: str) -> None:
        """A plane went down: its paths go ASSUMED_BAD now. The agent writes
        the whole live entry; what the datapath wrote in between (an RTT
        sample) is lost, which costs nothing."""
        live_m = self.dp.map("mrc_live")
        now = time.monotonic_ns()
        for peer, path in self._plane_paths(dev):
            key = wire.path_key(peer.index, path.id)
            lv = wire.PathLive.unpack(live_m.lookup(key))
            if lv.state == wire.PathState.ASSUMED_BAD:
                # the datapath got there first; still say why it stays so
                self.log.append(event_record(self.cfg, peer.index, path.id, lv.state, lv.state,
                                             wire.EvReason.LINK_DOWN.label, "agent"))
                self.events += 1
                continue
            old = lv.state
            lv.state = wire.PathState.ASSUMED_BAD
            lv.bad_ns, lv.probe_ok = now, 0
            live_m.update(key, lv.pack())
            self.log.append(event_record(self.cfg, peer.index, path.id, old, lv.state,
                                         wire.EvReason.LINK_DOWN.label, "agent"))
            self.events += 1
        self.dirty = True
        self._slots(0)

    def _log_plane(self, dev: str, reason: str) -> None:
        live_m = self.dp.map("mrc_live")
        for peer, path in self._plane_paths(dev):
            lv = wire.PathLive.unpack(live_m.lookup(wire.path_key(peer.index, path.id)))
            self.log.append(event_record(self.cfg, peer.index, path.id, lv.state, lv.state, reason, "agent"))
            self.events += 1

    # ---- report
    def _report(self, _now: float) -> None:
        t = os.times()
        rep = {
            "time": time.time(),
            "probes_sent": self.prober.sent,
            "probe_errors": self.prober.errors,
            "probes_deferred": self.prober.deferred,
            "probe_budget": self.prober.budget,
            "peers_in_use": self.prober.in_use(),
            "probed_paths": len(self.prober.paths),
            "planes_down": sorted(self.prober.down),
            "events": self.events,
            "cpu_s": round(t.user + t.system, 3),
            "uptime_s": round(time.monotonic() - self.agent.started, 3),
        }
        p = self.agent.inst.run_dir / HEALTH_FILE
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(rep))
        os.replace(tmp, p)


@agentmod.subsystem
def setup(agent: agentmod.Agent) -> None:
    Health(agent)
