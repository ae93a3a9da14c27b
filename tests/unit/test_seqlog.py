"""The failover benchmark's sequence log (bpf/seqlog.bpf.c, read by
scripts/tcp_holes.py): crafted frames through BPF_PROG_TEST_RUN, then the
records; and the analysis on a log whose stall has a known cause."""

from __future__ import annotations

import struct
import sys

import pytest

import unit_pkt as pkt
from unit_dp import BPF_DIR, need_root
from mrcctl.datapath import abi as wire
from mrcctl.datapath.libbpf import BpfObject

sys.path.insert(0, str(BPF_DIR.parent / "scripts"))
import tcp_holes  # noqa: E402

TC_ACT_UNSPEC = 0xFFFFFFFF   # -1 as test_run returns it
TX_REC, RX_REC = "=QIIIIHB5x", "=QII"


@pytest.fixture
def seqlog(bpf_objects):
    need_root()
    obj = BpfObject.open(str(BPF_DIR / "seqlog.bpf.o"))
    obj.load()
    yield obj
    obj.close()


def count(obj, d: int) -> int:
    return int.from_bytes(obj.map("seqlog_n").lookup(struct.pack("=I", d)), "little")


def test_tx_records_each_tcp_unit_and_passes_everything(seqlog):
    prog = seqlog.program("seqlog_tx_prog")
    unit = pkt.mrc_frame(inner=pkt.inner_ip(1000, pkt.IPPROTO_TCP, seq=0xFFFFFF00), psn=77,
                         flags=wire.MRC_F_HEDGE, sport=49153)
    ack = pkt.mrc_frame(inner=pkt.inner_ip(0, pkt.IPPROTO_TCP, seq=5), psn=78)
    udp = pkt.mrc_frame(inner=pkt.inner_ip(500), psn=79)
    probe = pkt.mrc_frame(type=wire.MsgType.PROBE, psn=80)
    for frame in (unit, ack, udp, probe):
        ret, out, _ = prog.test_run(frame)
        assert ret == TC_ACT_UNSPEC and out == frame          # never changes a packet
    assert count(seqlog, 0) == 1                               # only the unit with payload
    ts, seq, ln, psn, _ifx, ev, flags = struct.unpack(TX_REC, seqlog.map("seqlog_tx").lookup(bytes(4)))
    assert (seq, ln, psn, ev, flags) == (0xFFFFFF00, 1000, 77, 49153, wire.MRC_F_HEDGE) and ts > 0


def test_rx_records_decapsulated_segments(seqlog):
    prog = seqlog.program("seqlog_rx_prog")
    seg = pkt.eth(pkt.OUR_MAC, pkt.PEER_MAC, pkt.ETH_P_IP) + pkt.inner_ip(1448, pkt.IPPROTO_TCP, seq=4242)
    ack = pkt.eth(pkt.OUR_MAC, pkt.PEER_MAC, pkt.ETH_P_IP) + pkt.inner_ip(0, pkt.IPPROTO_TCP, seq=1)
    for frame in (seg, ack, pkt.mrc_frame()):
        assert prog.test_run(frame)[0] == TC_ACT_UNSPEC
    assert count(seqlog, 1) == 1
    _ts, seq, ln = struct.unpack(RX_REC, seqlog.map("seqlog_rx").lookup(bytes(4)))
    assert (seq, ln) == (4242, 1448)


def test_holes_finds_a_hole_that_was_never_resent():
    """A unit a millisecond from 1.99 s on, the fault at 2 s. The unit sent
    at 2.005 s (on EV 49153) is lost and resent only at 2.040 s, while a
    later unit is resent at 2.010 s: the report names the hole, its two
    sends, the 36 ms the receiver stood still and the one other resend."""
    ms = 1_000_000
    fault = 2000 * ms
    tx, rx = [], []
    for i in range(100):
        t, seq = 1990 * ms + i * ms, 10_000 + 1000 * i
        tx.append([t, seq, 1000, i, 2, 49153 if i == 15 else 49152, 0])
        if i != 15:
            rx.append([t + ms // 5, seq, 1000])
    lost = 10_000 + 15_000
    tx += [[fault + 10 * ms, lost + 5000, 1000, 500, 3, 49154, 0], [fault + 40 * ms, lost, 1000, 501, 3, 49155, 0]]
    rx.append([fault + 40 * ms + ms // 5, lost, 1000])
    r = tcp_holes.report({"fault_ns": fault, "tx": tx, "rx": rx})
    assert r["hole"] == 15_000
    assert [(s["ms"], s["ev"]) for s in r["sends"]] == [(5.0, 49153), (40.0, 49155)]
    assert r["arrivals"] == [40.2] and r["stall_ms"] == pytest.approx(36.0)
    assert r["other_units_resent_in_stall"] == 1 and r["hole_resent_in_stall"] == 1
