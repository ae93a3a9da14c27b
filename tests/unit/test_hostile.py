"""Hostile frames against mrc_rx and mrc_tx (BPF_PROG_TEST_RUN): each class
gets the verdict documented in docs/hostile-input.md and moves exactly one
mrc_drops counter (or none, for frames that are not mrc's).

Every expectation is also checked against the reference model (rxmodel), so
the table in the document, the model and the program cannot drift apart.
"""

from __future__ import annotations

import struct
import time

import pytest

import rxmodel
import unit_pkt as pkt
from fuzzgen import (EMPTY_PEER_SRC, OTHER_PLANE_SRC, OUR_MAC, PEER_MAC, configure)
from mrcctl.datapath import abi as wire
from unit_dp import (LO_IFINDEX, LOCAL_OVERLAY, OVL_DMAC, OVL_SMAC, PATHS, PEER, PEER_OVERLAY,
                     TC_ACT_REDIRECT, TC_ACT_SHOT, UDP_PORT, XDP_DROP, XDP_PASS, XDP_TX, drops_delta,
                     now_us)

# every test here runs against mrc_rx (XDP) and mrc_rx_tc (tc ingress)
pytestmark = pytest.mark.usefixtures("rx_hook")

R = wire.Reason
V4_SRC, V4_DST = PATHS[0].daddr, PATHS[0].saddr
V6_SRC, V6_DST = PATHS[1].daddr, PATHS[1].saddr


@pytest.fixture
def hd(dp):
    rx, tx = configure(dp)
    dp.rxm, dp.txm = rx, tx
    return dp


def inner_tcp(seq: int = 1000, n: int = 200) -> bytes:
    return pkt.ipv4(PEER_OVERLAY, LOCAL_OVERLAY, pkt.IPPROTO_TCP, pkt.tcp(5201, 40001, seq, b"p" * n))


def frame(family: int = 4, *, inner: bytes | None = None, **kw) -> bytes:
    """An MRC frame from the peer (unit_pkt.mrc_frame) carrying inner_tcp()."""
    return pkt.mrc_frame(family, inner=inner_tcp() if inner is None else inner, **kw)


_psn = [1000]


def fresh(**kw) -> dict:
    """A new PSN per accepted DATA frame: duplicate suppression is tested on
    its own below."""
    _psn[0] += 1
    kw.setdefault("psn", _psn[0])
    return kw


delta = drops_delta


def rx(dp, f: bytes, verdict: int, reason: R | None, ingress: int | None = None) -> bytes:
    model = dp.rxm.verdict(f, ingress or LO_IFINDEX)
    assert (model.action, model.reason) == (verdict, reason), f"model disagrees: {model}"
    before = dp.drops()
    ret, out = dp.run_rx(f, ingress)
    assert ret == verdict, f"expected {verdict} ({reason}), got {ret}"
    assert delta(before, dp.drops()) == ({reason: 1} if reason is not None else {})
    if model.out is not None:
        assert out == model.out
    return out


def untouched(dp, f: bytes) -> None:
    assert rx(dp, f, XDP_PASS, None) == f


# ------------------------------------------------------------------ sources

def test_only_configured_peers_are_accepted(hd):
    out = rx(hd, frame(**fresh()), XDP_PASS, None)
    assert out[14:] == inner_tcp()
    rx(hd, frame(6, **fresh()), XDP_PASS, None)
    for src in ("203.0.113.9", "192.0.2.3", "0.0.0.0", "255.255.255.255", "127.0.0.1", V4_DST):
        if src == V4_DST:
            continue                           # our own address on lo is configured in unit_dp
        rx(hd, frame(src=src, **fresh()), XDP_DROP, R.RX_UNKNOWN_PEER)
    for src in ("fd00:99::2", "::", "::1", "fe80::1", "ff02::1"):
        rx(hd, frame(6, src=src, **fresh()), XDP_DROP, R.RX_UNKNOWN_PEER)


