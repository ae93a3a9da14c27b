"""The EV map's pure parts: the pick that spreads a plane's EVs over the
hops the traces named, and the parser of the routers' answers."""

from __future__ import annotations

import json
import socket
import struct

from mrcctl.agent.evmap import TAG, balance, parse_time_exceeded
from mrcctl.datapath import abi as wire

S0, S1 = ("spine0",), ("spine1",)


def test_a_lumpy_plane_is_spread_and_keeps_what_it_can():
    # 3:1 over the spines; two more ports known, one on each spine
    sigs = {1: S0, 2: S0, 3: S0, 4: S1, 5: S1, 6: S0}
    out = balance([1, 2, 3, 4], sigs)
    assert sorted(sigs[p][0] for p in out) == ["spine0", "spine0", "spine1", "spine1"]
    assert out[3] == 4 and out[:2] == [1, 2] and out[2] == 5     # one path moved, the others kept


def test_an_even_plane_and_one_without_answers_stay_as_configured():
    assert balance([1, 2, 3, 4], {1: S0, 2: S1, 3: S0, 4: S1, 5: S0, 6: S1}) == [1, 2, 3, 4]
    assert balance([1, 2, 3, 4], {p: (None,) for p in range(1, 9)}) == [1, 2, 3, 4]
    # all on one spine, no other port known: nothing to gain
    assert balance([1, 2], {1: S0, 2: S0, 3: S0}) == [1, 2]


def test_an_unanswered_path_keeps_its_port_and_deeper_hops_count_next():
    sigs = {1: ("a", "x"), 2: ("a", "x"), 3: None, 4: ("b", "y"), 5: ("a", "z")}
    out = balance([1, 2, 3], sigs)
    assert out[2] == 3                       # no answer: left alone
    assert {sigs[p] for p in out[:2]} in ({("a", "x"), ("b", "y")}, {("a", "z"), ("b", "y")})


def _time_exceeded(ttl_tag: int, sport: int, dport: int = 4794, src: str = "10.100.0.2",
                   dst: str = "10.100.1.2") -> bytes:
    """An IPv4 ICMP time exceeded from a spine to src, quoting a trace from
    src (its IP ID ttl_tag) to dst."""
    q_ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 56, ttl_tag, 0x4000, 1, 17, 0,
                       socket.inet_aton(src), socket.inet_aton(dst))
    q = q_ip + struct.pack("!HHHH", sport, dport, 36, 0) + wire.encode_mrc_hdr(wire.MsgType.TRACE)
    icmp = bytes([11, 0, 0, 0, 0, 0, 0, 0]) + q
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(icmp), 0, 0, 63, 1, 0,
                     socket.inet_aton("10.150.1.2"), socket.inet_aton(src))
    return ip + icmp


def test_parse_time_exceeded():
    assert parse_time_exceeded(_time_exceeded(TAG | 2, 49153, 4794), socket.AF_INET, 4794) == \
        ("10.100.0.2", "10.100.1.2", 49153, 2)
    assert parse_time_exceeded(_time_exceeded(7, 49153, 4794), socket.AF_INET, 4794)[3] is None
    assert parse_time_exceeded(_time_exceeded(TAG | 2, 49153, 53), socket.AF_INET, 4794) is None
    assert parse_time_exceeded(b"\x45" + bytes(10), socket.AF_INET, 4794) is None


# ------------------------------------------------------------ the mapper's pace

def _cfg(peers: int):
    from mrcctl.instance import config as cfgmod
    text = '[overlay]\naddress = "172.31.0.1/16"\n[[plane]]\ndevice = "p0"\n[[plane]]\ndevice = "p1"\n'
    for i in range(peers):
        text += (f'[[peer]]\nname = "n{i}"\noverlay = "172.31.{1 + i // 250}.{1 + i % 250}"\n'
                 f'[peer.underlay]\np0 = "10.0.{i // 250}.{1 + i % 250}"\np1 = "10.1.{i // 250}.{1 + i % 250}"\n')
    return cfgmod.parse(text)


IFX = {"p0": 1_000_000, "p1": 1_000_001}     # no such devices: the traces go nowhere


