"""The probe generator (bpf/probe_gen.bpf.c): the agent's probes of a
round sent by one live-frames test run. Its frames must be the AF_PACKET
path's byte for byte (mrcctl/agent/health.py probe_frame, sign_probe),
bar the send time, which the generator takes from the same clock; and
mrc_rx must answer them."""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest

from unit_dp import BPF_DIR, PATHS, PEER, UDP_PORT, XDP_DROP, XDP_TX, drops_delta, need_root
from mrcctl.agent.health import ProbeGen, _OUT, probe_frame, sign_probe
from mrcctl.datapath import abi as wire
from mrcctl.datapath import libbpf
from mrcctl.datapath.netdev import NETDEV_XDP_ACT_NDO_XMIT, xdp_features
from mrcctl.datapath.objects import XDP_REDIRECT

KEY = bytes.fromhex("000102030405060708090a0b0c0d0e0f")
OTHER_KEY = bytes.fromhex("f0e0d0c0b0a090807060504030201000")


class _Dp:
    """What ProbeGen takes of a running instance: its maps by name."""

    def __init__(self, dp):
        self.maps = dp.maps

    def map(self, name):
        return self.maps[name]


def set_key(dp, key, peer=PEER):
    dp.maps["mrc_auth"].update(wire.u32(peer), wire.AuthKey.of(key).pack())


def theirs(p: wire.Path, ifindex: int = 1) -> wire.Path:
    """The peer's view: its path toward us is ours mirrored."""
    return wire.Path(ifindex=ifindex, ev=p.ev + 17, family=p.family, plane=p.plane, smac=p.dmac, dmac=p.smac,
                     saddr=p.daddr, daddr=p.saddr)


def entry(path: wire.Path, path_id: int, seq: int, nonce: int, auth: bool, peer: int = PEER) -> bytes:
    f = probe_frame(path, path_id, UDP_PORT, auth)
    off = len(f) - wire.MRC_HDR_LEN - (wire.MRC_AUTH_LEN if auth else 0)
    return _OUT.pack(path.ifindex, len(f), off, peer, seq, nonce, bytes(f))


def expected(path: wire.Path, path_id: int, seq: int, nonce: int, key: bytes | None, tx_ts: int) -> bytes:
    """What the AF_PACKET path sends for this probe (Prober._send_packet)."""
    f = probe_frame(path, path_id, UDP_PORT, key is not None)
    h = len(f) - (wire.MRC_AUTH_LEN if key else 0) - wire.MRC_HDR_LEN     # the MRC header
    struct.pack_into("!I", f, h + 4, seq)                                   # psn
    struct.pack_into("!I", f, h + 8, tx_ts)
    struct.pack_into("!I", f, h + 16, nonce >> 32)                          # seq0
    struct.pack_into("!I", f, h + 24, nonce & 0xFFFFFFFF)                   # fb_ts
    if key:
        sign_probe(f, key)
    return bytes(f)


_gen = [100]


def run_once(gen: ProbeGen, entries: list[bytes], k: int = 0) -> tuple[int, bytes]:
    """Entry k of a run, by a plain test run: the verdict and the frame
    (a plain run returns the frame instead of sending it)."""
    gen.out.update_batch([wire.u32(i) for i in range(len(entries))], entries)
    _gen[0] += 1
    for i in range(k + 1):
        ret, out, _ = gen.prog.test_run(bytes(wire.MRC_PROBE_FRAME_MAX)
                                        + wire.ProbeRun(gen=_gen[0], n=len(entries)).pack())
    return ret, out


def tx_ts_of(frame: bytes, auth: bool) -> int:
    h = len(frame) - (wire.MRC_AUTH_LEN if auth else 0) - wire.MRC_HDR_LEN
    return struct.unpack_from("!I", frame, h + 8)[0]


def now_us() -> int:
    return time.monotonic_ns() // 1000


def sent_between(ts: int, t0: int, t1: int) -> bool:
    """tx_ts (microseconds mod 2^32) lies in [t0, t1]."""
    return (ts - t0) & 0xFFFFFFFF <= t1 - t0


@pytest.fixture
def gen(dp):
    g = ProbeGen(_Dp(dp))
    yield g
    g.close()


def refused(gen) -> OSError | None:
    """What ProbeGen.check says: None where this host runs live frames,
    else its refusal (some hosts answer EPERM though they run XDP)."""
    try:
        gen.check()
    except OSError as e:
        return e
    return None