def test_known_source_on_the_wrong_plane_is_spoofed(hd, veth):
    """Each source is accepted on its own plane device only."""
    hd.add_rx_peer(OTHER_PLANE_SRC, ifindex=veth)
    hd.rxm.add_source(OTHER_PLANE_SRC, PEER, ifindex=veth)
    f = frame(src=OTHER_PLANE_SRC, **fresh())
    rx(hd, f, XDP_DROP, R.RX_UNKNOWN_PEER)                       # arrives on lo
    assert rx(hd, frame(src=OTHER_PLANE_SRC, **fresh()), XDP_PASS, None, ingress=veth)[14:] == inner_tcp()
    rx(hd, frame(**fresh()), XDP_DROP, R.RX_UNKNOWN_PEER, ingress=veth)   # a lo source on the veth


def test_removed_peer_is_refused(hd):
    rx(hd, frame(src=EMPTY_PEER_SRC, **fresh()), XDP_DROP, R.RX_UNKNOWN_PEER)


def test_family_mismatch_is_spoofed(hd):
    """An IPv4-mapped IPv6 source is not the IPv4 peer."""
    rx(hd, frame(6, src=f"::ffff:{V4_SRC}", **fresh()), XDP_DROP, R.RX_UNKNOWN_PEER)


def test_probes_from_strangers_are_not_answered(hd):
    """No reflection: only configured peers get a reply, and the reply is
    never bigger than the probe."""
    probe = dict(type=wire.MsgType.PROBE, inner=b"", tx_ts=1234, path_id=5)
    rx(hd, frame(src="203.0.113.9", **probe), XDP_DROP, R.RX_UNKNOWN_PEER)
    rx(hd, frame(src=OTHER_PLANE_SRC, **probe), XDP_DROP, R.RX_UNKNOWN_PEER)
    for fam in (4, 6):
        f = frame(fam, **probe)
        out = rx(hd, f, XDP_TX, R.RX_PROBE_REPLIED)
        assert len(out) == len(f)


def test_forged_probe_replies_and_feedback_do_not_revive_paths(hd):
    """Replies from strangers pass as someone else's traffic; a reply or an
    echo dated in the future (a forged RTT) is ignored as evidence."""
    reply = dict(type=wire.MsgType.PROBE_REPLY, inner=b"", sport=UDP_PORT, dport=49154, path_id=2)
    untouched(hd, frame(src="203.0.113.9", tx_ts=now_us(), **reply))
    assert hd.live(2).last_ack_ns == 0
    rx(hd, frame(tx_ts=now_us() + 1_000_000, **reply, **sent(hd, 2, 1)), XDP_DROP, R.RX_PROBE_REPLY)
    rx(hd, frame(flags=wire.MRC_F_FEEDBACK, fb_path=1, fb_ts=now_us() + 1_000_000, **fresh()), XDP_PASS, None)
    assert hd.live(1).last_ack_ns == 0 and hd.live(2).last_ack_ns == 0
    # and a genuine one is taken
    rx(hd, frame(tx_ts=now_us() - 100, **reply, **sent(hd, 2, 2)), XDP_DROP, R.RX_PROBE_REPLY)
    assert hd.live(2).last_ack_ns > 0


def sent(dp, path: int, seq: int, nonce: int | None = None) -> dict:
    """Probe `seq` of `path` as the agent sends it (its nonce recorded in
    the datapath and in the model): the header fields its reply echoes."""
    hdr = dp.probe_sent(path, seq, nonce=nonce)
    add = getattr(dp.rxm, "add_probe", None)
    if add:
        add(PEER, path, seq, hdr["seq0"] << 32 | hdr["fb_ts"])
    return hdr