class _Agent:
    """What EvMapper uses of the agent: its config, the gateways the
    neighbours task found, the peers' mrc_paths entries, and the map the
    finished plane writes to (kept here: this is the mapper's pacing, not
    the datapath)."""

    def __init__(self, cfg, run_dir):
        from types import SimpleNamespace
        self.cfg = cfg
        self.inst = SimpleNamespace(run_dir=run_dir)
        self.gateways = {p.index: {IFX["p0"]: "10.0.255.254", IFX["p1"]: "10.1.255.254"} for p in cfg.peers}
        self.dp = SimpleNamespace(map=lambda name: self)
        self.written: dict = {}
        self.ents = {}
        for peer in cfg.peers:
            self.ents[peer.index] = [wire.Path(ifindex=IFX[x.plane.device], ev=x.ev, plane=x.plane.index,
                                               smac="02:00:00:00:00:01", dmac="02:00:00:00:00:02",
                                               saddr="10.9.9.9", daddr=str(x.remote))
                                     for x in peer.paths]

    def add_reader(self, fd, fn):
        pass

    def add_task(self, name, period, fn):
        pass

    def on_peers(self, fn):
        pass

    def entries_of(self, peer):
        return 0, self.ents[peer.index], [(peer.index, x.id) for x in peer.paths]

    def update(self, key, raw):
        self.written[key] = wire.Path.unpack(raw).ev


def test_thousands_of_peers_are_mapped_a_bounded_number_at_a_time(tmp_path):
    from mrcctl.agent import evmap
    cfg = _cfg(1000)
    agent = _Agent(cfg, tmp_path)
    m = evmap.EvMapper(agent)
    m.tick(100.0)
    # 2 planes per peer: 32 peers in flight, the other 968 queued
    assert len(m.active) == evmap.ACTIVE and len(m.waiting) == 1000 - evmap.ACTIVE // 2
    assert len(m.by_trace) == evmap.ACTIVE * 4 * cfg.ev_map.candidates
    sent = sum(sum(j.tries.values()) for j in m.active.values())
    assert sent <= evmap.TRACES_PER_S / 10          # the first tick's tokens
    # the spines answer every trace of peer 0's plane p0: its configured EVs
    # hash 3:1, the candidates alternate
    job = m.active[(0, IFX["p0"])]
    spine = {port: f"10.150.{k % 2}.2" for k, port in enumerate(job.ports)}
    for port in job.configured[:3]:
        spine[port] = "10.150.0.2"
    for port in job.ports:
        m.answer(_time_exceeded(evmap.TAG | 2, port, src="10.9.9.9", dst=job.daddr), socket.AF_INET, spine[port], cfg.udp_port)
    assert job.done and (0, IFX["p0"]) not in m.active
    moved = {key: ev for key, ev in agent.written.items()}
    assert len(moved) == 1 and sorted(spine[p] for p in job.result.values()).count("10.150.0.2") == 2
    # an answer naming another peer's address, or one no trace asked, changes nothing
    other = m.active[(1, IFX["p0"])]
    m.answer(_time_exceeded(evmap.TAG | 2, other.ports[0], src="10.9.9.9", dst="10.0.0.99"), socket.AF_INET,
             "10.150.0.2", cfg.udp_port)
    assert not other.answers
    # the freed slot goes to the next peer in line on the next tick (all of
    # its planes: one peer's worth above ACTIVE at most)
    m.tick(100.05)
    assert len(m.active) == evmap.ACTIVE + 1 and len(m.waiting) == 1000 - evmap.ACTIVE // 2 - 1
    # unanswered planes end after TRIES rounds, RETRY_S apart at least,
    # unchanged; TRACES_PER_S paces them (65 planes x 12 ports a round)
    for k in range(1, int(20 / evmap.PERIOD_S)):
        m.tick(100.05 + k * evmap.PERIOD_S)
    assert len(agent.written) == 1
    done = [j for j in m.jobs.values() if j.done]
    traces = sum(sum(j.tries.values()) for j in m.jobs.values())
    assert traces <= evmap.TRACES_PER_S * 20.1
    assert len(done) > evmap.ACTIVE and all(not j.result or j.result == dict(zip(j.pids, j.configured))
                                           for j in done if j is not job)
    # evmap.json: written, at most once a second
    doc = json.loads((tmp_path / evmap.EVMAP_FILE).read_text())
    assert doc["n0"]["1000000"]["state"] == "mapped"
