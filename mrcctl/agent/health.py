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
import re
import socket
import struct
import time
from dataclasses import dataclass, field

from ..datapath import abi as wire, auth, maps as dpmaps
from ..datapath.libbpf import RingBuffer
from ..datapath.netdev import NETDEV_XDP_ACT_NDO_XMIT, send_frames, xdp_features
from ..errors import MrcError
from ..instance import config as cfgmod
from ..instance.events import EventLog, event_record, events_path
from ..instance.slots import rebuild_slots
from ..instance.topology import poke
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
# A peer in use that sent nothing for SETTLED_NS and has every unit on its
# GOOD paths covered has its quiet GOOD paths probed when their evidence is
# QUIET_PATH_NS old, not probe_interval_ms (health.good_path_due)
SETTLED_NS = 40_000_000
QUIET_PATH_NS = 100_000_000
# A peer whose tx PSN has not moved for this long is idle: its GOOD paths
# are not probed (the datapath judges them from data as soon as it flows)
IN_USE_NS = 1_000_000_000
# ... its paths are read this often (one batch per peer); those found
# ASSUMED_BAD are probed every interval, in use or not, so that they are
# back in service when traffic returns
IDLE_LOOK_NS = 1_000_000_000
# ... found by reading every path's state (one batch read of mrc_live, 4 MiB
# at 1,024 peers x 32 paths: 17 ms of CPU) after anything that may have
# taken a path out of service, else this often
RESCAN_NS = 10_000_000_000
# While no peer is in use, the peers' tx PSNs are read this often (one
# batch read of mrc_peer_seq, 0.6 ms at 1,024 peers), not every interval
IDLE_PSN_NS = 100_000_000
# A tracked path whose next hop has no neighbour entry (a carrier loss
# flushed it, and nothing else resolves it for a peer that carries no
# traffic) has its next hop asked for this often until the kernel knows it
RESOLVE_NS = 1_000_000_000
# The agent's own event reason: the datapath cannot see probe silence, so
# enum mrc_ev_reason has no member for it.
PROBE_LOSS_REASON = "probe_loss"


# ------------------------------------------------------------------ probes


def probe_frame(path: wire.Path, path_id: int, udp_port: int, auth: bool = False, *,
                mtype: int = wire.MsgType.PROBE, ttl: int = 64, ip_id: int = 0) -> bytearray:
    """Ethernet + IP + UDP + MRC PROBE for one path, with the headers its
    data carries (the same fields for a fabric to hash); the MRC header's psn
    (probe sequence) and tx_ts are patched per probe (PROBE_PSN_OFF/TS_OFF
    from the header's end). With auth the MAC slot follows the header,
    signed per probe (sign_probe). An EV trace (agent/evmap.py) is the same
    frame of type TRACE with a small TTL (hop limit)."""
    mrc = wire.encode_mrc_hdr(mtype, path_id=path_id, psn=ip_id,
                              flags=wire.MRC_F_AUTH if auth else 0)
    if auth:
        mrc += bytes(wire.MRC_AUTH_LEN)
    udp = struct.pack("!HHHH", path.ev, udp_port, 8 + len(mrc), 0)
    if path.family == 4:
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp) + len(mrc), ip_id, 0x4000, ttl, 17, 0,
                         socket.inet_aton(path.saddr), socket.inet_aton(path.daddr))
        ip = ip[:10] + struct.pack("!H", wire.inet_csum(ip)) + ip[12:]
        etype = 0x0800
    else:
        ip = struct.pack("!IHBB16s16s", 6 << 28 | (path.ev & 0xFFFFF), len(udp) + len(mrc), 17, ttl,
                         socket.inet_pton(socket.AF_INET6, path.saddr),
                         socket.inet_pton(socket.AF_INET6, path.daddr))
        etype = 0x86DD
    eth = wire.mac_bytes(path.dmac) + wire.mac_bytes(path.smac) + struct.pack("!H", etype)
    return bytearray(eth + ip + udp + mrc)


_LIVE_AT = wire.PathLive.offsets()
_U32, _U64 = struct.Struct("=I"), struct.Struct("=Q")
_U32BE = struct.Struct("!I")
_PROBE_FIELDS = struct.Struct("!II")        # psn, tx_ts: adjacent in the MRC header
_NOT_ZERO = re.compile(b"[^\\x00]")