def test_probe_reply_must_echo_the_probes_nonce(hd):
    """Issue #13.8: a reply changes state only if it echoes the nonce of a
    probe the agent sent with that sequence number. A reply without one
    (a blind forger), with another probe's nonce or sequence, or for a probe
    pushed out of the ring is dropped before it takes an RTT sample or
    counts toward recovery."""
    reply = dict(type=wire.MsgType.PROBE_REPLY, inner=b"", sport=UDP_PORT, dport=49154, path_id=2)
    a = sent(hd, 2, 7)
    b = sent(hd, 2, 8)
    forged = [dict(psn=7),                                            # no nonce at all
              dict(psn=7, seq0=a["seq0"], fb_ts=a["fb_ts"] ^ 1),      # a wrong nonce
              dict(psn=7, seq0=b["seq0"], fb_ts=b["fb_ts"]),          # probe 8's nonce for 7
              dict(psn=15, seq0=a["seq0"], fb_ts=a["fb_ts"])]         # same slot, another seq
    for hdr in forged:
        before = hd.drops()
        ret, _ = hd.run_rx(frame(tx_ts=now_us() - 100, **reply, **hdr))
        assert ret == XDP_DROP
        assert delta(before, hd.drops()) == {getattr(R, "RX_BAD_NONCE", None): 1}, hdr
        assert hd.live(2).last_ack_ns == 0 and hd.live(2).rtt_us == 0, f"forged reply {hdr} taken"
    if hasattr(R, "RX_BAD_NONCE"):
        rx(hd, frame(tx_ts=now_us() - 100, **reply, psn=7), XDP_DROP, R.RX_BAD_NONCE)
    # the genuine replies are taken
    rx(hd, frame(tx_ts=now_us() - 100, **reply, **a), XDP_DROP, R.RX_PROBE_REPLY)
    assert hd.live(2).last_ack_ns > 0
    rx(hd, frame(tx_ts=now_us() - 100, **reply, **b), XDP_DROP, R.RX_PROBE_REPLY)
    # a probe pushed out of the ring by a newer one in its slot no longer counts
    sent(hd, 2, 7 + wire.MRC_PROBE_RING if hasattr(wire, "MRC_PROBE_RING") else 15)
    if hasattr(R, "RX_BAD_NONCE"):
        rx(hd, frame(tx_ts=now_us() - 100, **reply, **a), XDP_DROP, R.RX_BAD_NONCE)
    # a forged reply cannot recover a retired path either
    hd.set_live(1, state=wire.PathState.ASSUMED_BAD, bad_ns=time.monotonic_ns() - 10_000_000)
    for seq in range(1, 10):
        hd.run_rx(frame(6, type=wire.MsgType.PROBE_REPLY, inner=b"", sport=UDP_PORT, dport=49153,
                        path_id=1, psn=seq, tx_ts=now_us() - 100))
    assert hd.live(1).state == wire.PathState.ASSUMED_BAD


# ------------------------------------------------------------------ inner addresses (issue #13.7)

def inner_from(src: str, dst: str = LOCAL_OVERLAY) -> bytes:
    return pkt.ipv4(src, dst, pkt.IPPROTO_UDP, pkt.udp(5201, 40000, b"s" * 64))


def reason(name: str) -> R:
    """By name, so that the test runs (and fails) against a datapath that
    does not know the reason yet."""
    return getattr(R, name, None)


@pytest.mark.parametrize("family", [4, 6])
def test_spoofed_inner_source_is_dropped(hd, family):
    """A configured peer may send only its own overlay address as inner
    source: another peer's, ours, an unused overlay address, a broadcast or
    0.0.0.0 is dropped before it changes any state."""
    wide = "10.99.0.9"                       # WIDE_PEER's overlay address (fuzzgen)
    for src in (wide, LOCAL_OVERLAY, "10.99.0.77", "10.99.0.255", "0.0.0.0", "8.8.8.8"):
        st0 = hd.stats(0 if family == 4 else 1)
        before = hd.drops()
        ret, _ = hd.run_rx(frame(family, inner=inner_from(src), **fresh()))
        assert ret == XDP_DROP, f"inner source {src} delivered"
        assert delta(before, hd.drops()) == {reason("RX_INNER_SRC"): 1}
        st1 = hd.stats(0 if family == 4 else 1)
        assert st1.rx_packets == st0.rx_packets, "a refused frame moved the path's counters"
        rx(hd, frame(family, inner=inner_from(src), **fresh()), XDP_DROP, reason("RX_INNER_SRC"))
    # the peer's own address is delivered, and a prefix routed to it (issue #14) too
    rx(hd, frame(family, inner=inner_from(PEER_OVERLAY), **fresh()), XDP_PASS, None)
    hd.set_owner("10.77.0.0/16", PEER)
    hd.rxm.add_owner("10.77.0.0/16", PEER)
    rx(hd, frame(family, inner=inner_from("10.77.1.2"), **fresh()), XDP_PASS, None)
    # ... but not to another peer: WIDE_PEER's own address is WIDE_PEER's only
    rx(hd, frame(family, inner=inner_from(wide), **fresh()), XDP_DROP, reason("RX_INNER_SRC"))


