"""The PAWS guard (bpf/paws.h) on crafted frames through BPF_PROG_TEST_RUN,
against mrc_rx and mrc_rx_tc: a delivered inner TCP segment whose timestamp
is more than one tick older than the newest its flow delivered is lifted to
one tick below it, with a checksum that still verifies; anything else
leaves the receive path byte for byte as it came."""

from __future__ import annotations

import socket
import struct

import pytest

import unit_pkt as pkt
from unit_dp import UDP_PORT, XDP_PASS
from mrcctl.datapath import abi as wire
from test_health import health

pytestmark = pytest.mark.usefixtures("rx_hook")

NOP_NOP_TS = struct.pack("!BBBB", 1, 1, 8, 10)


def segment(tsval: int | None, *, sport: int = 5201, seq: int = 1000, payload: bytes = b"z" * 200,
            family: int = 4) -> bytes:
    """An inner TCP segment from the peer with a valid checksum: with NOP,
    NOP, timestamps (tsval, echo 7) as Linux lays them out, or none."""
    opts = NOP_NOP_TS + struct.pack("!II", tsval, 7) if tsval is not None else b""
    doff = 5 + len(opts) // 4
    hdr = struct.pack("!HHIIBBHHH", sport, 40001, seq, 1, doff << 4, 0x18, 65535, 0, 0) + opts
    if family == 4:
        src, dst = pkt.PEER_OVERLAY, pkt.LOCAL_OVERLAY
        pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack(
            "!BBH", 0, pkt.IPPROTO_TCP, len(hdr) + len(payload))
    else:
        src, dst = pkt.PEER_OVERLAY6, pkt.LOCAL_OVERLAY6
        pseudo = (socket.inet_pton(socket.AF_INET6, src) + socket.inet_pton(socket.AF_INET6, dst)
                  + struct.pack("!I3xB", len(hdr) + len(payload), pkt.IPPROTO_TCP))
    check = wire.inet_csum(pseudo + hdr + payload)
    hdr = hdr[:16] + struct.pack("!H", check) + hdr[18:]
    if family == 4:
        return pkt.ipv4(src, dst, pkt.IPPROTO_TCP, hdr + payload, ident=77)
    return pkt.ipv6(src, dst, pkt.IPPROTO_TCP, hdr + payload)


class Receiver:
    """Frames on path 0 with rising PSNs; returns what was delivered. The
    guard is on (overlay.paws_guard, the default) unless guard=False."""

    def __init__(self, dp, guard: bool = True):
        self.dp, self.psn = dp, 100
        dp.set_cfg(udp_port=UDP_PORT, flags=wire.MRC_CFG_PAWS_GUARD if guard else 0)

    def deliver(self, inner: bytes) -> bytes:
        self.psn += 1
        ret, out = self.dp.run_rx(pkt.mrc_frame(4, inner=inner, path_id=0, psn=self.psn))
        assert ret == XDP_PASS
        return out[14:]


def l3_len(ip: bytes) -> int:
    return 20 if ip[0] >> 4 == 4 else 40


def tsval_of(ip: bytes) -> int:
    t = l3_len(ip)
    return struct.unpack("!I", ip[t + 24:t + 28])[0]


def tcp_verifies(ip: bytes) -> bool:
    if ip[0] >> 4 == 4:
        seg = ip[20:struct.unpack("!H", ip[2:4])[0]]
        pseudo = ip[12:20] + struct.pack("!BBH", 0, pkt.IPPROTO_TCP, len(seg))
    else:
        seg = ip[40:40 + struct.unpack("!H", ip[4:6])[0]]
        pseudo = ip[8:40] + struct.pack("!I3xB", len(seg), pkt.IPPROTO_TCP)
    return wire.inet_csum(pseudo + seg) == 0


@pytest.mark.parametrize("family", [4, 6], ids=["inner-ipv4", "inner-ipv6"])
def test_an_older_timestamp_is_lifted_to_one_tick_below_the_newest(dp, family):
    rx = Receiver(dp)
    before = health(dp).paws_lifted
    for ts in (1000, 1005):                      # in order: untouched
        assert rx.deliver(segment(ts, family=family)) == segment(ts, family=family)
    out = rx.deliver(segment(1002, seq=2000, family=family))    # 3 ticks behind: PAWS would drop it
    assert tsval_of(out) == 1004
    assert tcp_verifies(out), "the inner TCP checksum must verify after the lift"
    sent, t = segment(1002, seq=2000, family=family), l3_len(out)
    # nothing else moved but the checksum
    assert out[:t + 16] + out[t + 18:t + 24] == sent[:t + 16] + sent[t + 18:t + 24]
    assert health(dp).paws_lifted - before == 1
    # one tick behind passes PAWS as it is; the newest stays 1005
    assert rx.deliver(segment(1004, family=family)) == segment(1004, family=family)
    assert tsval_of(rx.deliver(segment(1001, family=family))) == 1004
    assert health(dp).paws_lifted - before == 2


def test_the_newest_follows_the_flow_across_the_wrap(dp):
    rx = Receiver(dp)
    assert rx.deliver(segment(0xFFFFFFFE)) == segment(0xFFFFFFFE)
    assert rx.deliver(segment(3)) == segment(3)              # newer, modulo 2^32
    assert tsval_of(rx.deliver(segment(0xFFFFFFFF))) == 2    # 4 behind, across the wrap


def test_far_older_timestamps_are_left_to_paws(dp):
    """PAWS exists for segments a sequence wrap old: more than
    PAWS_GUARD_TICKS (1 s of Linux's millisecond ticks) is not lifted."""
    rx = Receiver(dp)
    rx.deliver(segment(50_000))
    assert rx.deliver(segment(48_000)) == segment(48_000)
    assert health(dp).paws_lifted == 0


def test_flows_are_kept_apart(dp):
    rx = Receiver(dp)
    rx.deliver(segment(9000, sport=5201))
    assert rx.deliver(segment(1000, sport=5202)) == segment(1000, sport=5202)   # its own clock
    assert tsval_of(rx.deliver(segment(990, sport=5202))) == 999
    assert tsval_of(rx.deliver(segment(8000, sport=5201))) == 8999


def test_pure_acks_keep_their_timestamps(dp):
    """PAWS lets a disordered pure ACK pass; lifting its timestamp would
    only make the data's receiver, to which it is echoed, measure its RTT
    short."""
    rx = Receiver(dp)
    rx.deliver(segment(5000))
    assert rx.deliver(segment(4990, payload=b"")) == segment(4990, payload=b"")
    assert health(dp).paws_lifted == 0


def test_segments_without_the_timestamp_layout_pass_untouched(dp):
    rx = Receiver(dp)
    rx.deliver(segment(5000))
    assert rx.deliver(segment(None)) == segment(None)
    # timestamps not first among the options (another stack's layout)
    other = bytearray(segment(4000))
    other[20 + 20:20 + 24] = struct.pack("!BBBB", 8, 10, 0, 0)[:2] + b"\x01\x01"
    assert rx.deliver(bytes(other)) == bytes(other)
    assert health(dp).paws_lifted == 0


def test_off_when_configured_off(dp):
    rx = Receiver(dp, guard=False)
    rx.deliver(segment(1005))
    assert rx.deliver(segment(1002)) == segment(1002)
    assert health(dp).paws_lifted == 0
