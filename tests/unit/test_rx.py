"""mrc_rx (XDP validate / probe / decap) through BPF_PROG_TEST_RUN."""

from __future__ import annotations

import errno
import struct
import time

import pytest

import rxmodel
import unit_pkt as pkt
from unit_dp import (LO_IFINDEX, LOCAL_OVERLAY, OUR_MAC, PATHS, PEER, PEER_MAC, PEER_OVERLAY,
                     TC_ACT_REDIRECT, UDP_PORT, XDP_DROP,
                     XDP_PASS, XDP_TX, drops_delta, now_us)
from mrcctl.datapath import abi as wire

# every test here runs against mrc_rx (XDP) and mrc_rx_tc (tc ingress)
pytestmark = pytest.mark.usefixtures("rx_hook")

inner_ip, mrc_frame = pkt.inner_ip, pkt.mrc_frame


def expect_drop(dp, frame: bytes, reason: wire.Reason, ingress: int | None = None):
    before = dp.drops()
    ret, _ = dp.run_rx(frame, ingress)
    assert ret == XDP_DROP, f"expected drop for {reason.label}, got {ret}"
    assert drops_delta(before, dp.drops()) == {reason: 1}


def expect_pass_untouched(dp, frame: bytes, counted=None):
    before = dp.drops()
    ret, out = dp.run_rx(frame)
    assert ret == XDP_PASS
    assert out == frame
    assert drops_delta(before, dp.drops()) == ({counted: 1} if counted is not None else {})


# --- decapsulation ---------------------------------------------------------

@pytest.mark.parametrize("path", [0, 1], ids=["ipv4", "ipv6"])
def test_tx_then_rx_restores_inner(dp, path):
    dp.set_slots([path])
    # A loopback: what we send comes back to us as from the peer, so here
    # our overlay address is the peer's and the peer's is served here.
    dp.set_owner(LOCAL_OVERLAY, PEER)
    dp.set_owner(PEER_OVERLAY, wire.MRC_OWNER_LOCAL)
    inner = pkt.overlay(pkt.tcp(40001, 5201, 99, b"z" * 700), pkt.IPPROTO_TCP)
    ret, outer = dp.run_tx(inner)
    assert ret == TC_ACT_REDIRECT
    ret, out = dp.run_rx(outer)
    assert ret == XDP_PASS
    # the inner IPv4 packet byte for byte, behind an Ethernet header made of
    # the outer MACs and ethertype IPv4
    assert out[14:] == inner[14:]
    assert out[:12] == outer[:12]
    assert out[12:14] == b"\x08\x00"
    assert len(out) == len(inner)
    st = dp.stats(path)
    assert st.rx_packets == 1 and st.rx_bytes == len(outer)
    assert dp.drops() == {r: 0 for r in wire.Reason}


def test_rx_updates_receiver_state(dp):
    t0 = time.monotonic_ns()
    ret, out = dp.run_rx(mrc_frame(path_id=3, psn=10, tx_ts=123456))
    assert ret == XDP_PASS
    live = dp.live(3)
    assert live.last_rx_ts == 123456
    assert t0 <= live.last_rx_ns <= time.monotonic_ns()
    assert dp.seq().rx_psn_max == 10
    assert dp.stats(3).rx_packets == 1


def test_decap_ipv6_underlay_frame(dp):
    inner = inner_ip(300)
    frame = mrc_frame(6, inner=inner, path_id=1)
    ret, out = dp.run_rx(frame)
    assert ret == XDP_PASS
    assert out == wire.mac_bytes(OUR_MAC) + wire.mac_bytes(PEER_MAC) + b"\x08\x00" + inner


def test_ethernet_padding_is_tolerated(dp):
    frame = mrc_frame() + bytes(10)    # trailing bytes beyond IP tot_len
    ret, out = dp.run_rx(frame)
    assert ret == XDP_PASS
    assert out[14:14 + len(inner_ip())] == inner_ip()


# --- not ours: pass untouched ---------------------------------------------