def test_inner_destination_must_be_ours(hd):
    """The inner destination must be served here: another overlay address
    (the peer itself, a third host, broadcast, a routed prefix of the peer)
    is not ours to deliver."""
    for dst in (PEER_OVERLAY, "10.99.0.9", "10.99.0.77", "10.99.0.255", "255.255.255.255", "192.0.2.1"):
        before = hd.drops()
        ret, _ = hd.run_rx(frame(inner=inner_from(PEER_OVERLAY, dst), **fresh()))
        assert ret == XDP_DROP, f"inner destination {dst} delivered"
        assert delta(before, hd.drops()) == {reason("RX_INNER_DST"): 1}
        rx(hd, frame(inner=inner_from(PEER_OVERLAY, dst), **fresh()), XDP_DROP, reason("RX_INNER_DST"))
    rx(hd, frame(inner=inner_from(PEER_OVERLAY, LOCAL_OVERLAY), **fresh()), XDP_PASS, None)


def test_path_id_of_another_plane_is_dropped(hd):
    """A frame on plane 0 naming a path of plane 1 or 2 (DATA or
    PROBE_REPLY) is dropped and moves nothing of that path."""
    v4_plane0 = dict(src=PATHS[0].daddr, dst=PATHS[0].saddr)
    for pid in (1, 3):                                          # planes 1 and 2
        st0 = hd.stats(pid)
        before = hd.drops()
        ret, _ = hd.run_rx(frame(path_id=pid, **v4_plane0, **fresh()))
        assert ret == XDP_DROP, f"path {pid} (plane {PATHS[pid].plane}) accepted on plane 0"
        assert delta(before, hd.drops()) == {reason("RX_WRONG_PLANE"): 1}
        assert hd.stats(pid).rx_packets == st0.rx_packets
        rx(hd, frame(path_id=pid, **v4_plane0, **fresh()), XDP_DROP, reason("RX_WRONG_PLANE"))
    # a probe reply naming path 3 (plane 2) on plane 0 takes no RTT sample
    reply = dict(type=wire.MsgType.PROBE_REPLY, inner=b"", sport=UDP_PORT, dport=49155, path_id=3,
                 tx_ts=now_us() - 100, **sent(hd, 3, 1))
    rx(hd, frame(**v4_plane0, **reply), XDP_DROP, reason("RX_WRONG_PLANE"))
    assert hd.live(3).last_ack_ns == 0
    # IPv6 (plane 1) naming path 0 (plane 0)
    rx(hd, frame(6, path_id=0, **fresh()), XDP_DROP, reason("RX_WRONG_PLANE"))
    # each on its own plane is accepted
    rx(hd, frame(path_id=2, **v4_plane0, **fresh()), XDP_PASS, None)           # path 2: plane 0 too
    rx(hd, frame(path_id=3, **fresh()), XDP_PASS, None)                         # from plane 2's address
    rx(hd, frame(6, path_id=1, **fresh()), XDP_PASS, None)
    rx(hd, frame(**reply), XDP_DROP, R.RX_PROBE_REPLY)
    assert hd.live(3).last_ack_ns > 0


# ------------------------------------------------------------------ malformed

@pytest.mark.parametrize("family", [4, 6])
def test_truncated_anywhere_in_the_mrc_header(hd, family):
    f = frame(family, **fresh())
    l3 = 20 if family == 4 else 40
    # cut inside the UDP header: too short to tell whose it is
    for cut in range(14 + l3, 14 + l3 + 8):
        untouched(hd, f[:cut])
    # UDP header to the MRC port present: ours, cut short -> truncated
    for cut in range(14 + l3 + 8, 14 + l3 + 8 + wire.MRC_HDR_LEN + 1, 3):
        rx(hd, f[:cut], XDP_DROP, R.RX_TRUNCATED)