def sign_probe(frame: bytearray, key: bytes) -> None:
    """Write the MAC of a probe frame ending in MRC header + MAC slot
    (bpf/auth.h: the header and a zero inner block)."""
    n = len(frame) - wire.MRC_AUTH_LEN
    frame[n:] = auth.mac(key, bytes(frame[n - wire.MRC_HDR_LEN:n]))


# offsets of psn and tx_ts inside the MRC header (which ends the frame)
_PSN_OFF = wire.MRC_HDR_LEN - 4
_TS_OFF = wire.MRC_HDR_LEN - 8
# ... and of the nonce halves (seq0, fb_ts), counted from the frame's end
_NONCE_HI_END = wire.MRC_HDR_LEN - 16
_NONCE_LO_END = wire.MRC_HDR_LEN - 24


@dataclass(slots=True)
class ProbePath:
    peer: int
    path: int
    key: bytes
    plane: str
    frame: bytearray | None                   # built at the first probe (_send)
    ent: wire.Path | None = None              # the mrc_paths entry the frame is built from
    seq: int = 0
    sent: int = 0
    last_ns: int = 0                          # when it was last probed
    nonces: wire.ProbeNonce | None = None     # outstanding probes (mrc_probe_nonce)
    auth_key: bytes | None = None             # auth key toward the peer (mrc_auth), if on


@dataclass(slots=True)
class PeerActivity:
    psn: int = -1            # the tx PSN last seen (mrc_peer_seq)
    in_use_until: int = 0    # monotonic ns
    look_at: int = 0         # when an idle peer's paths are next read
    bad: list = field(default_factory=list)   # its ASSUMED_BAD paths at that look


_OUT = struct.Struct(wire.ProbeOut.fmt())
_OUT_KEYS = [wire.u32(i) for i in range(wire.MRC_PROBE_BATCH)]


class ProbeGen:
    """The probe generator (bpf/probe_gen.bpf.c) on the running instance:
    a round's probes written to mrc_probe_out, then sent by one
    BPF_PROG_TEST_RUN with BPF_F_TEST_XDP_LIVE_FRAMES per
    MRC_PROBE_BATCH, instead of one system call per probe."""

    def __init__(self, dp):
        from ..datapath.objects import load_probe_gen
        self.prog, self.out = load_probe_gen({n: dp.map(n) for n in ("mrc_peers", "mrc_paths", "mrc_auth")})
        self.gen = 0
        self.runs = 0

    def check(self) -> None:
        """Raise (OSError) unless this host runs live frames: a run that
        sends nothing (every frame XDP_DROP). A host may refuse them with
        EPERM though it runs XDP; the agent then sends probes itself from
        the start instead of at the first failed round."""
        self._run(0)

    def _run(self, n: int) -> None:
        """One live-frames run over mrc_probe_out's first n entries."""
        # a new run number restarts the generator at entry 0 (never 0:
        # the program's initial "last run")
        self.gen = self.gen % 0xFFFFFFFF + 1
        run = bytes(wire.MRC_PROBE_FRAME_MAX) + wire.ProbeRun(gen=self.gen, n=n).pack()
        self.prog.run_live(run, repeat=max(n, 1))

    def send(self, entries: list[bytes]) -> None:
        """struct mrc_probe_out entries, sent in order."""
        for at in range(0, len(entries), wire.MRC_PROBE_BATCH):
            chunk = entries[at:at + wire.MRC_PROBE_BATCH]
            self.out.update_batch(_OUT_KEYS[:len(chunk)], chunk)
            self._run(len(chunk))
            self.runs += 1

    def close(self) -> None:
        self.prog.close()
        self.out.close()


