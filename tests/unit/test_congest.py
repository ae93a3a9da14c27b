"""ECN-driven EV avoidance (bpf/congest.h), through BPF_PROG_TEST_RUN.

The receiver remembers a CE-marked arrival per path of the peer's and says
so in its next echoes of that path (MRC_F_ECE); the sender records such an
echo for its own path, and its slot walk passes that path over for
cong_hold_us while other slots are unmarked.
"""

from __future__ import annotations

import dataclasses
import re
import time

import pytest

import unit_pkt as pkt
from unit_dp import BPF_DIR, PATHS, PEER, TC_ACT_REDIRECT, UDP_PORT, XDP_PASS
from mrcctl.datapath import abi as wire

pytestmark = pytest.mark.usefixtures("rx_hook")

ECT0, CE = 2, 3
HOLD_US = 1000
CONG_SKIP_SLOTS = int(re.search(r"#define CONG_SKIP_SLOTS\s+(\d+)", (BPF_DIR / "congest.h").read_text())[1])


def cong(dp, path: int) -> wire.PathCong:
    return wire.PathCong.unpack(dp.maps["mrc_path_cong"].lookup(dp.sizing.path_key(PEER, path)))


def set_cong(dp, path: int, **kw):
    dp.maps["mrc_path_cong"].update(dp.sizing.path_key(PEER, path), wire.PathCong(**kw).pack())


def avoided(dp) -> int:
    return wire.HealthStats.sum(dp.maps["mrc_hstats"].lookup_percpu(wire.u32(0))).ecn_avoided


def inner_tx() -> bytes:
    return pkt.overlay(pkt.udp(40000, 5201, b"c" * 64), tos=ECT0)


def data_from_peer(path: int, outer_ecn: int, psn: int, **hdr_kw) -> bytes:
    inner = pkt.ipv4(pkt.PEER_OVERLAY, pkt.LOCAL_OVERLAY, pkt.IPPROTO_UDP,
                     pkt.udp(5201, 40000, b"d" * 100), ident=77, tos=ECT0)
    family = PATHS[path].family
    ip_kw = {"tos": outer_ecn} if family == 4 else {"tc": outer_ecn}
    return pkt.mrc_frame(family, inner=inner, path_id=path, psn=psn, tx_ts=1000 + psn,
                         ip_kw=ip_kw, **hdr_kw)


@pytest.mark.parametrize("outer", [ECT0, CE], ids=["unmarked", "ce"])
def test_a_ce_arrival_is_echoed_with_ece(dp, outer):
    dp.set_cfg(udp_port=UDP_PORT)
    ret, _ = dp.run_rx(data_from_peer(3, outer, psn=10))
    assert ret == XDP_PASS
    assert bool(cong(dp, 3).rx_ce_ns) == (outer == CE)
    # the next unit toward the peer echoes path 3, the only one with a receipt
    ret, out = dp.run_tx(inner_tx())
    assert ret == TC_ACT_REDIRECT
    h = pkt.mrc_hdr_of(out)
    assert h.flags & wire.MRC_F_FEEDBACK and h.fb_path == 3
    assert bool(h.flags & wire.MRC_F_ECE) == (outer == CE)


def test_an_old_mark_is_no_longer_echoed(dp):
    dp.set_cfg(udp_port=UDP_PORT)
    ret, _ = dp.run_rx(data_from_peer(3, ECT0, psn=10))
    assert ret == XDP_PASS
    set_cong(dp, 3, rx_ce_ns=time.monotonic_ns() - 50_000_000)   # 50 ms ago
    ret, out = dp.run_tx(inner_tx())
    h = pkt.mrc_hdr_of(out)
    assert h.flags & wire.MRC_F_FEEDBACK and not h.flags & wire.MRC_F_ECE


@pytest.mark.parametrize("ece", [False, True], ids=["plain-echo", "ece-echo"])
def test_an_ece_echo_marks_our_path(dp, ece):
    dp.set_cfg(udp_port=UDP_PORT)
    flags = wire.MRC_F_FEEDBACK | (wire.MRC_F_ECE if ece else 0)
    t0 = time.monotonic_ns()
    ret, _ = dp.run_rx(data_from_peer(0, ECT0, psn=20, flags=flags, fb_path=3, fb_ts=5))
    assert ret == XDP_PASS
    c = cong(dp, 3)
    assert c.ce_echoes == (1 if ece else 0)
    assert (c.ce_ns >= t0) if ece else c.ce_ns == 0
    assert cong(dp, 0).ce_echoes == 0      # the path the echo came on is not the one named