@pytest.mark.parametrize("family", [4, 6])
def test_lengths_that_lie(hd, family):
    f = frame(family, **fresh())
    l3 = 20 if family == 4 else 40
    ulen_off = 14 + l3 + 4
    n_ip = len(f) - 14
    iplen_off, iplen = (16, n_ip) if family == 4 else (18, n_ip - 40)

    def patched(off, value):
        b = bytearray(f)
        struct.pack_into("!H", b, off, value & 0xFFFF)
        return bytes(b)
    rx(hd, patched(iplen_off, iplen + 1), XDP_DROP, R.RX_TRUNCATED)      # IP claims more than the frame
    rx(hd, patched(iplen_off, 0xFFFF), XDP_DROP, R.RX_TRUNCATED)
    rx(hd, patched(iplen_off, l3 + 8 + 27 - (l3 if family == 6 else 0)), XDP_DROP, R.RX_TRUNCATED)
    rx(hd, patched(ulen_off, len(f) - 14 - l3 + 1), XDP_DROP, R.RX_TRUNCATED)  # UDP beyond IP
    rx(hd, patched(ulen_off, 8 + 27), XDP_DROP, R.RX_TRUNCATED)               # no room for MRC
    rx(hd, patched(ulen_off, 0), XDP_DROP, R.RX_TRUNCATED)


def test_inner_packet_cut_or_not_ip(hd):
    rx(hd, frame(inner=b"", **fresh()), XDP_DROP, R.RX_BAD_INNER)
    rx(hd, frame(inner=inner_tcp()[:19], **fresh()), XDP_DROP, R.RX_BAD_INNER)
    v6 = pkt.ipv6("fd99::2", "fd99::1", 17, pkt.udp(1, 2, b"x" * 30))
    rx(hd, frame(inner=v6[:39], **fresh()), XDP_DROP, R.RX_BAD_INNER)     # IPv6 cut short
    for nibble in (0x00, 0x50, 0x70, 0xF0):                                   # neither family
        rx(hd, frame(inner=bytes([nibble | (v6[0] & 0x0F)]) + v6[1:], **fresh()), XDP_DROP, R.RX_BAD_INNER)
    bad_ihl = bytearray(inner_tcp())
    bad_ihl[0] = 0x44
    rx(hd, frame(inner=bytes(bad_ihl), **fresh()), XDP_DROP, R.RX_BAD_INNER)


def test_inner_ipv6_bound_to_the_peer(hd):
    """Inner IPv6 is delivered only from an address or prefix the sending
    peer owns (mrc_ovl_owner, family-tagged) to one served here; an IPv4
    prefix never covers an IPv6 address (::ffff:a.b.c.d, ::a.b.c.d)."""
    def v6(src, dst):
        return pkt.ipv6(src, dst, pkt.IPPROTO_TCP, pkt.tcp(5201, 40001, 7, b"q" * 60))
    out = rx(hd, frame(inner=v6("fd99::2", "fd99::1"), **fresh()), XDP_PASS, None)
    assert out[12:14] == b"\x86\xdd" and out[14:] == v6("fd99::2", "fd99::1")
    rx(hd, frame(6, inner=v6("fd77::42", "fd99::1"), **fresh()), XDP_PASS, None)   # the peer's prefix
    for src in ("fd99::77", "fd78::1", "::ffff:10.99.0.2", "::10.99.0.2", "fd99::1"):
        rx(hd, frame(inner=v6(src, "fd99::1"), **fresh()), XDP_DROP, R.RX_INNER_SRC)
    for dst in ("fd99::2", "fd99::77", "::ffff:10.99.0.1", "ff02::1"):
        rx(hd, frame(inner=v6("fd99::2", dst), **fresh()), XDP_DROP, R.RX_INNER_DST)


@pytest.mark.parametrize("family", [4, 6])
def test_congestion_mark_on_a_transport_that_cannot_hear_it(hd, family):
    """RFC 6040: outer CE over a not-ECT inner packet is dropped; over an
    ECT one it is merged into the inner header (model and program agree)."""
    ce = {"tos": 0x03} if family == 4 else {"tc": 0x03}
    rx(hd, frame(family, ip_kw=ce, path_id=0 if family == 4 else 1, **fresh()), XDP_DROP, R.RX_ECN_NOT_ECT)
    ect = pkt.ipv4(PEER_OVERLAY, LOCAL_OVERLAY, pkt.IPPROTO_TCP, pkt.tcp(5201, 40001, 1, b"p" * 50), tos=0x02)
    out = rx(hd, frame(family, inner=ect, ip_kw=ce, path_id=0 if family == 4 else 1, **fresh()), XDP_PASS, None)
    assert out[15] & 0x03 == 0x03 and wire.inet_csum(out[14:34]) == 0