def test_generated_probes_are_the_agents_frames(dp, gen):
    """IPv4 and IPv6, with and without a MAC: the frame is probe_frame's
    with psn = seq and the nonce in seq0/fb_ts, signed with the peer's key
    (mrc_auth), sent now (tx_ts, monotonic microseconds), redirected out
    of the entry's ifindex."""
    for key in (None, KEY):
        set_key(dp, key)
        for pid in (0, 1):
            p = PATHS[pid]
            seq, nonce = 7 + pid, int.from_bytes(os.urandom(8), "big") | 1
            t0 = now_us()
            ret, out = run_once(gen, [entry(p, pid, seq, nonce, key is not None)])
            t1 = now_us()
            assert ret == XDP_REDIRECT
            ts = tx_ts_of(out, key is not None)
            assert sent_between(ts, t0, t1)
            assert out == expected(p, pid, seq, nonce, key, ts), (key, pid)
            hdr = wire.decode_mrc_hdr(out[-wire.MRC_HDR_LEN - (8 if key else 0):][:wire.MRC_HDR_LEN])
            assert hdr.type == wire.MsgType.PROBE and hdr.psn == seq and hdr.path_id == pid


def test_run_sends_entries_in_order_and_refuses_bad_ones(dp, gen):
    """Run k of a run number sends entry k; past n, or an entry whose
    lengths do not fit, nothing; a MAC without a key in mrc_auth, nothing."""
    p = PATHS[0]
    ents = [entry(p, 0, 100 + i, 1000 + i, False) for i in range(3)]
    for k in range(3):
        ret, out = run_once(gen, ents, k)
        assert ret == XDP_REDIRECT and wire.decode_mrc_hdr(out[-wire.MRC_HDR_LEN:]).psn == 100 + k
    ret, _ = run_once(gen, ents, 3)
    assert ret == XDP_DROP
    bad = bytearray(ents[0])
    struct.pack_into("=H", bad, 4, wire.MRC_PROBE_FRAME_MAX + 1)
    assert run_once(gen, [bytes(bad)])[0] == XDP_DROP
    set_key(dp, None)
    assert run_once(gen, [entry(p, 0, 1, 1, True)])[0] == XDP_DROP


def test_mrc_rx_answers_generated_probes(dp, gen):
    """A generated probe, signed with the right key, is turned around by
    mrc_rx; signed with another, dropped as BAD_MAC."""
    set_key(dp, KEY)
    ret, out = run_once(gen, [entry(theirs(PATHS[0]), 0, 5, 0x1234_5678_9abc_def1, True)])
    assert ret == XDP_REDIRECT
    ret, reply = dp.run_rx(out)
    assert ret == XDP_TX
    assert wire.decode_mrc_hdr(reply[-wire.MRC_HDR_LEN - 8:][:wire.MRC_HDR_LEN]).type == wire.MsgType.PROBE_REPLY
    set_key(dp, OTHER_KEY)
    before = dp.drops()
    assert dp.run_rx(out)[0] == XDP_DROP
    assert drops_delta(before, dp.drops()) == {wire.Reason.RX_BAD_MAC: 1}


@pytest.fixture
def veth_xdp():
    """A veth pair a/b with XDP (pass) on b, both up: a then transmits
    redirected frames (ndo_xdp_xmit), b receives them into the stack."""
    need_root()
    a = f"mrcpg{os.getpid() % 100000}"
    b = a + "p"
    r = subprocess.run(["ip", "link", "add", a, "type", "veth", "peer", "name", b], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot create veth: {r.stderr.strip()}")
    try:
        for d in (a, b):
            subprocess.run(["ip", "link", "set", d, "addrgenmode", "none"], check=False)
            subprocess.run(["ip", "link", "set", d, "up"], check=True)
        subprocess.run(["ip", "link", "set", "dev", b, "xdpdrv", "obj", str(BPF_DIR / "xdp_pass.bpf.o"),
                        "sec", "xdp"], check=True)
        yield a, b
    finally:
        subprocess.run(["ip", "link", "del", a], check=False)


def test_live_run_transmits_every_probe(dp, gen, veth_xdp):
    """The agent's path: ProbeGen.send, one live-frames run per
    MRC_PROBE_BATCH; every probe leaves a (which says it can, from the
    netdev family) and arrives at b with the bytes of the AF_PACKET path.
    More than one batch, two frame sizes."""
    a, b = veth_xdp
    ia = socket.if_nametoindex(a)
    assert (xdp_features() or {}).get(ia, 0) & NETDEV_XDP_ACT_NDO_XMIT
    set_key(dp, KEY)
    no = refused(gen)
    if no is not None:
        # the host's answer, the same for every run: the agent asks it once
        # at start (Prober) and sends its probes itself
        assert no.errno == errno.EPERM, no
        with pytest.raises(OSError) as e:
            gen.send([entry(PATHS[0], 0, 1, 1, True)])
        assert e.value.errno == errno.EPERM
        return
    n = wire.MRC_PROBE_BATCH + 44
    want = {}
    ents = []
    for i in range(n):
        pid = i % 2
        p = PATHS[pid]
        p = wire.Path(ifindex=ia, ev=p.ev, family=p.family, plane=p.plane, smac=p.smac, dmac=p.dmac,
                      saddr=p.saddr, daddr=p.daddr)
        nonce = (i + 1) * 0x1_0000_0001
        ents.append(entry(p, pid, i + 1, nonce, True))
        want[i + 1] = (p, pid, nonce)
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)   # 300 frames at once
    s.bind((b, 0))
    try:
        t0 = now_us()
        gen.send(ents)
        got = {}
        end = time.monotonic() + 5
        while len(got) < n and time.monotonic() < end:
            if not select.select([s], [], [], 0.5)[0]:
                continue
            f = s.recv(2048)
            if f[12:14] not in (b"\x08\x00", b"\x86\xdd") or len(f) < 60:
                continue
            hdr = wire.decode_mrc_hdr(f[-wire.MRC_HDR_LEN - 8:][:wire.MRC_HDR_LEN])
            got[hdr.psn] = f
    finally:
        s.close()
    t1 = now_us()
    assert len(got) == n and gen.runs == 2
    for seq, f in got.items():
        p, pid, nonce = want[seq]
        ts = tx_ts_of(f, True)
        assert sent_between(ts, t0, t1)
        assert f == expected(p, pid, seq, nonce, KEY, ts), seq


