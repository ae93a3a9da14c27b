"""Issue #13 items 2, 8 and 12 on crafted frames (BPF_PROG_TEST_RUN):
UDP GSO units numbered per wire packet, hedged copies far ahead of the
window not marked in the duplicate filter, probes answered at a bounded
rate per peer and plane, priority-tagged and VLAN-tagged frames, and
encapsulated inner packets on the transmit side."""

from __future__ import annotations

import struct
import time

import unit_pkt as pkt
from unit_dp import (LOCAL_OVERLAY, PEER, PEER_OVERLAY, TC_ACT_REDIRECT, TC_ACT_SHOT, XDP_DROP,
                     XDP_PASS, XDP_TX, drops_delta)
from mrcctl.datapath import abi as wire

R = wire.Reason
mrc_frame = pkt.mrc_frame
HEDGE, IPID = wire.MRC_F_HEDGE, wire.MRC_F_IPID


def udp_inner(ident: int, n: int = 200) -> bytes:
    """An inner UDP datagram from the peer to us with IPv4 ID `ident`."""
    return pkt.ipv4(PEER_OVERLAY, LOCAL_OVERLAY, pkt.IPPROTO_UDP,
                    pkt.udp(5201, 40000, bytes([ident & 0xFF]) * n), ident=ident & 0xFFFF)


def run(dp, frame):
    before = dp.drops()
    ret, out = dp.run_rx(frame)
    return ret, out, drops_delta(before, dp.drops())


# --- item 2: UDP GSO units ---------------------------------------------------

def test_udp_gso_unit_numbered_by_inner_ip_id(dp):
    """Every wire packet of a hedged UDP GSO unit gets its own wire PSN
    (unit PSN + inner IPv4 ID - seq0, mod 2^16): both copies of segment i
    share it, so the second copy of each and only that is a duplicate."""
    seq0 = 0xFFFE                                      # IDs wrap inside the unit
    unit = dict(psn=100, segs=4, seg_size=1200, seq0=seq0, flags=HEDGE | IPID)
    order = [0, 2, 1, 3]                               # first copies, one out of order
    maxes = []
    for i in order:
        ret, _, d = run(dp, mrc_frame(inner=udp_inner(seq0 + i), **unit))
        assert ret == XDP_PASS and d == {}, (i, d)
        maxes.append(dp.seq().rx_psn_max)
    assert maxes == [100, 102, 102, 103]
    for i in order:                                    # the partner path's copies
        ret, _, d = run(dp, mrc_frame(inner=udp_inner(seq0 + i), path_id=3, **unit))
        assert ret == XDP_DROP and d == {R.RX_DUPLICATE: 1}, (i, d)
    st = dp.stats(0)
    assert (st.rx_packets, st.rx_ooo, st.rx_dup) == (4, 1, 0)
    # an ID outside the unit is not trusted: the unit's own PSN
    ret, _, d = run(dp, mrc_frame(inner=udp_inner(seq0 + 9), **unit))
    assert ret == XDP_DROP and d == {R.RX_DUPLICATE: 1}
    # without the flag a non-TCP unit is not numbered (an older sender):
    # all its segments carry the unit's PSN, as before
    old = dict(psn=200, segs=3, seg_size=0, seq0=0, flags=0)
    for i in range(3):
        run(dp, mrc_frame(inner=udp_inner(i), **old))
    assert dp.seq().rx_psn_max == 200


def test_tx_numbers_udp_gso_unit_by_ip_id(dp):
    """mrc_tx marks a non-TCP unit of several segments MRC_F_IPID with the
    first segment's inner IPv4 ID in seq0; a TCP unit keeps its sequence
    number, a single UDP packet needs no numbering."""
    dp.set_slots([0])
    cases = [  # (desc, body, proto, ident, gso_segs, flags, seq0)
        ("udp gso unit", pkt.udp(1, 2, b"u" * 1000), pkt.IPPROTO_UDP, 0xBEEF, 5, IPID, 0xBEEF),
        ("udp single", pkt.udp(1, 2, b"u" * 100), pkt.IPPROTO_UDP, 0x1234, 0, 0, 0),
        ("tcp unit", pkt.tcp(1, 2, 7000, b"t" * 1000), pkt.IPPROTO_TCP, 0x4321, 5, 0, 7000),
    ]
    psn = 0
    for desc, body, proto, ident, segs, flags, seq0 in cases:
        frame = pkt.overlay(body, proto, ident=ident)
        ctx = bytearray(192)
        struct.pack_into("=I", ctx, 164, segs)
        ret, out = dp.run_tx(frame, ctx_in=bytes(ctx))
        assert ret == TC_ACT_REDIRECT, desc
        h = pkt.mrc_hdr_of(out)
        assert (h.psn, h.segs, h.flags & IPID, h.seq0) == (psn, max(segs, 1), flags, seq0), desc
        psn += max(segs, 1)


