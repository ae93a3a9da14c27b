"""Shared helpers for the datapath unit tests: paths to the objects, the
one-peer configuration, and Datapath (tx + rx on one pin root with map
helpers). Imported by conftest.py (fixtures) and the test modules; named
uniquely so it cannot collide with another directory's conftest/helpers."""

from __future__ import annotations

import os
import struct
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mrcctl.datapath import abi as wire  # noqa: E402

BPF_DIR = REPO / "bpf"
TX_OBJ = BPF_DIR / "tx.bpf.o"
RX_OBJ = BPF_DIR / "rx.bpf.o"

MAP_NAMES = ("mrc_cfg", "mrc_peers", "mrc_slots", "mrc_paths", "mrc_live", "mrc_peer_seq",
             "mrc_path_stats", "mrc_drops", "mrc_peer_ip", "mrc_rx_peers", "mrc_events")

TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT = 0, 2, 7
XDP_ABORTED, XDP_DROP, XDP_PASS, XDP_TX = 0, 1, 2, 3

LO_IFINDEX = 1  # test_run's default XDP ingress device: the netns loopback

# The two receive programs run the same steps (bpf/rx.bpf.c); a test module
# that uses the rx_hook fixture runs each test against both. tc's return
# codes read as the XDP verdicts they stand for, so one expectation covers
# both: a probe turned around is TC_ACT_REDIRECT (bpf_redirect to the
# device it came in on; test_run does not perform it).
RX_HOOKS = ("xdp", "tc")
TC_AS_XDP = {TC_ACT_OK: XDP_PASS, TC_ACT_SHOT: XDP_DROP, TC_ACT_REDIRECT: XDP_TX}
SKB_CTX_SIZE, SKB_IFINDEX, SKB_GSO_SEGS = 192, 40, 164   # struct __sk_buff

# --- the one-peer test configuration -------------------------------------
PEER = 2                        # not 0, to catch indexing mistakes
LOCAL_OVERLAY = "10.99.0.1"
PEER_OVERLAY = "10.99.0.2"
LOCAL_OVERLAY6 = "fd99::1"
PEER_OVERLAY6 = "fd99::2"
OVL_SMAC = "02:00:00:00:00:aa"  # mrc0's MAC and the peer's overlay MAC
OVL_DMAC = "02:00:00:00:00:bb"
OUR_MAC = "02:00:00:00:01:01"   # our plane-0 MAC (outer destination of what the peer sends)
PEER_MAC = "02:00:00:00:01:02"  # the peer's plane-0 MAC (outer source)
UDP_PORT = wire.MRC_DEFAULT_UDP_PORT

PATHS = [
    wire.Path(ifindex=11, ev=49152, family=4, plane=0, smac="02:00:00:00:01:01",
              dmac="02:00:00:00:01:02", saddr="192.0.2.1", daddr="192.0.2.2"),
    wire.Path(ifindex=12, ev=49153, family=6, plane=1, smac="02:00:00:00:02:01",
              dmac="02:00:00:00:02:02", saddr="fd00:1::1", daddr="fd00:1::2"),
    wire.Path(ifindex=11, ev=49154, family=4, plane=0, smac="02:00:00:00:01:01",
              dmac="02:00:00:00:01:02", saddr="192.0.2.1", daddr="192.0.2.2"),
    wire.Path(ifindex=13, ev=49155, family=4, plane=2, smac="02:00:00:00:03:01",
              dmac="02:00:00:00:03:02", saddr="198.18.0.1", daddr="198.18.0.2"),
]


