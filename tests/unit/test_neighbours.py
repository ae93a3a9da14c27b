"""The agent's neighbours task: which routes a kernel route event names."""

import ipaddress
import socket
import struct

from mrcctl.agent import neighbours
from mrcctl.datapath import netdev
from mrcctl.instance import topology


def rtmsg(family: int, dst_len: int, dst: bytes | None) -> bytes:
    body = struct.pack("=BBBBBBBBI", family, dst_len, 0, 0, 254, 3, 0, 1, 0)
    return body + (netdev.nla(topology.RTA_DST, dst) if dst is not None else b"")


def dst(msg: bytes):
    return neighbours._route_dst(msg, 0, len(msg))


def test_a_route_event_names_its_network():
    assert dst(rtmsg(socket.AF_INET, 16, bytes([10, 101, 0, 0]))) == ipaddress.ip_network("10.101.0.0/16")
    assert dst(rtmsg(socket.AF_INET6, 48, ipaddress.ip_address("fd01:1::").packed)) == \
        ipaddress.ip_network("fd01:1::/48")


def test_a_default_route_or_an_unreadable_one_may_concern_every_address():
    assert dst(rtmsg(socket.AF_INET, 0, None)) is None
    assert dst(rtmsg(socket.AF_INET, 24, None)) is None         # no RTA_DST
    assert dst(rtmsg(socket.AF_INET, 24, b"\x0a")) is None      # a broken one
    assert dst(rtmsg(socket.AF_INET, 24, bytes(4))[:6]) is None  # cut short