# --- item 8: hedged copies far ahead, probe rate ------------------------------

def test_forged_hedge_far_ahead_does_not_preset_duplicate(dp):
    """A hedged frame far ahead of the highest PSN seen is delivered but
    not marked (rx_hedge_ahead): the genuine copies of that PSN later are
    not dropped. Inside the bound the filter works as before."""
    ret, _, _ = run(dp, mrc_frame(psn=1000))
    assert ret == XDP_PASS
    far = 1000 + 100_000
    ret, _, d = run(dp, mrc_frame(psn=far, flags=HEDGE))        # forged
    assert ret == XDP_PASS and d == {R.RX_HEDGE_AHEAD: 1}
    ret, _, d = run(dp, mrc_frame(psn=far, flags=HEDGE))        # genuine, later
    assert ret == XDP_PASS and d == {}, d
    ret, _, d = run(dp, mrc_frame(psn=far, flags=HEDGE, path_id=3))   # its twin
    assert ret == XDP_DROP and d == {R.RX_DUPLICATE: 1}
    # near the top: marked, the twin dropped
    for psn in (far + 1, far + 4000):
        ret, _, d = run(dp, mrc_frame(psn=psn, flags=HEDGE))
        assert ret == XDP_PASS and d == {}, (psn, d)
        ret, _, d = run(dp, mrc_frame(psn=psn, flags=HEDGE, path_id=3))
        assert ret == XDP_DROP and d == {R.RX_DUPLICATE: 1}, (psn, d)
    # a restarted sender that hedges everything: its first unit is far
    # ahead (delivered twice, counted), then the filter works again
    base = 500_000_000
    assert run(dp, mrc_frame(psn=base, flags=HEDGE))[2] == {R.RX_HEDGE_AHEAD: 1}
    assert run(dp, mrc_frame(psn=base + 1, flags=HEDGE))[0] == XDP_PASS
    assert run(dp, mrc_frame(psn=base + 1, flags=HEDGE, path_id=3))[0] == XDP_DROP


def probe(plane_path: int, family: int = 4) -> bytes:
    return mrc_frame(family, type=wire.MsgType.PROBE, path_id=plane_path, inner=b"", sport=49160)


def test_probe_requests_rate_limited_per_peer_and_plane(dp):
    """Probes are answered up to a burst, then at a bounded rate per
    (peer, plane); the rest is dropped under rx_probe_limited. Another
    plane of the same peer keeps its own budget."""
    n = 3000
    frame = probe(0)
    before = dp.drops()
    t0 = time.monotonic()
    rets = [dp.run_rx(frame)[0] for _ in range(n)]
    secs = time.monotonic() - t0
    replied, limited = rets.count(XDP_TX), rets.count(XDP_DROP)
    assert replied + limited == n
    assert drops_delta(before, dp.drops()) == {R.RX_PROBE_REPLIED: replied,
                                               R.RX_PROBE_LIMITED: limited}
    assert limited > 0, f"{n} probes in {secs:.3f} s all answered"
    burst, rate = 512, 8192
    assert burst <= replied <= burst + rate * secs + 2, (replied, secs)
    # plane 1 (IPv6, path 1) and plane 2 (path 3) still answered
    assert run(dp, probe(1, 6))[0] == XDP_TX
    assert run(dp, probe(3))[0] == XDP_TX
    # the budget refills with time
    time.sleep(0.05)
    assert run(dp, probe(0))[0] == XDP_TX


# --- item 12: VLAN tags, nested encapsulation --------------------------------