@pytest.mark.parametrize("version", [0, 2, 3, 15])
def test_wrong_version(hd, version):
    rx(hd, frame(version=version, **fresh()), XDP_DROP, R.RX_BAD_VERSION)
    rx(hd, frame(6, version=version, type=wire.MsgType.PROBE, inner=b""), XDP_DROP, R.RX_BAD_VERSION)


def test_unknown_type_and_path(hd):
    for t in (5, 7, 15):
        rx(hd, frame(type=t, **fresh()), XDP_DROP, R.RX_BAD_TYPE)
    # an EV trace that reached us (its sender meant a router to answer it)
    # is dropped unverified, even with a MAC flag it cannot prove
    for flags in (0, wire.MRC_F_AUTH):
        rx(hd, frame(type=wire.MsgType.TRACE, flags=flags, **fresh()), XDP_DROP, R.RX_TRACE)
    # a feedback frame is consumed, never delivered, whatever it carries
    rx(hd, frame(type=wire.MsgType.FEEDBACK, **fresh()), XDP_DROP, R.RX_FEEDBACK)
    rx(hd, frame(type=wire.MsgType.FEEDBACK, flags=wire.MRC_F_FEEDBACK, fb_path=0xFF,
                 fb_ts=now_us(), **fresh()), XDP_DROP, R.RX_FEEDBACK)
    for p in (len(PATHS), 255, 256, 0xFFFF):
        rx(hd, frame(path_id=p, **fresh()), XDP_DROP, R.RX_UNKNOWN_PATH)


def test_ip_fragments(hd):
    """A first fragment to the MRC port is dropped (mrc never fragments, and
    without it the datagram never reassembles); later fragments carry no
    ports and pass to the stack, which discards them at reassembly."""
    rx(hd, frame(ip_kw={"df": False, "mf": True}, **fresh()), XDP_DROP, R.RX_FRAGMENT)
    later = frame(ip_kw={"df": False, "frag_off": 185}, **fresh())
    assert rx(hd, later, XDP_PASS, R.RX_PASS_FRAGMENT) == later
    body = pkt.udp(49153, UDP_PORT, wire.encode_mrc_hdr(**fresh()) + inner_tcp())
    e6 = pkt.eth(OUR_MAC, PEER_MAC, pkt.ETH_P_IPV6)
    first6 = e6 + pkt.ipv6(V6_SRC, V6_DST, pkt.IPV6_FRAGMENT, pkt.ip6_frag(pkt.IPPROTO_UDP) + body)
    rx(hd, first6, XDP_DROP, R.RX_FRAGMENT)
    whole6 = e6 + pkt.ipv6(V6_SRC, V6_DST, pkt.IPV6_FRAGMENT, pkt.ip6_frag(pkt.IPPROTO_UDP, more=False) + body)
    rx(hd, whole6, XDP_DROP, R.RX_FRAGMENT)                      # atomic fragment: still not ours to take
    later6 = e6 + pkt.ipv6(V6_SRC, V6_DST, pkt.IPV6_FRAGMENT, pkt.ip6_frag(pkt.IPPROTO_UDP, offset=20) + body)
    assert rx(hd, later6, XDP_PASS, R.RX_PASS_FRAGMENT) == later6


@pytest.mark.parametrize("words", [1, 2, 10])
def test_ip_options(hd, words):
    opts = (b"\x94\x04\x00\x00" + b"\x01" * 4 * (words - 1))[:4 * words]
    rx(hd, frame(ip_kw={"options": opts}, **fresh()), XDP_DROP, R.RX_IP_OPTIONS)
    # options on a frame that only comes *from* the MRC port: not ours
    untouched(hd, frame(ip_kw={"options": opts}, sport=UDP_PORT, dport=40000, type=wire.MsgType.PROBE_REPLY,
                        inner=b""))


@pytest.mark.parametrize("tags", [[pkt.ETH_P_8021Q], [0x88A8, pkt.ETH_P_8021Q]], ids=["802.1Q", "QinQ"])
def test_vlan_tagged_frames_are_not_ours(hd, tags):
    """mrc never sends tagged frames: a tagged frame belongs to a VLAN
    device, not to the plane, and goes to the stack untouched, counted."""
    f = frame(**fresh())
    tagged = f[:12] + b"".join(struct.pack("!HH", t, 100) for t in tags) + f[12:]
    assert rx(hd, tagged, XDP_PASS, R.RX_PASS_VLAN) == tagged


