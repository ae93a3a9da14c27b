"""Loss per EV (bpf/congest.h), through BPF_PROG_TEST_RUN on both receive hooks.

Every DATA unit carries its path's unit count (mrc_hdr.path_seq); the
receiver counts units that never arrived on a path (a gap in the count) and
wire packets missing from units that arrived in part, and says so in its
next echoes of that path (MRC_F_ELOSS); the sender counts such echoes for
its own path (mrc_path_cong.loss_echoes), which the agent's per-EV split
reads beside the CE marks.
"""

from __future__ import annotations

import time

import pytest

import unit_pkt as pkt
from unit_dp import PATHS, PEER, TC_ACT_REDIRECT, UDP_PORT, XDP_PASS
from mrcctl.datapath import abi as wire

pytestmark = pytest.mark.usefixtures("rx_hook")

PATH = 3            # plane 2, IPv4
IDENT = 500         # the inner IPv4 ID of a unit's first segment


def cong(dp, path: int = PATH) -> wire.PathCong:
    return wire.PathCong.unpack(dp.maps["mrc_path_cong"].lookup(dp.sizing.path_key(PEER, path)))


def unit_seg(psn: int, seq: int, i: int = 0, segs: int = 1, path: int = PATH, **hdr_kw) -> bytes:
    """Wire segment i of the peer's unit psn (segs segments, path_seq seq)
    on its path `path`: a UDP unit, its segments told apart by the inner
    IPv4 ID (MRC_F_IPID), as mrc_tx sends a UDP GSO unit."""
    flags = hdr_kw.pop("flags", 0) | (wire.MRC_F_IPID if segs > 1 else 0)
    inner = pkt.ipv4(pkt.PEER_OVERLAY, pkt.LOCAL_OVERLAY, pkt.IPPROTO_UDP,
                     pkt.udp(5201, 40000, b"d" * 100), ident=IDENT + i)
    return pkt.mrc_frame(PATHS[path].family, inner=inner, path_id=path, psn=psn, segs=segs,
                         seq0=IDENT, path_seq=seq, tx_ts=1000 + psn, flags=flags, **hdr_kw)


def deliver(dp, *frames: bytes) -> None:
    for f in frames:
        ret, _ = dp.run_rx(f)
        assert ret == XDP_PASS


def lost(dp, path: int = PATH) -> tuple[int, int]:
    s = dp.stats(path)
    return s.rx_lost_units, s.rx_lost_segs


def echo_flags(dp) -> int:
    """The flags of the echo the next unit toward the peer carries (path
    PATH is the only one with a receipt)."""
    ret, out = dp.run_tx(pkt.overlay(pkt.udp(40000, 5201, b"c" * 64)))
    assert ret == TC_ACT_REDIRECT
    h = pkt.mrc_hdr_of(out)
    assert h.flags & wire.MRC_F_FEEDBACK and h.fb_path == PATH
    return h.flags


def test_consecutive_units_are_no_loss(dp):
    dp.set_cfg(udp_port=UDP_PORT)
    deliver(dp, unit_seg(10, 5), unit_seg(20, 6), unit_seg(30, 7))
    assert lost(dp) == (0, 0) and cong(dp).rx_loss_ns == 0
    assert not echo_flags(dp) & wire.MRC_F_ELOSS


def test_a_gap_in_path_seq_is_units_lost_and_echoed(dp):
    """Units 6 and 7 skipped: 6 is counted at once, 7 (the newest skipped,
    which a swap would bring next) when the unit after 8 comes without it."""
    dp.set_cfg(udp_port=UDP_PORT)
    t0 = time.monotonic_ns()
    deliver(dp, unit_seg(10, 5), unit_seg(40, 8))
    assert lost(dp) == (1, 0)
    assert cong(dp).rx_loss_ns >= t0
    assert echo_flags(dp) & wire.MRC_F_ELOSS
    deliver(dp, unit_seg(50, 9))
    assert lost(dp) == (2, 0)
    assert lost(dp, 0) == (0, 0)        # another path of the peer's: nothing