def test_verified_size(gen):
    assert libbpf.prog_info(gen.prog.fd)["verified_insns"] < 500_000


def capture(sock: socket.socket, n: int, seconds: float = 5.0) -> dict[tuple[int, int], bytes]:
    """Up to n MRC frames received on sock, by (path_id, psn)."""
    got = {}
    end = time.monotonic() + seconds
    while len(got) < n and time.monotonic() < end:
        if not select.select([sock], [], [], 0.5)[0]:
            continue
        f = sock.recv(2048)
        if f[12:14] in (b"\x08\x00", b"\x86\xdd") and len(f) >= 60:
            h = wire.decode_mrc_hdr(f[-wire.MRC_HDR_LEN - 8:][:wire.MRC_HDR_LEN])
            got[(h.path_id, h.psn)] = f
    return got


@pytest.mark.parametrize("sender", ["packet", "xdp"])
def test_the_probers_round_on_each_sender(dp, gen, veth_xdp, sender):
    """Prober._send_all as the agent runs it, on a real device: each path's
    nonce is in mrc_probe_nonce under the probe's sequence before it
    leaves, and the frame that arrives carries it, signed: the same bytes
    from either sender ("packet": sendmmsg; "xdp": the generator)."""
    from types import SimpleNamespace
    from mrcctl.agent.health import ProbePath, Prober
    a, b = veth_xdp
    ia = socket.if_nametoindex(a)
    set_key(dp, KEY)
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    tx.bind((a, 0))
    rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    rx.bind((b, 0))
    pr = Prober.__new__(Prober)
    pr.agent = SimpleNamespace(dp=_Dp(dp))
    pr.cfg = SimpleNamespace(udp_port=UDP_PORT)
    pr.tokens, pr.errors, pr.sent, pr.generated, pr.gen_error = 0.0, 0, 0, 0, ""
    pr.socks = {a: tx}
    pr.generator = gen if sender == "xdp" else None
    # a host that refuses live frames: the first round's generator fails,
    # and that round and every later one go out as packets
    no = refused(gen) if sender == "xdp" else None
    pr.gen_planes = {a} if sender == "xdp" else set()
    pps, ents = [], {}
    for pid, p in enumerate(PATHS):
        ents[pid] = wire.Path(ifindex=ia, ev=p.ev, family=p.family, plane=p.plane, smac=p.smac, dmac=p.dmac,
                              saddr=p.saddr, daddr=p.daddr)
        pps.append(ProbePath(PEER, pid, dp.sizing.path_key(PEER, pid), a, None, ents[pid], auth_key=KEY))
    try:
        for rnd in (1, 2, 3):            # sequence rnd of every path
            t0 = now_us()
            pr._send_all(pps, time.monotonic_ns())
            got = capture(rx, len(pps))
            t1 = now_us()
            assert set(got) == {(pid, rnd) for pid in ents}, sorted(got)
            assert pr.errors == 0 and pr.sent == rnd * len(pps)
            assert pr.generated == (pr.sent if sender == "xdp" and no is None else 0)
            if no is not None:
                assert pr.generator is None and pr.gen_error == str(no)
            for pp in pps:
                ring = wire.ProbeNonce.unpack(dp.maps["mrc_probe_nonce"].lookup(pp.key))
                slot = rnd % wire.MRC_PROBE_RING
                assert ring.seq[slot] == rnd and ring.nonce[slot]
                f = got[(pp.path, rnd)]
                ts = tx_ts_of(f, True)
                assert sent_between(ts, t0, t1)
                assert f == expected(ents[pp.path], pp.path, rnd, ring.nonce[slot], KEY, ts), (pp.path, rnd)
    finally:
        tx.close()
        rx.close()


def test_probe_sender_config():
    from mrcctl.instance import config as cfgmod
    assert cfgmod._health({}).probe_sender == "packet"
    assert cfgmod._health({"probe_sender": "xdp"}).probe_sender == "xdp"
    with pytest.raises(cfgmod.ConfigError, match='health.probe_sender: must be "packet" or "xdp", not \'tc\''):
        cfgmod._health({"probe_sender": "tc"})
