"""Path MTU (bpf/pmtu.h) through BPF_PROG_TEST_RUN: mrc_rx records the MTU
of an ICMP "fragmentation needed" / "packet too big" that quotes one of our
own frames exactly, and mrc_tx turns a unit too big for its path into an
ICMP "fragmentation needed" to the inner sender."""

from __future__ import annotations

import socket
import struct
import time

import unit_pkt as pkt
from unit_dp import (LOCAL_OVERLAY, OUR_MAC, OVL_DMAC, OVL_SMAC, PATHS, PEER, PEER_OVERLAY,
                     TC_ACT_REDIRECT, TC_ACT_SHOT, UDP_PORT, XDP_DROP, XDP_PASS, drops_delta)
from mrcctl.datapath import abi as wire

R = wire.Reason
ROUTER_MAC = "02:00:00:00:09:09"
ICMP, ICMPV6 = 1, 58


def inner_udp(payload_len: int, df: bool = True) -> bytes:
    body = pkt.udp(40000, 5201, bytes(range(256)) * (payload_len // 256) +
                   bytes(range(payload_len % 256)))
    return pkt.eth(OVL_DMAC, OVL_SMAC, pkt.ETH_P_IP) + pkt.ipv4(LOCAL_OVERLAY, PEER_OVERLAY,
                                                                pkt.IPPROTO_UDP, body, df=df,
                                                                ident=0x4242)


def sent_frame(dp, path: int, payload_len: int = 1400) -> bytes:
    """One of our DATA frames on `path`, as mrc_tx writes it."""
    dp.set_slots([path])
    ret, out = dp.run_tx(inner_udp(payload_len))
    assert ret == TC_ACT_REDIRECT
    return out


def icmp4(quote: bytes, mtu: int, typ: int = 3, code: int = 4) -> bytes:
    """A router's ICMP to our plane-0 address quoting `quote`."""
    body = struct.pack("!BBHHH", typ, code, 0, 0, mtu) + quote
    body = body[:2] + struct.pack("!H", wire.inet_csum(body)) + body[4:]
    return pkt.eth(OUR_MAC, ROUTER_MAC, pkt.ETH_P_IP) + pkt.ipv4(
        "203.0.113.1", PATHS[0].saddr, ICMP, body, df=False)


def icmp6(quote: bytes, mtu: int, typ: int = 2) -> bytes:
    body = struct.pack("!BBHI", typ, 0, 0, mtu) + quote
    return pkt.eth(OUR_MAC, ROUTER_MAC, pkt.ETH_P_IPV6) + pkt.ipv6(
        "fd00:1::99", PATHS[1].saddr, ICMPV6, body)


def path_mtu(dp, path: int) -> wire.PathMtu:
    return wire.PathMtu.unpack(dp.maps["mrc_path_mtu"].lookup(wire.DEFAULT_SIZING.path_key(PEER, path)))


def set_mtu(dp, path: int, mtu: int, age_s: float = 0.0):
    # modulo 2^32: on a machine up for less than age_s the record's time is
    # "before boot", which the datapath's unsigned now - s ages the same way
    s = (time.monotonic_ns() // 1_000_000_000 - int(age_s)) % (1 << 32)
    dp.maps["mrc_path_mtu"].update(wire.DEFAULT_SIZING.path_key(PEER, path),
                                   wire.PathMtu(mtu=mtu, icmps=1, s=s).pack())


def patch(b: bytes, off: int, new: bytes) -> bytes:
    return b[:off] + new + b[off + len(new):]


def test_rx_records_only_icmp_naming_our_path(dp):
    dp.set_seq(psn=1000)
    q4 = sent_frame(dp, 0)[14:]            # outer IPv4 + UDP + MRC + inner
    q6 = sent_frame(dp, 1)[14:]
    assert len(q4) == 20 + 8 + 28 + 1428
    moff4 = 28                               # MRC header within the quote
    cases = [
        # (what, frame, verdict, reason, path, recorded MTU afterwards)
        ("genuine frag-needed, Linux-sized quote", icmp4(q4[:548], 1300),
         XDP_DROP, R.RX_PMTU, 0, 1300),
        ("a later, larger report replaces it", icmp4(q4[:548], 1400), XDP_DROP, R.RX_PMTU, 0, 1400),
        ("tiny MTU is raised to 576", icmp4(q4[:548], 200), XDP_DROP, R.RX_PMTU, 0, 576),
        ("MTU not below the quoted length", icmp4(q4[:548], len(q4)),
         XDP_DROP, R.RX_PMTU_BAD, 0, 576),
        ("MTU 0 (pre-RFC 1191 router)", icmp4(q4[:548], 0), XDP_DROP, R.RX_PMTU_BAD, 0, 576),
        ("8-byte quote (RFC 792 minimum): no MRC header to check", icmp4(q4[:28], 1300),
         XDP_DROP, R.RX_PMTU_BAD, 0, 576),
        ("another EV than the path's", icmp4(patch(q4, 20, struct.pack("!H", 49154))[:548], 1300),
         XDP_DROP, R.RX_PMTU_BAD, 0, 576),
        ("path id of another plane", icmp4(patch(q4, moff4 + 2, struct.pack("!H", 3))[:548], 1300),
         XDP_DROP, R.RX_PMTU_BAD, 0, 576),
        ("PSN never sent", icmp4(patch(q4, moff4 + 4, struct.pack("!I", 5000))[:548], 1300),
         XDP_DROP, R.RX_PMTU_BAD, 0, 576),
        ("PSN older than the window", icmp4(patch(q4, moff4 + 4,
                                                  struct.pack("!I", (1000 - (1 << 20) - 1) & 0xFFFFFFFF))[:548], 1300),
         XDP_DROP, R.RX_PMTU_BAD, 0, 576),
        ("our source address forged", icmp4(patch(q4, 12, socket.inet_aton("192.0.2.9"))[:548], 1300),
         XDP_DROP, R.RX_PMTU_BAD, 0, 576),
        ("a probe, not DATA", icmp4(patch(q4, moff4, bytes([0x11]))[:548], 1300),
         XDP_DROP, R.RX_PMTU_BAD, 0, 576),
        ("destination not a peer on this plane", icmp4(patch(q4, 16, socket.inet_aton("192.0.2.77"))[:548], 1300),
         XDP_DROP, R.RX_PMTU_BAD, 0, 576),
        ("someone else's UDP", icmp4(patch(q4, 22, struct.pack("!H", 53))[:548], 1300),
         XDP_PASS, None, 0, 576),
        ("an echo request", icmp4(q4[:548], 1300, typ=8, code=0), XDP_PASS, None, 0, 576),
        ("port unreachable", icmp4(q4[:548], 1300, typ=3, code=3), XDP_PASS, None, 0, 576),
        ("IPv6 packet too big", icmp6(q6[:1232], 1400), XDP_DROP, R.RX_PMTU, 1, 1400),
        ("IPv6 below 1280 is raised", icmp6(q6[:1232], 1000), XDP_DROP, R.RX_PMTU, 1, 1280),
        ("IPv6 wrong EV", icmp6(patch(q6, 40, struct.pack("!H", 49152))[:1232], 1300),
         XDP_DROP, R.RX_PMTU_BAD, 1, 1280),
        ("ICMPv6 echo", icmp6(q6[:1232], 1300, typ=128), XDP_PASS, None, 1, 1280),
    ]
    for what, frame, verdict, reason, path, mtu in cases:
        before = dp.drops()
        ret, out = dp.run_rx(frame)
        assert ret == verdict, what
        assert drops_delta(before, dp.drops()) == ({reason: 1} if reason is not None else {}), what
        if verdict == XDP_PASS:
            assert out == frame, what
        assert path_mtu(dp, path).mtu == mtu, what
    assert path_mtu(dp, 0).icmps == 3
    assert path_mtu(dp, 2).mtu == 0 and path_mtu(dp, 3).mtu == 0   # no other path touched


def _check_icmp_to_sender(out: bytes, inner: bytes, mtu: int):
    """out: the ICMP mrc_tx built from `inner` (an overlay frame we sent)."""
    assert out[0:6] == wire.mac_bytes(OVL_SMAC) and out[6:12] == wire.mac_bytes(OVL_DMAC)
    assert out[12:14] == b"\x08\x00"
    ip = out[14:34]
    assert wire.inet_csum(ip) == 0
    vihl, _tos, tot, _id, frag, _ttl, proto, _ck, src, dst = struct.unpack("!BBHHHBBH4s4s", ip)
    assert (vihl, proto, frag) == (0x45, ICMP, 0)
    assert (socket.inet_ntoa(src), socket.inet_ntoa(dst)) == (PEER_OVERLAY, LOCAL_OVERLAY)
    assert tot == len(out) - 14
    icmp = out[34:]
    assert wire.inet_csum(icmp) == 0
    typ, code, _ck, _unused, got_mtu = struct.unpack("!BBHHH", icmp[:8])
    assert (typ, code, got_mtu) == (3, 4, mtu)
    quote = icmp[8:]
    assert quote == inner[14:14 + min(20 + 64, len(inner) - 14)]


def test_tx_too_big_becomes_icmp_to_the_sender(dp):
    dp.set_cfg(udp_port=UDP_PORT, overlay_ifindex=7)
    dp.set_slots([0])
    set_mtu(dp, 0, 1300)
    set_mtu(dp, 2, 1450)
    set_mtu(dp, 1, 1400, age_s=601)          # aged out: not in the overlay MTU
    ov4 = wire.MRC_OVERHEAD_V4
    cases = [
        # (what, frame, slot path, verdict, reason, ICMP MTU or None)
        ("fits: 1244 inner bytes + 56 = 1300", inner_udp(1244 - 28), 0, TC_ACT_REDIRECT, None, None),
        ("one byte too big: ICMP with the smallest recorded path", inner_udp(1245 - 28), 0,
         TC_ACT_REDIRECT, R.TX_TOO_BIG, 1300 - ov4),
        ("full size on the 1450 path: also told the peer-wide size", inner_udp(1400), 2,
         TC_ACT_REDIRECT, R.TX_TOO_BIG, 1300 - ov4),
        ("no DF: not ours to resize, dropped", inner_udp(1400, df=False), 0,
         TC_ACT_SHOT, R.TX_TOO_BIG_DROP, None),
        ("aged record: the path is tried at full size again", inner_udp(1400), 1,
         TC_ACT_REDIRECT, None, None),
        ("no record: full size", inner_udp(1400), 3, TC_ACT_REDIRECT, None, None),
    ]
    for what, frame, path, verdict, reason, mtu in cases:
        dp.set_slots([path])
        before = dp.drops()
        ret, out = dp.run_tx(frame)
        assert ret == verdict, what
        assert drops_delta(before, dp.drops()) == ({reason: 1} if reason is not None else {}), what
        if mtu is not None:
            _check_icmp_to_sender(out, frame, mtu)
        elif verdict == TC_ACT_REDIRECT:
            assert pkt.mrc_hdr_of(out).path_id == path, what
            assert out[-len(frame) + 14:] == frame[14:], what

    # IPv6 path: its own overhead; the record alone sets the size.
    set_mtu(dp, 0, 0)
    set_mtu(dp, 2, 0)
    set_mtu(dp, 1, 1280)
    dp.set_slots([1])
    frame = inner_udp(1300)
    ret, out = dp.run_tx(frame)
    assert ret == TC_ACT_REDIRECT
    _check_icmp_to_sender(out, frame, 1280 - wire.MRC_OVERHEAD_V6)


def test_tx_gso_unit_is_judged_by_its_segments(dp):
    """A GSO unit's wire packets are gso_size long, not skb->len. test_run
    makes no real GSO skb (test_tx.py): encapsulation then fails, which
    still tells the size check passed; a too-big segment size is refused
    under TX_TOO_BIG* instead."""
    from test_tx import _skb_ctx, inner_tcp
    dp.set_cfg(udp_port=UDP_PORT, overlay_ifindex=7)
    dp.set_slots([0])
    set_mtu(dp, 0, 1300)
    frame = inner_tcp(7000, 3000)
    for what, gso_size, reasons in [
        ("segments of 1000 fit", 1000, {R.TX_ENCAP_FAIL}),
        ("segments of 1300 do not", 1300, {R.TX_TOO_BIG, R.TX_TOO_BIG_DROP}),
    ]:
        before = dp.drops()
        dp.run_tx(frame, ctx_in=_skb_ctx(gso_segs=3, gso_size=gso_size))
        got = drops_delta(before, dp.drops())
        assert len(got) == 1 and set(got) <= reasons and sum(got.values()) == 1, (what, got)


def test_rx_jumbo_frames_in_several_buffers(dp):
    """mrc_rx is an xdp.frags program: a 9000-byte plane hands it frames
    spread over several buffers (test_run does the same above a page), and
    lengths are the whole frame's, not the first buffer's."""
    cases = []
    for size in (1400, 4000, 8900):
        inner = pkt.ipv4(PEER_OVERLAY, LOCAL_OVERLAY, pkt.IPPROTO_UDP,
                         pkt.udp(5201, 40000, bytes(range(256)) * (size // 256)), ident=77)
        cases.append((f"{len(inner)}-byte inner packet", pkt.mrc_frame(4, inner=inner, psn=size),
                      XDP_PASS, None, inner))
    big = cases[-1][1]
    cases.append(("jumbo frame claiming more than it holds",
                  patch(big, 16, struct.pack("!H", len(big) - 14 + 1)), XDP_DROP, R.RX_TRUNCATED, None))
    cases.append(("jumbo frame cut after its first page", big[:4096], XDP_DROP, R.RX_TRUNCATED, None))
    for what, frame, verdict, reason, inner in cases:
        before, rx0 = dp.drops(), dp.stats(0).rx_bytes
        ret, out = dp.run_rx(frame)
        assert ret == verdict, what
        assert drops_delta(before, dp.drops()) == ({reason: 1} if reason is not None else {}), what
        if inner is not None:
            assert out == frame[:12] + b"\x08\x00" + inner, what
            assert dp.stats(0).rx_bytes - rx0 == len(frame), what


def test_no_hedged_copy_onto_a_partner_too_small(dp, veth):
    """Duplicate-send mode copies every unit onto a partner path (hedge.h);
    a copy the partner's recorded MTU cannot carry would only bring another
    ICMP, so the unit goes out once, unhedged."""
    dp.set_paths([wire.replace(PATHS[0], ifindex=veth), *PATHS[1:]])
    dp.set_cfg(udp_port=UDP_PORT, overlay_ifindex=7,
               flags=wire.MRC_CFG_LIVENESS | wire.MRC_CFG_HEDGE_ALL,
               dead_after_us=5000, hedge_after_us=2500, recover_probes=3)
    dp.set_slots([0])
    set_mtu(dp, 3, 1300)                     # path 3: the partner of path 0 (v4, plane 2)
    for what, size, hedged in [("fits the partner", 1200, True),
                               ("too big for the partner", 1400, False)]:
        ret, out = dp.run_tx(inner_udp(size))
        assert ret == TC_ACT_REDIRECT, what
        h = pkt.mrc_hdr_of(out)
        assert bool(h.flags & wire.MRC_F_HEDGE) == hedged, what
        assert h.path_id == (3 if hedged else 0), what