def test_non_mrc_frames_pass_untouched(dp):
    arp = pkt.eth("ff:ff:ff:ff:ff:ff", PEER_MAC, pkt.ETH_P_ARP) + bytes.fromhex(
        "0001080006040001") + bytes(20)
    other_udp = pkt.eth(OUR_MAC, PEER_MAC, pkt.ETH_P_IP) + pkt.ipv4(
        "192.0.2.2", "192.0.2.1", pkt.IPPROTO_UDP, pkt.udp(5353, 53, b"q" * 40))
    tcp = pkt.eth(OUR_MAC, PEER_MAC, pkt.ETH_P_IP) + pkt.ipv4(
        "192.0.2.2", "192.0.2.1", pkt.IPPROTO_TCP, pkt.tcp(4794, 4794, 1, b"t" * 40))
    icmp6 = pkt.eth(OUR_MAC, PEER_MAC, pkt.ETH_P_IPV6) + pkt.ipv6(
        "fd00:1::2", "fd00:1::1", pkt.IPPROTO_ICMPV6, bytes([128, 0, 0, 0, 0, 1, 0, 1]))
    mrc = mrc_frame()
    vlan_mrc = pkt.vlan(OUR_MAC, PEER_MAC, 100, pkt.ETH_P_IP) + mrc[14:]
    # UDP *from* the MRC port that is not a probe reply from a known peer
    from_port_unknown = mrc_frame(src="203.0.113.9", sport=UDP_PORT, dport=33333,
                                  type=wire.MsgType.PROBE_REPLY)
    from_port_data = mrc_frame(sport=UDP_PORT, dport=33333, type=wire.MsgType.DATA)
    # IPv6 with an extension header other than a fragment header
    hbh = bytes([pkt.IPPROTO_UDP, 0, 1, 4, 0, 0, 0, 0]) + pkt.udp(49152, UDP_PORT, bytes(60))
    v6_hbh = pkt.eth(OUR_MAC, PEER_MAC, pkt.ETH_P_IPV6) + pkt.ipv6(
        "fd00:1::2", "fd00:1::1", 0, hbh)
    # IPv4 non-first fragment (no UDP header to judge by)
    frag2 = pkt.eth(OUR_MAC, PEER_MAC, pkt.ETH_P_IP) + pkt.ipv4(
        "192.0.2.2", "192.0.2.1", pkt.IPPROTO_UDP, bytes(64), df=False, frag_off=100)
    for frame in (arp, other_udp, tcp, icmp6, from_port_unknown, from_port_data, v6_hbh):
        expect_pass_untouched(dp, frame)
    # passed too, but counted: a tagged or fragmented MRC frame is a misconfiguration
    expect_pass_untouched(dp, vlan_mrc, wire.Reason.RX_PASS_VLAN)
    expect_pass_untouched(dp, frag2, wire.Reason.RX_PASS_FRAGMENT)


@pytest.mark.parametrize("cut", [14, 14 + 10, 14 + 20, 14 + 20 + 3])
def test_cut_before_udp_ports_passes(dp, cut):
    """Too short to tell whose it is: the stack drops it as malformed."""
    frame = mrc_frame()[:cut]
    if dp.rx_hook == "tc" and rxmodel.test_run_refuses(frame):
        with pytest.raises(OSError) as e:     # not runnable as an skb: see rxmodel
            dp.run_rx(frame)
        assert e.value.errno == errno.EINVAL
        return
    expect_pass_untouched(dp, frame)


# --- malformed MRC: dropped, counted under exactly one reason ---------------

@pytest.mark.parametrize("cut", [14 + 28 + 1, 14 + 28 + 20, 14 + 28 + 27, 14 + 56 + 5,
                                 14 + 56 + 60])
def test_truncated(dp, cut):
    expect_drop(dp, mrc_frame()[:cut], wire.Reason.RX_TRUNCATED)


def test_truncated_ipv6(dp):
    expect_drop(dp, mrc_frame(6)[:14 + 40 + 8 + 10], wire.Reason.RX_TRUNCATED)