def test_oversized_frames(hd):
    """Ethernet padding beyond the IP length is kept behind the inner packet
    (the stack trims to the inner IP length); a jumbo frame as large as XDP
    takes is decapsulated byte for byte."""
    f = frame(**fresh()) + bytes(200)
    assert rx(hd, f, XDP_PASS, None)[14:14 + len(inner_tcp())] == inner_tcp()
    big = inner_tcp(n=3300)
    f = frame(inner=big, **fresh())
    assert len(f) > 3400
    assert rx(hd, f, XDP_PASS, None)[14:] == big


def test_garbage_segment_fields_keep_the_psn_in_the_unit(hd):
    """segs/seg_size/seq0 are the sender's word: a segment index beyond the
    unit is ignored, so a hostile header cannot move the receiver's PSN
    window by more than the unit it claims."""
    base = _psn[0] + 100
    _psn[0] += 200
    f = frame(psn=base, segs=4, seg_size=1, seq0=0, inner=inner_tcp(seq=0x7FFFFFFF))
    rx(hd, f, XDP_PASS, None)
    assert rxmodel.data_psn_index(f, 14 + 20 + 8) == 0


# ------------------------------------------------------------------ replay

def test_replayed_hedge_copy_is_dropped_in_window(hd):
    """The second copy of a hedged packet (MRC_F_HEDGE) inside the dedup
    window is dropped and counted; a replay of plain DATA is delivered (the
    inner TCP discards it) and counted as a duplicate in the path stats."""
    if not hasattr(wire, "MRC_DEDUP_WORDS"):
        pytest.skip("no duplicate window in this datapath (issue 3)")
    psn = _psn[0] + 10
    _psn[0] += 20
    f = frame(psn=psn, flags=wire.MRC_F_HEDGE)
    rx(hd, f, XDP_PASS, None)
    for _ in range(3):
        before = hd.drops()
        ret, _ = hd.run_rx(f)
        assert ret == XDP_DROP
        assert delta(before, hd.drops()) == {R.RX_DUPLICATE: 1}
    plain = frame(psn=psn + 1)
    rx(hd, plain, XDP_PASS, None)
    dup0 = hd.stats(0).rx_dup
    rx(hd, plain, XDP_PASS, None)
    assert hd.stats(0).rx_dup == dup0 + 1


def test_replay_older_than_the_window(hd):
    """A hedged copy older than the dedup window cannot be told from a
    first copy: it is delivered (TCP discards the stale segment) and counted
    late in the path stats."""
    if not hasattr(wire, "MRC_DEDUP_WORDS"):
        pytest.skip("no duplicate window in this datapath (issue 3)")
    window = wire.MRC_DEDUP_WORDS * 32
    psn = _psn[0] + 10
    old = frame(psn=psn, flags=wire.MRC_F_HEDGE)
    rx(hd, old, XDP_PASS, None)
    newer = psn + window        # same dedup word, one window later
    # the top first moves up with plain DATA: a hedged copy that far above
    # it would not be marked (rx_hedge_ahead, bpf/dedup.h)
    rx(hd, frame(psn=newer - 1), XDP_PASS, None)
    rx(hd, frame(psn=newer, flags=wire.MRC_F_HEDGE), XDP_PASS, None)
    _psn[0] = newer + 10
    late0 = hd.stats(0).rx_late
    rx(hd, old, XDP_PASS, None)
    assert hd.stats(0).rx_late == late0 + 1


# ------------------------------------------------------------------ transmit side

def overlay(dst: str = PEER_OVERLAY, ethertype: int = pkt.ETH_P_IP, body: bytes | None = None) -> bytes:
    if body is not None:
        return pkt.overlay(body, ethertype=ethertype)
    return pkt.overlay(pkt.udp(40000, 5201, b"u" * 64), dst=dst)


def tx(dp, f: bytes, verdict: int, reason: R | None) -> bytes:
    model = dp.txm.verdict(f)
    assert (model.action, model.reason) == (verdict, reason)
    before = dp.drops()
    ret, out = dp.run_tx(f)
    assert ret == verdict
    assert delta(before, dp.drops()) == ({reason: 1} if reason is not None else {})
    return out


