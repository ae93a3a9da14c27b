"""Authentication (issue #13.9, bpf/auth.h) on the real programs: mrc_tx
signs what it sends, mrc_rx delivers only frames whose MAC the peer's key
produced, and turns probes around with a fresh MAC. The MAC is checked
against mrcctl/datapath/auth.py, which test_bpf_helpers.py holds to the
SipHash paper's vectors. Cases are tables inside few tests: each test
loads the programs once."""

from __future__ import annotations

import struct

import unit_pkt as pkt
from unit_dp import (PATHS, PEER, TC_ACT_REDIRECT, UDP_PORT, XDP_DROP, XDP_PASS, XDP_TX,
                     drops_delta)
from unit_pkt import inner_ip, mrc_frame, overlay
from mrcctl.datapath import abi as wire
from mrcctl.datapath.auth import mac

KEY = bytes.fromhex("000102030405060708090a0b0c0d0e0f")
OTHER_KEY = bytes.fromhex("f0e0d0c0b0a090807060504030201000")
R = wire.Reason


def set_key(dp, key: bytes | None, peer: int = PEER):
    dp.maps["mrc_auth"].update(wire.u32(peer), wire.AuthKey.of(key).pack())


def signed(key: bytes | None, *, inner: bytes | None = None, flags: int = wire.MRC_F_AUTH,
           family: int = 4, tamper=None, sign_inner: bytes | None = None, **hdr_kw) -> bytes:
    """An MRC frame from the peer with a MAC behind its header (key None:
    8 zero bytes). sign_inner: sign as if the inner packet were this one."""
    inner = inner_ip() if inner is None else inner
    ports = {k: hdr_kw.pop(k) for k in ("sport", "dport") if k in hdr_kw}
    hdr_kw.setdefault("path_id", 0 if family == 4 else 1)
    hdr = wire.encode_mrc_hdr(flags=flags, **hdr_kw)
    t = hdr_kw.get("type", wire.MsgType.DATA)
    signed_inner = (sign_inner if sign_inner is not None else inner) if t == wire.MsgType.DATA else None
    m = mac(key, hdr, signed_inner) if key else bytes(8)
    if tamper:
        hdr, m = tamper(hdr, m)
    return mrc_frame(family, hdr=hdr + m, inner=inner, **ports)


def test_tx_signs_units_and_the_overhead_grows(dp):
    """mrc_tx with a key: flag AUTH, the MAC behind the header over the
    header and the inner block, 8 more bytes than without; without a key
    nothing changes."""
    inner_tcp = overlay(pkt.tcp(40001, 5201, 7000, b"z" * 300), pkt.IPPROTO_TCP)
    ret, plain = dp.run_tx(inner_tcp)
    assert ret == TC_ACT_REDIRECT and len(plain) == len(inner_tcp) + wire.MRC_OVERHEAD_V4
    assert not wire.decode_mrc_hdr(plain[42:70]).flags & wire.MRC_F_AUTH

    set_key(dp, KEY)
    for desc, frame in (("TCP", inner_tcp),
                        ("UDP", overlay(pkt.udp(40000, 5201, b"u" * 100))),
                        ("ICMP, no ports", overlay(b"\x08\x00" + bytes(30), 1)),
                        ("later fragment: no ports",
                         pkt.eth(*("02:00:00:00:00:bb", "02:00:00:00:00:aa"), pkt.ETH_P_IP)
                         + pkt.ipv4("10.99.0.1", "10.99.0.2", pkt.IPPROTO_UDP, b"f" * 64,
                                    df=False, frag_off=10))):
        ret, out = dp.run_tx(frame)
        assert ret == TC_ACT_REDIRECT, desc
        assert len(out) == len(frame) + wire.MRC_OVERHEAD_V4 + wire.MRC_AUTH_LEN, desc
        hdr = out[42:70]
        assert wire.decode_mrc_hdr(hdr).flags & wire.MRC_F_AUTH, desc
        inner = out[78:]
        assert inner == frame[14:], f"{desc}: inner packet behind the MAC, byte for byte"
        assert out[70:78] == mac(KEY, hdr, inner), desc
        # outer lengths cover the MAC
        assert struct.unpack("!H", out[16:18])[0] == len(out) - 14, desc
        assert struct.unpack("!H", out[38:40])[0] == len(out) - 34, desc

    # IPv6 underlay: the same MAC position behind the header
    dp.set_slots([1])
    ret, out = dp.run_tx(inner_tcp)
    assert ret == TC_ACT_REDIRECT
    assert len(out) == len(inner_tcp) + wire.MRC_OVERHEAD_V6 + wire.MRC_AUTH_LEN
    assert out[90:98] == mac(KEY, out[62:90], out[98:])
    assert out[98:] == inner_tcp[14:]