def test_the_slot_walk_passes_over_a_marked_path(dp):
    # a hold long enough that a busy machine cannot let it pass between
    # writing the mark and running the program (1 ms did, in a CI run)
    hold_us = 50 * HOLD_US
    dp.set_slots([0, 3])
    dp.set_cfg(udp_port=UDP_PORT, cong_hold_us=hold_us)
    set_cong(dp, 0, ce_ns=time.monotonic_ns())
    ret, out = dp.run_tx(inner_tx())
    assert ret == TC_ACT_REDIRECT and pkt.mrc_hdr_of(out).path_id == 3
    assert avoided(dp) == 1
    # the same slot, but the mark is older than the hold: path 0 again
    dp.set_seq(cursor=0)
    set_cong(dp, 0, ce_ns=time.monotonic_ns() - 2 * hold_us * 1000)
    ret, out = dp.run_tx(inner_tx())
    assert pkt.mrc_hdr_of(out).path_id == 0 and avoided(dp) == 1
    # avoidance off: a fresh mark changes nothing
    dp.set_seq(cursor=0)
    dp.set_cfg(udp_port=UDP_PORT, cong_hold_us=0)
    set_cong(dp, 0, ce_ns=time.monotonic_ns())
    ret, out = dp.run_tx(inner_tx())
    assert pkt.mrc_hdr_of(out).path_id == 0 and avoided(dp) == 1


def test_when_every_slot_is_marked_a_marked_path_carries_the_unit(dp):
    """A bottleneck every path shares marks them all: nothing is gained by
    avoiding, and the unit must not be refused."""
    dp.set_slots([0, 3])
    dp.set_cfg(udp_port=UDP_PORT, cong_hold_us=50 * HOLD_US)   # outlasts a busy machine's pause
    now = time.monotonic_ns()
    set_cong(dp, 0, ce_ns=now)
    set_cong(dp, 3, ce_ns=now)
    ret, out = dp.run_tx(inner_tx())
    assert ret == TC_ACT_REDIRECT and pkt.mrc_hdr_of(out).path_id in (0, 3)
    assert avoided(dp) == CONG_SKIP_SLOTS      # bpf/congest.h: the walk's first slots


def test_a_path_marked_after_its_hold_is_held_longer_and_unmarked_echoes_shorten_it(dp):
    # a hold that outlasts a busy machine's pause between two test runs: a
    # 1 ms one made the echo "sent before the hold" a first try after it
    hold = 50 * HOLD_US
    dp.set_cfg(udp_port=UDP_PORT, cong_hold_us=hold)
    ece = wire.MRC_F_FEEDBACK | wire.MRC_F_ECE
    ts = iter(range(100, 200))

    def echo(flags: int, fb_ts: int | None = None) -> int:
        fb_ts = next(ts) if fb_ts is None else fb_ts
        ret, _ = dp.run_rx(data_from_peer(0, ECT0, psn=fb_ts, flags=flags, fb_path=3, fb_ts=fb_ts))
        assert ret == XDP_PASS
        return fb_ts

    def marked_ago(us: float):
        # as if the last mark came `us` ago
        c = dataclasses.replace(cong(dp, 3), ce_ns=time.monotonic_ns() - int(us * 1000))
        dp.maps["mrc_path_cong"].update(dp.sizing.path_key(PEER, 3), c.pack())

    last = echo(ece)
    assert (cong(dp, 3).ce_echoes, cong(dp, 3).hold_shift) == (1, 0)
    echo(ece, fb_ts=last)                     # the same receipt echoed again: no news
    assert (cong(dp, 3).ce_echoes, cong(dp, 3).hold_shift) == (1, 0)
    echo(ece)                                 # sent before the hold: restarts it only
    assert cong(dp, 3).hold_shift == 0
    for shift in range(1, 7):                 # each first try after a hold is marked
        marked_ago(1.5 * (hold << (shift - 1)))
        echo(ece)
        assert cong(dp, 3).hold_shift == min(shift, 5)      # CONG_MAX_SHIFT: at most 32 x
    # the walk passes it over for the longer hold: 2 x hold after the mark
    dp.set_slots([3, 0])
    marked_ago(2 * hold)
    ret, out = dp.run_tx(inner_tx())
    assert pkt.mrc_hdr_of(out).path_id == 0
    for want in (4, 3, 2, 1, 0, 0):           # unmarked echoes halve the hold
        echo(wire.MRC_F_FEEDBACK)
        assert cong(dp, 3).hold_shift == want
    dp.set_seq(cursor=0)
    ret, out = dp.run_tx(inner_tx())
    assert pkt.mrc_hdr_of(out).path_id == 3