def tagged(frame: bytes, tpid: int, vid: int, pcp: int = 0) -> bytes:
    return frame[:12] + struct.pack("!HH", tpid, (pcp << 13) | vid) + frame[12:]


def test_priority_tagged_mrc_frames_are_ours(dp):
    """802.1Q with VID 0 (a priority tag: the kernel treats the frame as
    untagged) is parsed through: decapsulated (the tag goes with the outer
    headers), probes turned around with the tag kept. Any other tag is a
    VLAN's: passed untouched, counted."""
    plain = mrc_frame(psn=7)
    ret, out, d = run(dp, tagged(plain, 0x8100, 0, pcp=5))
    assert ret == XDP_PASS and d == {}
    assert out == plain[:12] + b"\x08\x00" + plain[14 + 20 + 8 + 28:]
    assert dp.stats(0).rx_packets == 1
    ret, out6, d = run(dp, tagged(mrc_frame(6, psn=8), 0x8100, 0))
    assert ret == XDP_PASS and d == {} and out6[12:14] == b"\x08\x00"
    pr = tagged(probe(0), 0x8100, 0, pcp=6)
    ret, out, d = run(dp, pr)
    assert ret == XDP_TX and d == {R.RX_PROBE_REPLIED: 1}
    assert out[12:16] == pr[12:16] and len(out) == len(pr)
    assert wire.decode_mrc_hdr(out[18 + 20 + 8:]).type == wire.MsgType.PROBE_REPLY
    # a tagged truncated frame is judged on the right lengths
    ret, _, d = run(dp, tagged(plain, 0x8100, 0)[:-30])
    assert ret == XDP_DROP and d == {R.RX_TRUNCATED: 1}
    for tpid, vid in ((0x8100, 5), (0x88A8, 0), (0x88A8, 7)):
        f = tagged(mrc_frame(psn=9), tpid, vid)
        ret, out, d = run(dp, f)
        assert (ret, out, d) == (XDP_PASS, f, {R.RX_PASS_VLAN: 1}), (hex(tpid), vid)
    # VID 0 then a real VLAN tag (Q-in-Q behind a priority tag): a VLAN's
    f = tagged(tagged(mrc_frame(psn=10), 0x8100, 5), 0x8100, 0)
    assert run(dp, f)[:3:2] == (XDP_PASS, {R.RX_PASS_VLAN: 1})


def test_tx_refuses_vlan_tagged_overlay_frames(dp):
    dp.set_slots([0])
    inner = pkt.ipv4(LOCAL_OVERLAY, PEER_OVERLAY, pkt.IPPROTO_UDP, pkt.udp(1, 2, b"x" * 50))
    for tpid, vid in ((0x8100, 5), (0x8100, 0), (0x88A8, 3)):
        f = pkt.eth(pkt.OVL_DMAC, pkt.OVL_SMAC, tpid) + struct.pack("!HH", vid, 0x0800) + inner
        before = dp.drops()
        ret, _ = dp.run_tx(f)
        assert ret == TC_ACT_SHOT and drops_delta(before, dp.drops()) == {R.TX_VLAN: 1}


def test_vxlan_inner_packet_carried_byte_for_byte(dp):
    """A VXLAN packet from a container network over the overlay is just
    inner UDP to mrc: carried both ways, its own headers untouched."""
    dp.set_slots([0])
    cont = pkt.eth("02:00:00:00:0c:02", "02:00:00:00:0c:01", 0x0800) + pkt.ipv4(
        "172.16.0.1", "172.16.0.2", pkt.IPPROTO_TCP, pkt.tcp(80, 5555, 1, b"c" * 300))
    vx = struct.pack("!II", 0x08000000, 42 << 8) + cont
    frame = pkt.overlay(pkt.udp(33333, 4789, vx), pkt.IPPROTO_UDP)
    ret, out = dp.run_tx(frame)
    assert ret == TC_ACT_REDIRECT
    assert out[14 + wire.MRC_OVERHEAD_V4:] == frame[14:]
    rx_inner = pkt.ipv4(PEER_OVERLAY, LOCAL_OVERLAY, pkt.IPPROTO_UDP, pkt.udp(33333, 4789, vx))
    ret, out, d = run(dp, mrc_frame(inner=rx_inner, psn=1))
    assert ret == XDP_PASS and d == {} and out[14:] == rx_inner