def test_path_seq_wraps(dp):
    dp.set_cfg(udp_port=UDP_PORT)
    deliver(dp, unit_seg(10, 254), unit_seg(20, 255), unit_seg(30, 0), unit_seg(40, 1))
    assert lost(dp) == (0, 0)
    deliver(dp, unit_seg(50, 3), unit_seg(60, 4))
    assert lost(dp) == (1, 0)


def test_a_swapped_pair_is_no_loss(dp):
    """Two CPUs sending (or receiving) on one path swap neighbours: 7
    before 6 is no loss, and nothing is echoed; the count goes on from 7."""
    dp.set_cfg(udp_port=UDP_PORT)
    deliver(dp, unit_seg(10, 5), unit_seg(30, 7), unit_seg(20, 6), unit_seg(40, 8), unit_seg(50, 9))
    assert lost(dp) == (0, 0) and cong(dp).rx_loss_ns == 0
    assert cong(dp).rx_seq & 0xFF == 9
    assert not echo_flags(dp) & wire.MRC_F_ELOSS


def test_a_unit_late_by_more_than_one_is_lost(dp):
    """A hole waits for one unit only: 6 after 7 and 8 was counted lost
    at 8, and moves nothing back."""
    dp.set_cfg(udp_port=UDP_PORT)
    deliver(dp, unit_seg(10, 5), unit_seg(30, 7), unit_seg(40, 8))
    assert lost(dp) == (1, 0)
    deliver(dp, unit_seg(20, 6), unit_seg(50, 9))
    assert lost(dp) == (1, 0)
    assert cong(dp).rx_seq & 0xFF == 9


def test_hedged_units_do_not_count(dp):
    """A hedged unit repeats its path's last count, and its copy travels on
    another path: the receiver takes no count from either."""
    dp.set_cfg(udp_port=UDP_PORT)
    deliver(dp, unit_seg(10, 5), unit_seg(20, 5, flags=wire.MRC_F_HEDGE),
            unit_seg(30, 200, flags=wire.MRC_F_HEDGE), unit_seg(40, 6))
    assert lost(dp) == (0, 0)


def test_segments_missing_from_a_unit_are_counted(dp):
    """A unit's packets are counted in its slot; the unit MRC_RX_UNITS
    later takes the slot and settles it: whatever did not come was lost
    (its head, middle and tail alike)."""
    dp.set_cfg(udp_port=UDP_PORT)
    deliver(dp, *(unit_seg(100, 1, i, segs=3) for i in range(3)))
    # unit 2 brings 2 of its 5 packets
    deliver(dp, unit_seg(103, 2, 1, segs=5), unit_seg(103, 2, 3, segs=5))
    for k in range(1, wire.MRC_RX_UNITS):       # units 3..: unit 2's slot stays its own
        deliver(dp, unit_seg(107 + k, 2 + k))
    assert lost(dp) == (0, 0)
    deliver(dp, unit_seg(120, 2 + wire.MRC_RX_UNITS))   # takes unit 2's slot
    assert lost(dp) == (0, 3)
    assert echo_flags(dp) & wire.MRC_F_ELOSS