def test_udp_length_too_short(dp):
    f = bytearray(mrc_frame())
    struct.pack_into("!H", f, 14 + 20 + 4, 8 + 20)      # UDP len < 8 + MRC header
    expect_drop(dp, bytes(f), wire.Reason.RX_TRUNCATED)


def test_bad_version(dp):
    expect_drop(dp, mrc_frame(version=2), wire.Reason.RX_BAD_VERSION)
    expect_drop(dp, mrc_frame(version=0), wire.Reason.RX_BAD_VERSION)


def test_unknown_peer(dp):
    expect_drop(dp, mrc_frame(src="203.0.113.9"), wire.Reason.RX_UNKNOWN_PEER)
    expect_drop(dp, mrc_frame(6, src="fd00:99::2"), wire.Reason.RX_UNKNOWN_PEER)


def test_source_valid_only_on_its_own_plane(dp, veth):
    """A known source arriving on another plane's device is spoofed."""
    src = "198.51.100.2"
    dp.add_rx_peer(src, ifindex=veth)
    frame = mrc_frame(src=src)
    ret, out = dp.run_rx(frame, ingress=veth)
    assert ret == XDP_PASS and out[14:] == inner_ip()
    expect_drop(dp, frame, wire.Reason.RX_UNKNOWN_PEER, ingress=LO_IFINDEX)
    expect_drop(dp, frame, wire.Reason.RX_UNKNOWN_PEER)    # test_run default: lo
    # and a lo-plane source is refused on the veth
    expect_drop(dp, mrc_frame(), wire.Reason.RX_UNKNOWN_PEER, ingress=veth)


def test_unknown_path(dp):
    expect_drop(dp, mrc_frame(path_id=len(PATHS)), wire.Reason.RX_UNKNOWN_PATH)
    expect_drop(dp, mrc_frame(path_id=0xFFFF), wire.Reason.RX_UNKNOWN_PATH)
    expect_drop(dp, mrc_frame(type=wire.MsgType.PROBE_REPLY, path_id=9),
                wire.Reason.RX_UNKNOWN_PATH)


def test_ip_options(dp):
    f = mrc_frame(ip_kw={"options": b"\x01\x01\x01\x00"})
    expect_drop(dp, f, wire.Reason.RX_IP_OPTIONS)


def test_fragment(dp):
    expect_drop(dp, mrc_frame(ip_kw={"df": False, "mf": True}), wire.Reason.RX_FRAGMENT)
    body = pkt.ip6_frag(pkt.IPPROTO_UDP) + pkt.udp(49153, UDP_PORT, wire.encode_mrc_hdr()
                                                   + inner_ip())
    v6 = pkt.eth(OUR_MAC, PEER_MAC, pkt.ETH_P_IPV6) + pkt.ipv6(
        PATHS[1].daddr, PATHS[1].saddr, pkt.IPV6_FRAGMENT, body)
    expect_drop(dp, v6, wire.Reason.RX_FRAGMENT)


def test_bad_type(dp):
    expect_drop(dp, mrc_frame(type=7), wire.Reason.RX_BAD_TYPE)
    expect_drop(dp, mrc_frame(type=15), wire.Reason.RX_BAD_TYPE)


def test_bad_inner(dp):
    v6inner = pkt.ipv6(
        "fd99::2", "fd99::1", pkt.IPPROTO_UDP, pkt.udp(1, 2, bytes(20)))
    expect_drop(dp, mrc_frame(inner=v6inner[:36]), wire.Reason.RX_BAD_INNER)
    expect_drop(dp, mrc_frame(inner=b"\x55" + v6inner[1:]), wire.Reason.RX_BAD_INNER)
    expect_drop(dp, mrc_frame(inner=inner_ip()[:12]), wire.Reason.RX_BAD_INNER)


def test_counters_only_for_their_path(dp):
    expect_drop(dp, mrc_frame(version=3, path_id=1), wire.Reason.RX_BAD_VERSION)
    assert all(dp.stats(p).rx_packets == 0 for p in range(len(PATHS)))


# --- probes ---------------------------------------------------------------