def good_path_due(now: int, interval_ns: int, flowing: bool, settled: bool, last_ack: int,
                  unacked: int, cov_ns: int) -> bool:
    """Whether a GOOD path of a peer in use is due a probe (ns throughout):
    when its evidence is an interval old (QUIET_PATH_NS once the peer is
    `settled`: it sent nothing for SETTLED_NS and every unit sent on its
    GOOD paths is covered - a burst that ended, not a flow stalled by a
    loss), unless it is merely on its way: the peer's evidence flows
    (`flowing`: a unit sent within an interval is covered) and the path's
    oldest outstanding unit is younger than an interval plus what its
    evidence normally takes (mrc_live.ev_cov_us).

    With many paths that is most of them: 64 paths at 3,000 units/s see a
    unit each per ~20 ms, covered 10-25 ms later; by the evidence's age
    alone one steady stream drew 1,100 probes/s, 180 with the exception.
    A path with nothing outstanding stays probed by its evidence's age:
    leaving those for 100 ms made fabric failovers slower (6 of 20 trials
    stalled over 10 ms, against 1; docs/resilience.md) - while the flow
    went on; after a burst, every path at the interval drew up to the whole
    probe budget for the second the peer stays in use (64 paths: 1,750
    probes after each 0.5 s burst)."""
    outstanding = unacked > last_ack
    if now - last_ack < (QUIET_PATH_NS if settled and not outstanding else interval_ns):
        return False
    return not (flowing and outstanding and now - unacked < interval_ns + cov_ns)


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
        # only peers in use or with a path out of service (_track): the
        # paths of thousands of idle peers have no record here
        self.by_peer: dict[int, list[ProbePath]] = {}
        self._seen: dict[int, tuple] = {}      # per tracked peer: (its entries' token, auth key)
        self._keys: dict[int, bytes] = {}
        self._auth_raw: bytes | None = None     # mrc_auth as last read
        self.activity = {peer.index: PeerActivity() for peer in self.cfg.peers}
        self._peers = {peer.index: peer for peer in self.cfg.peers}
        self._psns: list[int] | None = None        # mrc_peer_seq.psn by index, last interval
        self._busy: dict[int, PeerActivity] = {}    # peers in use
        self._idle_bad: dict[int, PeerActivity] = {}   # idle peers with ASSUMED_BAD paths
        self._look_at = 0
        self._psn_at = 0
        self._rescan_at = 0
        self.rescan = True        # read every path's state at the next look
        # (plane, peer address) of tracked paths never probed for want of a
        # next-hop MAC -> when to ask the kernel to resolve it again
        self.unresolved: dict[tuple[str, str], int] = {}
        self.paths_end = agent.paths_end()
        self.socks: dict[str, socket.socket] = {}
        self.down: set[str] = set()
        self.sent = 0
        self.errors = 0
        self.deferred = 0        # due probes the budget held back
        self.interval_ns = int(self.cfg.health.probe_interval_ms * 1e6)
        self.budget = self.cfg.health.probe_budget
        self.tokens = 0.0
        self.last_ns = 0
        self.generated = 0       # of self.sent, by the generator
        self.generator: ProbeGen | None = None
        self.gen_error = ""
        self.gen_planes: set[str] = set()    # planes the generator sends on
        if self.cfg.health.probe_sender == "xdp":
            try:
                self.generator = ProbeGen(agent.dp)
                self.generator.check()
            except (OSError, MrcError) as e:
                if self.generator is not None:
                    self.generator.close()
                    self.generator = None
                self.gen_error = str(e)
                log.warning("no probe generator (%s): probes go out one send each", e)
        self.refresh()

    @property
    def paths(self) -> list[ProbePath]:
        return [pp for pps in self.by_peer.values() for pp in pps]

    def refresh(self, _now: float = 0.0) -> None:
        """(Re)build the tracked peers' frames from mrc_paths: MACs may
        change (neighbours)."""
        self._keys = keys = self._auth_keys()
        self._gen_planes()
        for idx in list(self.by_peer):
            peer = self._peers[idx]
            token, ents, pkeys = self.agent.entries_of(peer)
            akey = keys.get(idx)
            if self._seen.get(idx) == (token, akey):
                continue                # nothing of the peer's changed
            self._seen[idx] = (token, akey)
            out: list[ProbePath] = []
            self._refresh_peer(peer, ents, pkeys, akey, {p.path: p for p in self.by_peer[idx]}, out)
            if len(out) > len(self.by_peer[idx]):
                # paths that had no MAC have one now: an idle peer's dead
                # ones are probed from the next look, not the next rescan
                # (the look that found them dead had nothing to probe, so
                # the peer left the idle peers with dead paths)
                self.rescan = True
            self.by_peer[idx] = out
        self.resolve()

    def peers_changed(self, cfg: cfgmod.Config, touched: set[int]) -> None:
        """The records of the peers removed or added go; an added peer is
        tracked once in use, as at the start."""
        for i in touched:
            old = self._peers.get(i)
            for rec in (self.by_peer, self._seen, self.activity, self._busy, self._idle_bad):
                rec.pop(i, None)
            if old is not None and self.unresolved:
                for path in old.paths:
                    self.unresolved.pop((path.plane.device, str(path.remote)), None)
        self.cfg = cfg
        self._peers = {peer.index: peer for peer in cfg.peers}
        for i in self._peers.keys() - self.activity.keys():
            self.activity[i] = PeerActivity()
        if self._psns is not None:
            self._psns = dpmaps.resized(self._psns, cfg.index_span, touched)
        self.paths_end = self.agent.paths_end()
        self._auth_raw = None       # an added peer's key
        self.rescan = True

    def resolve(self) -> None:
        """Ask the kernel for the next hop of every tracked path that has
        no MAC and no frame yet (a datagram through the plane makes it run
        ARP/ND): without this, an idle peer whose neighbour entries a
        carrier loss flushed is never probed, so never recovers, until
        traffic happens to resolve them."""
        if not self.unresolved:
            return
        now = time.monotonic_ns()
        for key, due in self.unresolved.items():
            if now >= due and key[0] not in self.down:
                poke(*key)
                self.unresolved[key] = now + RESOLVE_NS

    def _gen_planes(self) -> None:
        """The planes whose driver transmits frames redirected to it
        (NETDEV_XDP_ACT_NDO_XMIT), read again every refresh: a veth says
        so only while its peer runs XDP, and a redirect to a device that
        cannot send is dropped without a word to the sender."""
        if self.generator is None:
            self.gen_planes = set()
            return
        feats = xdp_features() or {}
        planes = set()
        for plane in self.cfg.planes:
            try:
                idx = socket.if_nametoindex(plane.device)
            except OSError:
                continue
            if feats.get(idx, 0) & NETDEV_XDP_ACT_NDO_XMIT:
                planes.add(plane.device)
        if planes != self.gen_planes:
            log.info("probe generator on %s", ", ".join(sorted(planes)) or "no plane")
        self.gen_planes = planes

    def _track(self, peer) -> list[ProbePath]:
        """Start keeping probe records for a peer's paths: it is in use, or
        one of its paths is out of service."""
        token, ents, pkeys = self.agent.entries_of(peer)
        akey = self._keys.get(peer.index)
        out: list[ProbePath] = []
        self._refresh_peer(peer, ents, pkeys, akey, {}, out)
        self._seen[peer.index] = (token, akey)
        self.by_peer[peer.index] = out
        self.resolve()
        return out

    def _refresh_peer(self, peer, ents, pkeys, akey, old: dict, out: list) -> None:
        for path in peer.paths:
            if path.id >= len(ents):
                continue
            ent, key = ents[path.id], pkeys[path.id]
            prev = old.get(path.id)
            if ent.dmac == "00:00:00:00:00:00":
                # Neighbour unresolved (the peer's link flapped): keep
                # probing the last MAC known. A path out of the spray
                # table carries no traffic that would resolve it, and
                # the probes are what bring it back.
                if prev is not None:
                    out.append(prev)
                else:
                    self.unresolved.setdefault((path.plane.device, str(path.remote)), 0)
                continue
            if self.unresolved:
                self.unresolved.pop((path.plane.device, str(path.remote)), None)
            if prev is not None and (prev.ent is ent or prev.ent == ent) and prev.auth_key == akey:
                out.append(prev)        # unchanged: no new frame
                continue
            # the frame is built at the path's first probe: most paths of
            # thousands of idle peers are never probed
            pp = ProbePath(peer.index, path.id, key, path.plane.device, None, ent, auth_key=akey)
            if prev is not None:
                pp.seq, pp.sent, pp.nonces, pp.last_ns = prev.seq, prev.sent, prev.nonces, prev.last_ns
            out.append(pp)
            if path.plane.device not in self.socks:
                self._open(path.plane.device)

    def _auth_keys(self) -> dict[int, bytes]:
        """The keys the loader wrote (mrc_auth): the agent signs with what
        the datapath checks, and never reads the key files itself."""
        out = {}
        try:
            m = self.agent.dp.map("mrc_auth")
        except (KeyError, MrcError):      # a datapath before issue #13.9
            return out
        raw = m.read_raw(0, self.cfg.index_span)
        if raw == self._auth_raw:
            return self._keys          # unchanged: not unpacked again every second
        self._auth_raw = raw
        vs = m.value_size
        raws = [raw[i:i + vs] for i in range(0, len(raw), vs)]
        for peer in self.cfg.peers:
            raw = raws[peer.index] if peer.index < len(raws) else None
            k = wire.AuthKey.unpack(raw).key if raw else None
            if k is not None:
                out[peer.index] = k
        return out

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
        PROBE_LOSS probes unanswered.

        What it costs does not grow with idle peers: one batch read of the
        peers' tx PSNs per interval (compared as a list, not peer by peer),
        the paths of the peers in use, and once per IDLE_LOOK_NS one read
        of every path's state, scanned as bytes for the paths not GOOD."""
        dp = self.agent.dp
        live_m = dp.map("mrc_live")
        now = time.monotonic_ns()
        dt = now - self.last_ns if self.last_ns else self.interval_ns
        self.last_ns = now
        # a bucket of at most one interval's worth (at least one probe)
        self.tokens = min(max(1.0, self.budget * self.interval_ns / 1e9), self.tokens + self.budget * dt / 1e9)
        # with no peer in use, the PSNs are read every IDLE_PSN_NS, not
        # every interval: a peer that starts sending is in use that much
        # later (its paths are judged by the datapath from its first unit)
        moved = []
        if self._busy or now >= self._psn_at:
            self._psn_at = now + IDLE_PSN_NS
            moved = self._psn_moved()
        for idx in moved:
            act = self.activity.get(idx)
            if act is None:
                continue
            psn = self._psns[idx]
            # (a peer never sent to is not in use at the first look:
            # thousands of configured, absent peers)
            if act.psn >= 0 or psn:
                act.in_use_until = now + IN_USE_NS
                self._busy[idx] = act
            act.psn = psn
        look = now >= self._look_at
        looked = set()
        if look:
            self._look_at = now + IDLE_LOOK_NS
            # idle peers to read at this look: those that had a path
            # ASSUMED_BAD at the last one, and, after anything that may
            # have taken a path out of service (a datapath event, the
            # agent's own retirement, a link change) or every RESCAN_NS,
            # those with a path not GOOD in one read of every path's state
            looked = set(self._idle_bad)
            if self.rescan or now >= self._rescan_at:
                self.rescan = False
                self._rescan_at = now + RESCAN_NS
                looked |= self._not_good_peers(live_m)
        bad: list[ProbePath] = []
        stale: list[ProbePath] = []
        silent = []
        for idx, act in list(self._busy.items()):
            if now >= act.in_use_until:
                del self._busy[idx]
                looked.add(idx)     # idle from now: read as at a look
                continue
            self._evaluate(idx, act, True, now, live_m, bad, stale, silent)
        for idx in looked:
            act = self.activity.get(idx)
            if act is not None and idx not in self._busy:
                self._evaluate(idx, act, False, now, live_m, bad, stale, silent)
        if not look:
            # between looks, the dead paths of idle peers found at the last one
            for act in self._idle_bad.values():
                bad += [pp for pp in act.bad if now - pp.last_ns >= self.interval_ns]
        allowed = int(self.tokens)
        due = bad + stale
        if len(due) > allowed:
            # least recently probed first: out-of-service paths probed every
            # interval must not starve the silent GOOD ones, whose silence
            # is only found out by probing them
            self.deferred += len(due) - allowed
            due.sort(key=lambda pp: pp.last_ns)
        self._send_all(due[:allowed], now)
        return silent

    def _psn_moved(self) -> list[int]:
        """Peer indices whose tx PSN (mrc_peer_seq.psn, the first u64 of
        each entry) changed since the last interval: every peer the first
        time."""
        old, self._psns = self._psns, self.agent.dp.tx_psns(self.cfg.index_span)
        return dpmaps.changed(self._psns, old)

    def _not_good_peers(self, live_m) -> set[int]:
        """Peers with a path whose mrc_live.state is not GOOD, from one read
        of the whole map: the state's low byte of every entry, scanned for
        a non-zero byte (GOOD is 0, the states fit a byte)."""
        end = self.paths_end
        if not end:
            return set()
        vs = live_m.value_size
        states = live_m.read_raw(0, end)[_LIVE_AT["state"]::vs]
        if not states.strip(b"\0"):
            return set()
        shift = self.agent.dp.sizing.path_shift
        return {m.start() >> shift for m in _NOT_ZERO.finditer(states)}

    def _evaluate(self, idx: int, act: PeerActivity, in_use: bool, now: int, live_m,
                  bad: list, stale: list, silent: list) -> None:
        """One peer's paths: which are due a probe (bad, stale), and which
        GOOD ones left their probes unanswered (silent)."""
        peer = self._peers.get(idx)
        if peer is None:
            return
        dp = self.agent.dp
        lives = live_m.lookup_range(dp.path_idx(peer.index, 0), len(peer.paths))
        pps = self.by_peer.get(peer.index)
        if pps is None:
            if not in_use and all(_U32.unpack_from(raw, _LIVE_AT["state"])[0] == wire.PathState.GOOD
                                  for raw in lives):
                return          # idle, every path GOOD: nothing to probe
            pps = self._track(peer)
        act.bad = []
        flowing = in_use and now - dp.ack_max_ns(peer.index) < self.interval_ns
        settled = in_use and now - (act.in_use_until - IN_USE_NS) >= SETTLED_NS and not any(
            _U32.unpack_from(raw, _LIVE_AT["state"])[0] == wire.PathState.GOOD
            and _U64.unpack_from(raw, _LIVE_AT["unacked_ns"])[0]
            > _U64.unpack_from(raw, _LIVE_AT["last_ack_ns"])[0] for raw in lives)
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
            # GOOD: only for a peer in use
            if not in_use:
                continue
            last_ack = _U64.unpack_from(raw, _LIVE_AT["last_ack_ns"])[0]
            if not good_path_due(now, self.interval_ns, flowing, settled, last_ack,
                                 _U64.unpack_from(raw, _LIVE_AT["unacked_ns"])[0],
                                 _U32.unpack_from(raw, _LIVE_AT["ev_cov_us"])[0] * 1000):
                continue
            if ((pp.seq - _U32.unpack_from(raw, _LIVE_AT["probe_seq"])[0]) & 0xFFFFFFFF) >= PROBE_LOSS \
                    and pp.sent >= PROBE_LOSS and now - last_ack > PROBE_STALE_NS:
                silent.append(pp)
            stale.append(pp)
        if in_use or not act.bad:
            self._idle_bad.pop(idx, None)
        else:
            self._idle_bad[idx] = act

    def _send_all(self, pps: list[ProbePath], now: int) -> None:
        """Send one round's probes: their nonces recorded in
        mrc_probe_nonce first (one batch write; only a reply echoing its
        probe's nonce counts, issue #13.8), then out through the probe
        generator (one live-frames test run per MRC_PROBE_BATCH probes)
        on the planes whose driver transmits redirected XDP frames, one
        AF_PACKET send per probe on the others."""
        if not pps:
            return
        self.tokens -= len(pps)
        rnd = os.urandom(8 * len(pps))
        keys, vals = [], []
        for k, pp in enumerate(pps):
            pp.last_ns = now
            pp.seq = (pp.seq + 1) & 0xFFFFFFFF
            # an unpredictable nonce per probe, known to rx before it leaves
            nonce = int.from_bytes(rnd[8 * k:8 * k + 8], "big") or 1
            if pp.nonces is None:
                pp.nonces = wire.ProbeNonce()
            pp.nonces.add(pp.seq, nonce)
            keys.append(pp.key)
            vals.append(pp.nonces.pack())
        nonce_m = self.agent.dp.map("mrc_probe_nonce")
        try:
            nonce_m.update_batch(keys, vals)
        except OSError:
            # one at a time, to know which probes may go (a full hash
            # refuses new entries)
            ok = []
            for pp, key, val in zip(pps, keys, vals):
                try:
                    nonce_m.update(key, val)
                    ok.append(pp)
                except OSError:
                    self.errors += 1
            pps = ok
        gen, rest = [], []
        for pp in pps:
            (gen if pp.plane in self.gen_planes else rest).append(pp)
        if gen and not self._generate(gen):
            rest += gen
        if rest:
            self._send_packets(rest)

    def _generate(self, pps: list[ProbePath]) -> bool:
        """The probes out through the generator; False if it failed (it is
        then off until the agent restarts, the caller sends them itself)."""
        out = []
        for pp in pps:
            if pp.frame is None:
                pp.frame = probe_frame(pp.ent, pp.path, self.cfg.udp_port, pp.auth_key is not None)
            f = pp.frame
            off = len(f) - wire.MRC_HDR_LEN - (wire.MRC_AUTH_LEN if pp.auth_key else 0)
            out.append(_OUT.pack(pp.ent.ifindex, len(f), off, pp.peer, pp.seq, pp.nonces.nonce[pp.seq % wire.MRC_PROBE_RING],
                                 bytes(f)))
        try:
            self.generator.send(out)
        except OSError as e:
            log.error("the probe generator failed (%s): probes go out one send each", e)
            self.gen_error = str(e)
            self.generator = None
            self.gen_planes = set()
            return False
        for pp in pps:
            pp.sent += 1
        self.sent += len(pps)
        self.generated += len(pps)
        return True

    def _send_packets(self, pps: list[ProbePath]) -> None:
        """Probes out of their planes' AF_PACKET sockets, completed here as
        the generator completes them (sequence, send time, nonce, MAC):
        one sendmmsg per plane. Through the host's egress path (qdisc, tc,
        what tcpdump sees), as the data goes."""
        by_plane: dict[str, list[ProbePath]] = {}
        for pp in pps:
            if pp.frame is None:
                pp.frame = probe_frame(pp.ent, pp.path, self.cfg.udp_port, pp.auth_key is not None)
            f = pp.frame
            n = len(f) - (wire.MRC_AUTH_LEN if pp.auth_key else 0)
            nonce = pp.nonces.nonce[pp.seq % wire.MRC_PROBE_RING]
            _PROBE_FIELDS.pack_into(f, n - _PSN_OFF, pp.seq, (time.monotonic_ns() // 1000) & 0xFFFFFFFF)
            _U32BE.pack_into(f, n - _NONCE_HI_END, nonce >> 32)
            _U32BE.pack_into(f, n - _NONCE_LO_END, nonce & 0xFFFFFFFF)
            if pp.auth_key:
                sign_probe(f, pp.auth_key)
            by_plane.setdefault(pp.plane, []).append(pp)
        for plane, group in by_plane.items():
            # a refused frame (plane down, queue full) leaves a sequence
            # gap, which restarts recovery
            refused = send_frames(self.socks[plane].fileno(), [bytes(pp.frame) for pp in group])
            self.errors += len(refused)
            self.sent += len(group) - len(refused)
            for pp in group:
                pp.sent += 1
            for k in refused:
                group[k].sent -= 1

    def close(self) -> None:
        for s in self.socks.values():
            s.close()
        if self.generator is not None:
            self.generator.close()


# ------------------------------------------------------------------ the subsystem

class Health:
    def __init__(self, agent: agentmod.Agent):
        self.agent = agent
        self.cfg = agent.cfg
        self.dp = agent.dp
        self.log = EventLog(events_path(agent.inst))
        try:
            self.dp.ctl()  # loaded now rather than at the first link-down
        except Exception as e:  # noqa: BLE001 - the agent's other work goes on; retire() retries
            log.error("mrc_ctl not loaded (%s): retirements by the agent wait for it", e)
        self.prober = Prober(agent)
        self.dirty = True
        # the peers whose slot tables are to be rebuilt (None: every peer):
        # one rebuild reads a peer's paths in three system calls, every
        # peer's at 1,024 peers took 0.6 s of CPU, for every datapath event
        self.dirty_peers: set[int] | None = None
        self.peer_by_index = {p.index: p for p in self.cfg.peers}
        self.admin_seen: bytes | None = None
        self.log_mark: tuple | None = ()   # events.jsonl's (inode, size, mtime) at the last mrc_admin read
        self.admin_at = 0.0
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
        agent.on_peers(self._peers_changed)

    def _peers_changed(self, cfg: cfgmod.Config, touched: set[int]) -> None:
        self.cfg = cfg
        self.prober.peers_changed(cfg, touched)
        self.peer_by_index = {p.index: p for p in cfg.peers}
        # the slot tables of added peers are add_peer's; a look at mrc_admin
        # (now longer or shorter) finds them changed anyway
        for i in touched:
            self._changed(i)
        self.admin_at = 0.0

    def _probe(self, now: float) -> None:
        silent = self.prober.tick(now)
        if silent:
            self._retire_silent(silent)

    def _retire(self, peer: int, path: int) -> bool:
        """GOOD -> ASSUMED_BAD by the datapath (bpf/ctl.bpf.c). Without the
        mrc_ctl program (an object that does not fit the running maps) the
        path stays as it is: the transmit judge still retires a silent path
        that carries traffic, and the agent never writes mrc_live itself."""
        try:
            return self.dp.retire(peer, path)
        except Exception as e:  # noqa: BLE001
            log.error("retiring path %d of peer %d: %s", path, peer, e)
            return False

    def _retire_silent(self, silent: list[ProbePath]) -> None:
        by_peer: dict[int, list[ProbePath]] = {}
        for pp in silent:
            by_peer.setdefault(pp.peer, []).append(pp)
        for peer_idx, pps in by_peer.items():
            peer = self.cfg.peer_at(peer_idx)
            if peer is None:
                continue
            good = sum(self.dp.usable(peer_idx, path.id) for path in peer.paths)
            for pp in pps:
                if good - 1 < max(peer.min_active, 1):
                    break   # never retire the last usable paths on probe silence alone
                # the datapath's own compare-and-swap (bpf/ctl.bpf.c): false
                # if the path is no longer GOOD, and then there is nothing to log
                if not self._retire(peer_idx, pp.path):
                    continue
                good -= 1
                self.log.append(event_record(self.cfg, peer_idx, pp.path, wire.PathState.GOOD,
                                             wire.PathState.ASSUMED_BAD, PROBE_LOSS_REASON, "agent"))
                self.events += 1
                self._changed(peer_idx)
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
        self._changed(ev.peer)

    def _changed(self, peer: int | None = None) -> None:
        """A path of `peer` (None: of any peer) may have changed state or
        admin: its slot table is rebuilt, every path's state read again."""
        self.dirty = True
        self.prober.rescan = True
        if peer is None:
            self.dirty_peers = None
        elif self.dirty_peers is not None:
            self.dirty_peers.add(peer)

    def _slots(self, now: float) -> None:
        # The operator's deny/allow changes mrc_admin only; the slot tables
        # (whose one writer is this agent) follow here. `mrcctl path
        # deny|allow` logs an event for every path it changes, so the map
        # is read when events.jsonl changed, else every RESCAN_NS (a read
        # of 32,768 entries a second was 1.6 % of a core).
        try:
            st = os.stat(self.log.path)
            mark = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            mark = None
        if not self.dirty and mark == self.log_mark and now < self.admin_at:
            return
        self.log_mark, self.admin_at = mark, now + RESCAN_NS / 1e9
        admin_m = self.dp.map("mrc_admin")
        # one batch read of the map up to the last peer's paths, compared
        # as bytes (a second's worth of 131,072 single lookups at 4,096
        # peers x 32 paths was most of the idle agent; one read per peer
        # still 2 % of a core at 1,024)
        admin = admin_m.read_raw(0, self.prober.paths_end)
        if admin != self.admin_seen:
            old, self.admin_seen = self.admin_seen, admin
            if old is None:
                self._changed()
            else:
                # (after a change of peers the reads differ in length: the
                # slices of the peers beyond the shorter one differ)
                vs = admin_m.value_size
                for peer in self.cfg.peers:
                    at = self.dp.path_idx(peer.index, 0) * vs
                    end = at + len(peer.paths) * vs
                    if old[at:end] != admin[at:end]:
                        self._changed(peer.index)
        if self.dirty:
            which = self.dirty_peers
            self.dirty, self.dirty_peers = False, set()
            rebuild_slots(self.dp, self.cfg, None if which is None else
                          [self.peer_by_index[i] for i in sorted(which) if i in self.peer_by_index])

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
            # While the plane was down its paths were skipped, so an idle
            # peer left the prober's list of peers with dead paths: look
            # again now, not at the next RESCAN_NS, or recovery of an idle
            # peer waits up to 10 s for its first probe.
            self.prober.rescan = True
            self.prober.resolve()       # next hops the carrier loss flushed, asked for now
            if not initial:
                self._log_plane(dev, wire.EvReason.LINK_UP.label)

    def _plane_paths(self, dev: str):
        for peer in self.cfg.peers:
            for path in peer.paths:
                if path.plane.device == dev:
                    yield peer, path

    def _force_bad(self, dev: str) -> None:
        """A plane went down: its paths go ASSUMED_BAD now, by the
        datapath's compare-and-swap (bpf/ctl.bpf.c): what the programs
        wrote to the live entry stays."""
        live_m = self.dp.map("mrc_live")
        for peer, path in self._plane_paths(dev):
            if self._retire(peer.index, path.id):
                old, new = wire.PathState.GOOD, wire.PathState.ASSUMED_BAD
            else:
                # the datapath got there first; still say why it stays so
                lv = wire.PathLive.unpack(live_m.lookup(self.dp.path_key(peer.index, path.id)))
                old = new = lv.state
            self.log.append(event_record(self.cfg, peer.index, path.id, old, new,
                                         wire.EvReason.LINK_DOWN.label, "agent"))
            self.events += 1
        self._changed()
        self._slots(0)

    def _log_plane(self, dev: str, reason: str) -> None:
        live_m = self.dp.map("mrc_live")
        for peer, path in self._plane_paths(dev):
            lv = wire.PathLive.unpack(live_m.lookup(self.dp.path_key(peer.index, path.id)))
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
            "probes_generated": self.prober.generated,
            "probe_generator_planes": sorted(self.prober.gen_planes),
            "probe_generator_error": self.prober.gen_error,
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