def now_us() -> int:
    """bpf_ktime_get_ns() is CLOCK_MONOTONIC."""
    return (time.monotonic_ns() // 1000) & 0xFFFFFFFF


def drops_delta(before: dict, after: dict) -> dict:
    """The reasons whose mrc_drops count changed between two Datapath.drops()."""
    return {r: after[r] - before[r] for r in wire.Reason if after[r] != before[r]}


def need_root():
    if os.geteuid() != 0:
        pytest.skip("BPF datapath tests need root")


class Datapath:
    """tx + rx loaded by the product's loader (shared maps), with helpers to
    fill and read maps. pin_root is a bpffs dir for tests that pin."""

    def __init__(self, pin_root: Path, sizing: wire.Sizing | None = None):
        from mrcctl.datapath.objects import load_objects
        self.pin_root = pin_root
        self.sizing = sizing or wire.DEFAULT_SIZING
        self.loaded = load_objects(None, self.sizing)
        self.tx, self.rx, self.maps = self.loaded.tx, self.loaded.rx, self.loaded.maps
        self.rx_tc = self.loaded.rx_tc
        self.rx_hook = "xdp"

    def close(self):
        self.loaded.close()

    # --- writing configuration
    def set_cfg(self, **kw):
        self.maps["mrc_cfg"].update(wire.u32(0), wire.Config(**kw).pack())

    def set_peer(self, peer: int = PEER, **kw):
        self.maps["mrc_peers"].update(wire.u32(peer), wire.Peer(**kw).pack())

    def set_paths(self, paths, peer: int = PEER):
        for i, p in enumerate(paths):
            self.maps["mrc_paths"].update(self.sizing.path_key(peer, i), p.pack())
            self.maps["mrc_admin"].update(self.sizing.path_key(peer, i), wire.u32(p.admin))

    def set_slots(self, table, which: int = 0, peer: int = PEER):
        self.maps["mrc_slots"].update(wire.u32(wire.slots_idx(peer, which)),
                                      wire.Slots.of(table).pack())

    def set_live(self, path: int, peer: int = PEER, **kw):
        self.maps["mrc_live"].update(self.sizing.path_key(peer, path),
                                     wire.PathLive(**kw).pack())

    def set_seq(self, peer: int = PEER, **kw):
        self.maps["mrc_peer_seq"].update(wire.u32(peer), wire.PeerSeq(**kw).pack())

    def add_rx_peer(self, addr: str, ifindex: int = LO_IFINDEX, peer: int = PEER,
                    plane: int = 0):
        key = wire.RxKey(ifindex=ifindex, family=wire.family_of(addr), addr=addr).pack()
        self.maps["mrc_rx_peers"].update(key, wire.RxPeer(peer=peer, plane=plane).pack())

    def set_route(self, prefix: str, peer: int = PEER):
        """mrc_peer_ip: inner destination prefix (or address) -> the peer
        mrc_tx sends it to."""
        self.maps["mrc_peer_ip"].update(wire.OvlKey.of(prefix).pack(), wire.u32(peer))

    def set_owner(self, prefix: str, owner: int):
        """mrc_ovl_owner: overlay prefix (or address) -> peer index or
        wire.MRC_OWNER_LOCAL, either family: where mrc_tx sends an inner
        destination and whose inner sources mrc_rx accepts."""
        self.maps["mrc_ovl_owner"].update(wire.OvlKey.of(prefix).pack(), wire.u32(owner))

    def probe_sent(self, path: int, seq: int, peer: int = PEER, nonce: int | None = None) -> dict:
        """As the agent does before each probe: record probe `seq` of
        `path` with a random nonce in mrc_probe_nonce. Returns the header
        fields (psn, seq0, fb_ts) its reply echoes."""
        nonce = nonce if nonce is not None else (int.from_bytes(os.urandom(8), "big") or 1)
        if "mrc_probe_nonce" not in self.maps:          # a datapath before issue #13.8
            return {"psn": seq, "seq0": nonce >> 32, "fb_ts": nonce & 0xFFFFFFFF}
        key = self.sizing.path_key(peer, path)
        ent = wire.ProbeNonce.unpack(self.maps["mrc_probe_nonce"].lookup(key) or bytes(wire.ProbeNonce.size()))
        ent.add(seq, nonce)
        self.maps["mrc_probe_nonce"].update(key, ent.pack())
        return {"psn": seq, **wire.probe_nonce_fields(nonce)}

    def configure(self, paths=PATHS, slots=(0,), peer: int = PEER):
        """One peer: overlay PEER_OVERLAY (and PEER_OVERLAY6) -> peer, its paths, a slot table,
        and every path address accepted as an MRC source on lo (on the
        path's plane); PEER_OVERLAY owned by the peer, LOCAL_OVERLAY here."""
        self.set_cfg(udp_port=UDP_PORT)
        self.set_route(PEER_OVERLAY, peer)
        self.set_route(PEER_OVERLAY6, peer)
        self.set_owner(PEER_OVERLAY, peer)
        self.set_owner(LOCAL_OVERLAY, wire.MRC_OWNER_LOCAL)
        self.set_owner(PEER_OVERLAY6, peer)
        self.set_owner(LOCAL_OVERLAY6, wire.MRC_OWNER_LOCAL)
        self.set_peer(peer, n_paths=len(paths), overlay=PEER_OVERLAY)
        self.set_paths(paths, peer)
        self.set_slots(list(slots), 0, peer)
        for p in paths:
            self.add_rx_peer(p.saddr, peer=peer, plane=p.plane)
            self.add_rx_peer(p.daddr, peer=peer, plane=p.plane)

    # --- reading state
    def live(self, path: int, peer: int = PEER) -> wire.PathLive:
        return wire.PathLive.unpack(self.maps["mrc_live"].lookup(self.sizing.path_key(peer, path)))

    def seq(self, peer: int = PEER) -> wire.PeerSeq:
        return wire.PeerSeq.unpack(self.maps["mrc_peer_seq"].lookup(wire.u32(peer)))

    def stats(self, path: int, peer: int = PEER) -> wire.PathCounters:
        key = self.sizing.path_key(peer, path)
        return wire.PathCounters.of(self.maps["mrc_path_stats"].lookup_percpu(key),
                                    self.maps["mrc_path_cnt"].lookup(key))

    def drops(self) -> dict:
        m = self.maps["mrc_drops"]
        return {r: wire.sum_percpu_u64(m.lookup_percpu(wire.u32(r))) for r in wire.Reason}

    # --- running
    def run_tx(self, frame: bytes, ctx_in: bytes | None = None):
        ret, out, _ = self.tx.test_run(frame, ctx_in=ctx_in)
        return ret, out

    def run_rx(self, frame: bytes, ingress: int | None = None, gso_segs: int = 0):
        """The receive program of self.rx_hook on one frame: (XDP verdict,
        output bytes). gso_segs (tc only) marks the skb as holding several
        wire segments, as a GSO unit arriving at tc ingress does."""
        if self.rx_hook == "tc":
            return self.run_rx_tc(frame, ingress, gso_segs)
        assert not gso_segs, "XDP frames are one wire segment each"
        ctx = None
        if ingress is not None:
            # struct xdp_md: data, data_end, data_meta, ingress_ifindex,
            # rx_queue_index, egress_ifindex
            ctx = struct.pack("=6I", 0, len(frame), 0, ingress, 0, 0)
        ret, out, _ = self.rx.test_run(frame, ctx_in=ctx)
        return ret, out

    def run_rx_tc(self, frame: bytes, ingress: int | None = None, gso_segs: int = 0):
        ctx = bytearray(SKB_CTX_SIZE)
        struct.pack_into("=I", ctx, SKB_IFINDEX, ingress or 0)
        struct.pack_into("=I", ctx, SKB_GSO_SEGS, gso_segs)
        ret, out, _ = self.rx_tc.test_run(frame, ctx_in=bytes(ctx))
        assert ret in TC_AS_XDP, f"mrc_rx_tc returned {ret}"
        return TC_AS_XDP[ret], out
