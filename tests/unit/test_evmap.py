"""The EV map's pure parts: the pick that spreads a plane's EVs over the
hops the traces named, and the parser of the routers' answers."""

from __future__ import annotations

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


def _time_exceeded(ttl_tag: int, sport: int, dport: int) -> bytes:
    q_ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 56, ttl_tag, 0x4000, 1, 17, 0,
                       socket.inet_aton("10.100.0.2"), socket.inet_aton("10.100.1.2"))
    q = q_ip + struct.pack("!HHHH", sport, dport, 36, 0) + wire.encode_mrc_hdr(wire.MsgType.TRACE)
    icmp = bytes([11, 0, 0, 0, 0, 0, 0, 0]) + q
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(icmp), 0, 0, 63, 1, 0,
                     socket.inet_aton("10.150.1.2"), socket.inet_aton("10.100.0.2"))
    return ip + icmp


def test_parse_time_exceeded():
    assert parse_time_exceeded(_time_exceeded(TAG | 2, 49153, 4794), socket.AF_INET, 4794) == \
        ("10.100.0.2", "10.100.1.2", 49153, 2)
    assert parse_time_exceeded(_time_exceeded(7, 49153, 4794), socket.AF_INET, 4794)[3] is None
    assert parse_time_exceeded(_time_exceeded(TAG | 2, 49153, 53), socket.AF_INET, 4794) is None
    assert parse_time_exceeded(b"\x45" + bytes(10), socket.AF_INET, 4794) is None