def test_rx_delivers_only_a_good_mac(dp):
    """mrc_rx with the peer's key: a good MAC is delivered with exact
    output bytes; forged, missing, wrong-key, tampered frames are dropped
    under their reason, before any state moves."""
    set_key(dp, KEY)
    inner = inner_ip(100)
    good = signed(KEY, inner=inner, psn=5)
    before = dp.drops()
    ret, out = dp.run_rx(good)
    assert ret == XDP_PASS
    assert drops_delta(before, dp.drops()) == {}
    assert out == good[:12] + b"\x08\x00" + inner, "outer MACs, IPv4 ethertype, the inner packet"
    assert dp.stats(0).rx_packets == 1

    def flip_psn(h, m):
        return h[:4] + struct.pack("!I", 6) + h[8:], m

    other_tcp = pkt.ipv4(pkt.PEER_OVERLAY, pkt.LOCAL_OVERLAY, pkt.IPPROTO_UDP,
                         pkt.udp(5202, 40000, bytes(100)))
    cases = [
        ("no MAC: the flag clear (a sender without auth)",
         mrc_frame(inner=inner, psn=7), R.RX_NO_MAC),
        ("MAC of another key", signed(OTHER_KEY, inner=inner, psn=8), R.RX_BAD_MAC),
        ("forged: zero MAC", signed(None, inner=inner, psn=9), R.RX_BAD_MAC),
        ("header changed after signing (PSN)", signed(KEY, inner=inner, psn=5, tamper=flip_psn),
         R.RX_BAD_MAC),
        ("inner ports changed after signing", signed(KEY, inner=other_tcp, sign_inner=inner, psn=10),
         R.RX_BAD_MAC),
        ("flag set, MAC cut off", signed(KEY, inner=b"", psn=11)[:-8], R.RX_TRUNCATED),
        ("a signed probe with another key is not turned around",
         signed(OTHER_KEY, type=wire.MsgType.PROBE, inner=b"", path_id=7), R.RX_BAD_MAC),
        ("an unsigned probe is not turned around",
         mrc_frame(type=wire.MsgType.PROBE, inner=b"", path_id=7), R.RX_NO_MAC),
    ]
    for desc, frame, reason in cases:
        before = dp.drops()
        ret, _ = dp.run_rx(frame)
        assert ret == XDP_DROP, desc
        assert drops_delta(before, dp.drops()) == {reason: 1}, desc
    assert dp.stats(0).rx_packets == 1, "no refused frame was accounted"

    # a host without auth refuses frames that carry a MAC it cannot check
    set_key(dp, None)
    before = dp.drops()
    ret, _ = dp.run_rx(signed(KEY, inner=inner, psn=12))
    assert ret == XDP_DROP and drops_delta(before, dp.drops()) == {R.RX_BAD_MAC: 1}
    ret, out = dp.run_rx(mrc_frame(inner=inner, psn=13))
    assert ret == XDP_PASS and out[14:] == inner, "without auth on either end: as before"


def test_probe_turn_around_is_signed_anew(dp):
    """A signed probe comes back as a PROBE_REPLY whose MAC covers the new
    type; the reply is accepted by the prober's check (genuine nonce)."""
    set_key(dp, KEY)
    for family in (4, 6):
        probe = signed(KEY, type=wire.MsgType.PROBE, inner=b"", path_id=7, tx_ts=4242,
                       family=family, sport=49160, seq0=0x01020304, fb_ts=0x05060708)
        before = dp.drops()
        ret, out = dp.run_rx(probe)
        assert ret == XDP_TX, family
        assert drops_delta(before, dp.drops()) == {R.RX_PROBE_REPLIED: 1}
        assert len(out) == len(probe)
        moff = 14 + (20 if family == 4 else 40) + 8
        h = wire.decode_mrc_hdr(out[moff:moff + 28])
        assert h.type == wire.MsgType.PROBE_REPLY and h.flags & wire.MRC_F_AUTH
        assert out[moff + 28:moff + 36] == mac(KEY, out[moff:moff + 28]), family
        assert out[moff + 28:moff + 36] != probe[moff + 28:moff + 36]

    # a signed reply to our own probe counts; the same reply unsigned does not
    sent = dp.probe_sent(2, 1)
    reply = signed(KEY, type=wire.MsgType.PROBE_REPLY, inner=b"", path_id=2,
                   sport=UDP_PORT, dport=PATHS[2].ev, **sent)
    before = dp.drops()
    ret, _ = dp.run_rx(reply)
    assert ret == XDP_DROP and drops_delta(before, dp.drops()) == {R.RX_PROBE_REPLY: 1}
    unsigned = mrc_frame(type=wire.MsgType.PROBE_REPLY, inner=b"", path_id=2, sport=UDP_PORT,
                         dport=PATHS[2].ev, **dp.probe_sent(2, 2))
    before = dp.drops()
    ret, _ = dp.run_rx(unsigned)
    assert ret == XDP_DROP and drops_delta(before, dp.drops()) == {R.RX_NO_MAC: 1}
    assert dp.stats(2).probes_rx == 1