@pytest.mark.parametrize("family", [4, 6])
def test_probe_is_turned_around(dp, family):
    # our path 7 does not exist here: the reply fed back below names path
    # 2 (or 1 on the IPv6 plane), whose probe 0 the agent sent
    sent = dp.probe_sent(2 if family == 4 else 1, 0)
    probe = mrc_frame(family, type=wire.MsgType.PROBE, path_id=7, tx_ts=4242, inner=b"", sport=49160,
                      **sent)
    before = dp.drops()
    ret, out = dp.run_rx(probe)
    assert ret == XDP_TX
    assert drops_delta(before, dp.drops()) == {wire.Reason.RX_PROBE_REPLIED: 1}
    assert len(out) == len(probe)
    assert out[0:6] == probe[6:12] and out[6:12] == probe[0:6]
    if family == 4:
        ip_in, ip_out = probe[14:34], out[14:34]
        assert ip_out[12:16] == ip_in[16:20] and ip_out[16:20] == ip_in[12:16]
        assert wire.inet_csum(ip_out) == 0
        l4 = 34
    else:
        ip_in, ip_out = probe[14:54], out[14:54]
        assert ip_out[8:24] == ip_in[24:40] and ip_out[24:40] == ip_in[8:24]
        l4 = 54
    sport, dport, _len, ck = struct.unpack("!HHHH", out[l4:l4 + 8])
    assert (sport, dport, ck) == (UDP_PORT, 49160, 0)
    h = wire.decode_mrc_hdr(out[l4 + 8:])
    assert h.type == wire.MsgType.PROBE_REPLY and h.version == 1
    assert h.path_id == 7 and h.tx_ts == 4242
    # and the reply, fed back, is consumed as a probe reply (our path 7
    # does not exist here: rewrite it to path 2, or path 1 on the IPv6
    # plane)
    reply = bytearray(out)
    struct.pack_into("!H", reply, l4 + 8 + 2, 2 if family == 4 else 1)
    before = dp.drops()
    ret, _ = dp.run_rx(bytes(reply))
    assert ret == XDP_DROP
    assert drops_delta(before, dp.drops()) == {wire.Reason.RX_PROBE_REPLY: 1}


def test_probe_reply_records_rtt(dp):
    # t0 before t_sent: a loaded machine may take milliseconds to build the
    # reply and record the probe, and all of that is in the measured RTT
    t0 = time.monotonic_ns()
    t_sent = now_us() - 500
    reply = mrc_frame(type=wire.MsgType.PROBE_REPLY, path_id=2, tx_ts=t_sent, inner=b"",
                      sport=UDP_PORT, dport=PATHS[2].ev, **dp.probe_sent(2, 1))
    before = dp.drops()
    ret, _ = dp.run_rx(reply)
    t1 = time.monotonic_ns()
    assert ret == XDP_DROP
    assert drops_delta(before, dp.drops()) == {wire.Reason.RX_PROBE_REPLY: 1}
    live = dp.live(2)
    assert 500 <= live.rtt_us < 500 + (t1 - t0) // 1000 + 1000
    assert live.srtt_us == live.rtt_us              # first sample seeds srtt
    # last_ack_ns dates the evidence: when the probe was sent
    assert t0 - 500_000 - 1_000_000 <= live.last_ack_ns <= t1 - 500_000 + 1000
    assert dp.stats(2).probes_rx == 1
    assert dp.stats(2).rx_packets == 0
    # a second sample moves srtt by 1/8 of the difference
    ret, _ = dp.run_rx(mrc_frame(type=wire.MsgType.PROBE_REPLY, path_id=2, inner=b"",
                                 tx_ts=now_us() - 8500, sport=UDP_PORT, dport=PATHS[2].ev,
                                 **dp.probe_sent(2, 2)))
    live2 = dp.live(2)
    assert live2.rtt_us >= 8500
    expect = live.srtt_us - (live.srtt_us >> 3) + (live2.rtt_us >> 3)
    assert live2.srtt_us == expect
    assert live2.last_ack_ns >= live.last_ack_ns    # older evidence never moves it back