def test_units_interleaved_or_out_of_order_are_no_loss(dp):
    """The packets of one unit reach the receiver through two CPUs, and two
    sending CPUs interleave units on one path: no packet is lost, however
    they alternate; a packet that never comes still counts, once its
    unit's slot is taken, and one coming after that counts for nothing."""
    dp.set_cfg(udp_port=UDP_PORT)
    n = wire.MRC_RX_UNITS
    a = [unit_seg(100, 1, i, segs=4) for i in range(4)]
    b = [unit_seg(104, 2, i, segs=4) for i in range(4)]
    deliver(dp, a[0], b[0], a[3], b[2], a[1], b[1], a[2], b[3])
    deliver(dp, *(unit_seg(108 + k, 3 + k) for k in range(2 * n)))     # both slots taken again
    assert lost(dp) == (0, 0) and cong(dp).rx_loss_ns == 0
    base, seq = 108 + 2 * n, 3 + 2 * n
    d = [unit_seg(base, seq, i, segs=4) for i in range(4)]
    deliver(dp, d[0], d[2], d[3])                                   # d[1] does not come
    deliver(dp, *(unit_seg(base + 4 + k, seq + 1 + k) for k in range(n)))
    assert lost(dp) == (0, 1)
    deliver(dp, d[1])                                               # too late: counts for none
    deliver(dp, *(unit_seg(base + 4 + n + k, seq + 1 + n + k) for k in range(n)))
    assert lost(dp) == (0, 1)


def test_a_peer_starting_over_is_counted_anew(dp):
    """The peer came up again and numbers its wire packets from far below
    what the slots hold: its units take the slots (not late frames of the
    old ones, which would count for nothing for good)."""
    dp.set_cfg(udp_port=UDP_PORT)
    n = wire.MRC_RX_UNITS
    deliver(dp, *(unit_seg(1 << 24 | k, 1 + k) for k in range(n)))
    base = 1000
    d = [unit_seg(base, 1, i, segs=3) for i in range(3)]
    deliver(dp, d[0], d[2])                                          # d[1] lost
    deliver(dp, *(unit_seg(base + 3 + k, 2 + k) for k in range(n)))
    assert lost(dp) == (0, 1)


def test_an_old_loss_is_no_longer_echoed(dp):
    dp.set_cfg(udp_port=UDP_PORT)
    deliver(dp, unit_seg(10, 5), unit_seg(40, 8))
    c = cong(dp)
    dp.maps["mrc_path_cong"].update(dp.sizing.path_key(PEER, PATH), wire.PathCong(
        **{**c.__dict__, "rx_loss_ns": time.monotonic_ns() - 50_000_000}).pack())
    assert not echo_flags(dp) & wire.MRC_F_ELOSS


@pytest.mark.parametrize("lossy", [False, True], ids=["plain-echo", "loss-echo"])
def test_a_loss_echo_is_counted_for_our_path(dp, lossy):
    dp.set_cfg(udp_port=UDP_PORT)
    flags = wire.MRC_F_FEEDBACK | (wire.MRC_F_ELOSS if lossy else 0)
    deliver(dp, unit_seg(20, 0, path=0, flags=flags, fb_path=3, fb_ts=5))
    assert cong(dp, 3).loss_echoes == (1 if lossy else 0)
    assert cong(dp, 3).ce_echoes == 0 and cong(dp, 3).ce_ns == 0   # no CE hold for loss
    # the same receipt echoed again is no news
    deliver(dp, unit_seg(30, 1, path=0, flags=flags, fb_path=3, fb_ts=5))
    assert cong(dp, 3).loss_echoes == (1 if lossy else 0)
    assert cong(dp, 0).loss_echoes == 0


def test_units_on_a_path_carry_its_count(dp):
    """mrc_tx numbers each path's units; a hedged unit repeats the last."""
    dp.set_cfg(udp_port=UDP_PORT)
    dp.set_slots([0, 3])

    def send() -> wire.MrcHdr:
        ret, out = dp.run_tx(pkt.overlay(pkt.udp(40000, 5201, b"c" * 64)))
        assert ret == TC_ACT_REDIRECT
        return pkt.mrc_hdr_of(out)

    got = [(h.path_id, h.path_seq) for h in (send() for _ in range(5))]
    assert got == [(0, 0), (3, 0), (0, 1), (3, 1), (0, 2)]
    dp.maps["mrc_path_seq"].update(dp.sizing.path_key(PEER, 3), wire.u32(255))
    assert (send().path_seq, send().path_seq) == (255, 3)   # path 3 wraps, path 0 goes on