def test_tx_refuses_what_it_cannot_carry(hd):
    tx(hd, overlay(), TC_ACT_REDIRECT, None)
    tx(hd, overlay("10.99.0.77"), TC_ACT_SHOT, R.TX_NO_PEER)
    tx(hd, overlay("255.255.255.255"), TC_ACT_SHOT, R.TX_NO_PEER)
    # inner IPv6: the peer's address and a prefix behind it go, others have no peer
    tx(hd, overlay(ethertype=pkt.ETH_P_IPV6, body=pkt.ipv6("fd99::1", "fd99::2", 17, pkt.udp(1, 2, b"x" * 8))),
       TC_ACT_REDIRECT, None)
    tx(hd, overlay(ethertype=pkt.ETH_P_IPV6, body=pkt.ipv6("fd99::1", "fd77::9", 17, pkt.udp(1, 2, b"x" * 8))),
       TC_ACT_REDIRECT, None)
    for dst in ("fd31::2", "ff02::1", "::ffff:10.99.0.2"):
        tx(hd, overlay(ethertype=pkt.ETH_P_IPV6, body=pkt.ipv6("fd99::1", dst, 17, pkt.udp(1, 2, b"x" * 8))),
           TC_ACT_SHOT, R.TX_NO_PEER)
    bad6 = bytearray(pkt.ipv6("fd99::1", "fd99::2", 17, pkt.udp(1, 2, b"x" * 8)))
    bad6[0] = 0x45                                            # IPv4's nibble under ethertype IPv6
    tx(hd, overlay(ethertype=pkt.ETH_P_IPV6, body=bytes(bad6)), TC_ACT_SHOT, R.TX_NOT_IPV4)
    tx(hd, pkt.eth("ff:ff:ff:ff:ff:ff", OVL_SMAC, pkt.ETH_P_ARP) + bytes(28), TC_ACT_SHOT, R.TX_NOT_IPV4)
    tx(hd, pkt.vlan(OVL_DMAC, OVL_SMAC, 5, pkt.ETH_P_IP) + overlay()[14:], TC_ACT_SHOT, R.TX_VLAN)
    bad = bytearray(overlay())
    bad[14] = 0x43                                            # IHL 3
    tx(hd, bytes(bad), TC_ACT_SHOT, R.TX_NOT_IPV4)
    bad[14] = 0x4F                                            # IHL 15 beyond the frame
    tx(hd, bytes(bad[:14 + 40]), TC_ACT_SHOT, R.TX_NOT_IPV4)


def test_tx_peer_without_usable_path(hd):
    hd.set_paths([wire.replace(p, admin=wire.PathState.DENIED) for p in PATHS])
    before = hd.drops()
    ret, _ = hd.run_tx(overlay())
    assert ret == TC_ACT_SHOT
    assert delta(before, hd.drops()) == {R.TX_NO_PATH: 1}
    hd.set_peer(PEER, n_paths=0, overlay=PEER_OVERLAY)
    before = hd.drops()
    ret, _ = hd.run_tx(overlay())
    assert ret == TC_ACT_SHOT
    assert delta(before, hd.drops()) == {R.TX_NO_PEER: 1}


def test_no_crash_on_every_prefix_of_valid_frames(hd):
    """Every truncation of every seed, both programs: the verdict the model
    gives, never an abort."""
    seeds = [frame(**fresh()), frame(6, **fresh()), frame(type=wire.MsgType.PROBE, inner=b""),
             frame(6, type=wire.MsgType.PROBE_REPLY, inner=b"", sport=UDP_PORT, dport=49153)]
    t0 = time.monotonic()
    for s in seeds:
        for cut in range(14, len(s) + 1):
            f = s[:cut]
            if hd.rx_hook == "tc" and rxmodel.test_run_refuses(f):
                with pytest.raises(OSError):     # not runnable as an skb (rxmodel.test_run_refuses)
                    hd.run_rx(f)
                continue
            v = hd.rxm.verdict(f)
            if v.action == XDP_PASS and v.mrc_off is not None:
                _psn[0] += 1
                f = rxmodel.with_wire_psn(f, v.mrc_off, _psn[0])
                v = hd.rxm.verdict(f)
            ret, out = hd.run_rx(f)
            assert ret == v.action, (cut, v)
            if v.out is not None:
                assert out == v.out
    assert time.monotonic() - t0 < 30