def test_feedback_updates_last_ack(dp):
    t_sent = now_us() - 300
    t0 = time.monotonic_ns()
    ret, _ = dp.run_rx(mrc_frame(path_id=0, flags=wire.MRC_F_FEEDBACK, fb_path=1,
                                 fb_ts=t_sent))
    assert ret == XDP_PASS
    live = dp.live(1)
    assert live.last_ack_ns > 0
    assert t0 - 300_000 - 1_000_000 <= live.last_ack_ns <= time.monotonic_ns() - 300_000
    assert live.rtt_us >= 300
    assert dp.live(0).last_ack_ns == 0
    # the peer's freshest evidence, and which path gave it (where mrc_tx
    # sends retransmissions)
    assert (dp.seq().ack_max_ns, dp.seq().ack_max_path) == (live.last_ack_ns, 1)
    # without the flag, fb fields are ignored; out-of-range fb_path too
    dp.run_rx(mrc_frame(path_id=0, fb_path=2, fb_ts=t_sent))
    dp.run_rx(mrc_frame(path_id=0, flags=wire.MRC_F_FEEDBACK, fb_path=200, fb_ts=t_sent))
    assert dp.live(2).last_ack_ns == 0


# --- sequence ---------------------------------------------------------------

def test_out_of_order_counted(dp):
    for psn in (1, 2, 4, 3):
        ret, _ = dp.run_rx(mrc_frame(path_id=0, psn=psn))
        assert ret == XDP_PASS
    assert dp.stats(0).rx_ooo == 1
    assert dp.stats(0).rx_packets == 4
    assert dp.seq().rx_psn_max == 4


def test_psn_wraps(dp):
    dp.set_seq(rx_psn_max=0xFFFFFFFD)
    for psn in (0xFFFFFFFE, 0xFFFFFFFF, 0, 1):
        dp.run_rx(mrc_frame(psn=psn))
    assert dp.stats(0).rx_ooo == 0
    assert dp.seq().rx_psn_max == 1


def test_restarted_sender_resyncs(dp):
    dp.run_rx(mrc_frame(psn=50_000_000))
    dp.run_rx(mrc_frame(psn=0))
    assert dp.stats(0).rx_ooo == 0
    assert dp.seq().rx_psn_max == 0


def test_segment_psn_from_inner_tcp_seq(dp):
    """Segment i of a GSO unit carries the unit's header; the receiver adds
    (seq - seq0) / seg_size to the PSN."""
    maxes = []
    for seq in (5000, 7000, 6000, 5000 + 9 * 1000, 8000):
        inner = inner_ip(1000, pkt.IPPROTO_TCP, seq=seq)
        ret, _ = dp.run_rx(mrc_frame(inner=inner, psn=100, segs=4, seg_size=1000, seq0=5000))
        assert ret == XDP_PASS
        maxes.append(dp.seq().rx_psn_max)
    # 5000 -> 100, 7000 -> 102, 6000 -> 101 (out of order), 14000 is beyond
    # the 4-segment unit -> the unit's PSN 100 (a duplicate of the first,
    # bpf/reorder.h), 8000 -> 103
    assert maxes == [100, 102, 102, 102, 103]
    assert dp.stats(0).rx_ooo == 1 and dp.stats(0).rx_dup == 1