def test_agent_probe_frame_is_accepted(dp):
    """The agent's probe (mrcctl/agent/health.py probe_frame + sign_probe)
    is what mrc_rx accepts and answers."""
    from mrcctl.agent.health import probe_frame, sign_probe
    set_key(dp, KEY)
    # the peer's view: its path toward us is our PATHS[0] mirrored
    p = PATHS[0]
    theirs = wire.Path(ifindex=1, ev=49170, family=4, plane=0, smac=p.dmac, dmac=p.smac,
                       saddr=p.daddr, daddr=p.saddr)
    f = probe_frame(theirs, 0, UDP_PORT, auth=True)
    sign_probe(f, KEY)
    ret, out = dp.run_rx(bytes(f))
    assert ret == XDP_TX
    f2 = probe_frame(theirs, 0, UDP_PORT, auth=True)
    sign_probe(f2, OTHER_KEY)
    before = dp.drops()
    ret, _ = dp.run_rx(bytes(f2))
    assert ret == XDP_DROP and drops_delta(before, dp.drops()) == {R.RX_BAD_MAC: 1}


def test_key_files_and_the_overhead(tmp_path):
    """security.key_file / peer.key_file: 32 hex digits, refused with a
    clear error when other users may read it; the key never appears in a
    message; the overhead (overlay MTU) grows by the MAC when auth is on."""
    import os
    from mrcctl.instance import config as cfgmod

    base = ("[overlay]\naddress = \"10.9.0.1/24\"\n[[plane]]\ndevice = \"p0\"\n"
            '[[peer]]\nname = "b"\noverlay = "10.9.0.2"\nunderlay = {p0 = "192.0.2.2"}\n{peer}\n{sec}')
    k = tmp_path / "cluster.key"
    k.write_text(KEY.hex() + "\n")
    os.chmod(k, 0o600)
    assert cfgmod.read_key("security.key_file", str(k)) == KEY
    os.chmod(k, 0o640)
    assert cfgmod.read_key("security.key_file", str(k)) == KEY, "group-readable is the operator's call"
    os.chmod(k, 0o604)
    try:
        cfgmod.read_key("security.key_file", str(k))
    except cfgmod.ConfigError as e:
        msg = str(e)
        assert "security.key_file" in msg and "every user" in msg and "chmod o-rwx" in msg, msg
        assert KEY.hex() not in msg
    else:
        raise AssertionError("a world-readable key was accepted")
    os.chmod(k, 0o600)
    for text, want in (("abcd", "32 hex digits"), ("zz" * 16, "32 hex digits")):
        k.write_text(text)
        try:
            cfgmod.read_key("security.key_file", str(k))
        except cfgmod.ConfigError as e:
            assert want in str(e) and text not in str(e)
        else:
            raise AssertionError(text)
    try:
        cfgmod.read_key("security.key_file", str(tmp_path / "none"))
    except cfgmod.ConfigError as e:
        assert "no such file" in str(e)

    off = cfgmod.parse(base.replace("{peer}", "").replace("{sec}", ""))
    on = cfgmod.parse(base.replace("{peer}", "").replace("{sec}", f'[security]\nkey_file = "{k}"'))
    pair = cfgmod.parse(base.replace("{peer}", f'key_file = "{k}"').replace("{sec}", ""))
    assert not off.auth and off.overhead() == wire.MRC_OVERHEAD_V4
    assert on.auth and on.overhead() == wire.MRC_OVERHEAD_V4 + wire.MRC_AUTH_LEN
    assert pair.auth and pair.key_file_of(pair.peers[0]) == str(k)
    try:
        cfgmod.parse(base.replace("{peer}", "").replace("{sec}", '[security]\nkey = "x"'))
    except cfgmod.ConfigError as e:
        assert "security.key: unknown key" in str(e)