def test_gso_unit_accounts_every_wire_psn(dp):
    """A 4-segment unit: XDP sees the sender's software segments one by one,
    tc ingress (whose veth peer keeps TSO) the whole unit as one GSO skb.
    Both hooks must count the same wire packets, bytes, PSNs, duplicates."""
    seq0, seg, n, psn = 10_000, 500, 4, 200
    hdr = dict(psn=psn, segs=n, seg_size=seg, seq0=seq0)

    def unit(first: int, count: int, **kw) -> list[tuple[bytes, int]]:
        """(frame, gso_segs) as this hook receives segments first.. of the unit."""
        if dp.rx_hook == "tc":
            inner = inner_ip(count * seg, pkt.IPPROTO_TCP, seq=seq0 + first * seg)
            return [(mrc_frame(inner=inner, **hdr, **kw), count if count > 1 else 0)]
        return [(mrc_frame(inner=inner_ip(seg, pkt.IPPROTO_TCP, seq=seq0 + i * seg), **hdr, **kw), 0)
                for i in range(first, first + count)]

    wire_len = len(mrc_frame(inner=inner_ip(seg, pkt.IPPROTO_TCP), **hdr))
    for frame, segs in unit(0, n):
        ret, out = dp.run_rx(frame, gso_segs=segs)
        assert ret == XDP_PASS
        assert out[14:] == frame[14 + 20 + 8 + wire.MRC_HDR_LEN:]     # the inner packet, whole
    st = dp.stats(0)
    assert (st.rx_packets, st.rx_bytes, st.rx_ooo, st.rx_dup) == (n, n * wire_len, 0, 0)
    assert dp.seq().rx_psn_max == psn + n - 1

    # the last two segments again: two duplicates, still delivered (TCP drops them)
    for frame, segs in unit(2, 2):
        assert dp.run_rx(frame, gso_segs=segs)[0] == XDP_PASS
    assert dp.stats(0).rx_dup == 2 and dp.stats(0).rx_packets == n + 2

    # a hedged unit's second copy: every segment seen before -> dropped
    before = dp.drops()
    hedged = dict(psn=psn + n, flags=wire.MRC_F_HEDGE)
    hdr.update(hedged)
    for frame, segs in unit(0, n):
        assert dp.run_rx(frame, gso_segs=segs)[0] == XDP_PASS
    for frame, segs in unit(0, n):
        assert dp.run_rx(frame, gso_segs=segs)[0] == XDP_DROP
    per_frame = 1 if dp.rx_hook == "tc" else n
    assert drops_delta(before, dp.drops()) == {wire.Reason.RX_DUPLICATE: per_frame}

    hs = wire.HealthStats.sum(dp.maps["mrc_hstats"].lookup_percpu(wire.u32(0)))
    gso = (hs.rx_gso_units, hs.rx_gso_segs)
    assert gso == ((4, 14) if dp.rx_hook == "tc" else (0, 0))


@pytest.mark.parametrize("rx_hook", ["tc"])
def test_hedged_gso_copy_is_owned_by_its_first_segment(dp):
    """tc ingress gets both copies of a hedged GSO unit as whole buffers, on
    two planes and so possibly on two CPUs at once, their segment loops
    interleaved. The copy that marks the first PSN owns the unit; the other
    is a duplicate however few of its segments the owner has marked yet
    (with "a duplicate only if every segment was seen", each copy sees
    half, both reach TCP: the unit twice). XDP sees one wire segment per
    frame, so only tc ingress has this case."""
    seq0, seg, n = 20_000, 300, 8

    def run(psn: int, first: int, count: int) -> int:
        """The verdict on a buffer of segments first.. of a hedged unit."""
        inner = inner_ip(count * seg, pkt.IPPROTO_TCP, seq=seq0 + first * seg)
        frame = mrc_frame(inner=inner, psn=psn, segs=n, seg_size=seg, seq0=seq0,
                          flags=wire.MRC_F_HEDGE)
        return dp.run_rx(frame, gso_segs=count)[0]

    # the owner's loop has marked segments 0-2 when the twin's buffer runs
    assert run(300, 0, 3) == XDP_PASS
    before = dp.drops()
    assert run(300, 0, n) == XDP_DROP
    assert drops_delta(before, dp.drops()) == {wire.Reason.RX_DUPLICATE: 1}
    # the dropped twin still marked its segments: a buffer that starts at
    # one of them is a duplicate too
    assert run(300, 3, n - 3) == XDP_DROP

    # later segments seen first do not make a buffer with a new first PSN a
    # duplicate: it owns its unit and is delivered (TCP drops the overlap)
    assert run(400, 4, 4) == XDP_PASS
    assert run(400, 0, n) == XDP_PASS
    assert run(400, 0, n) == XDP_DROP
