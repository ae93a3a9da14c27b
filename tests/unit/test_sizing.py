"""Maps sized from the config (issue #14.1): what the loader computes, that
the programs index the per-path maps with the stride it sets, and that a
resize keeps what peers knew."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

import unit_pkt as pkt
from unit_dp import PATHS, PEER_OVERLAY, TC_ACT_REDIRECT, XDP_PASS, Datapath
from mrcctl.datapath import abi as wire, libbpf
from mrcctl.datapath.objects import PER_PATH, PER_PEER, load_objects, map_entries
from mrcctl.instance import config as cfgmod


def toml(n_peers: int, evs: int = 4, planes: int = 2, limits: str = "") -> str:
    out = ['[overlay]\naddress = "172.31.0.1/16"\n']
    for p in range(planes):
        out.append(f'[[plane]]\ndevice = "p{p}"\n')
    for k in range(n_peers):
        out.append(f'[[peer]]\nname = "n{k}"\noverlay = "172.31.{1 + k // 250}.{k % 250 + 1}"\n'
                   f"evs_per_plane = {evs}\n[peer.underlay]\n" +
                   "".join(f'p{p} = "10.{p}.{k // 250}.{k % 250 + 1}"\n' for p in range(planes)))
    return "\n".join(out) + ("\n" + limits if limits else "")


# ------------------------------------------------------------------ config -> sizing

@pytest.mark.parametrize("n_peers, evs, peers, stride", [
    (1, 4, 64, 256),        # the default 64 peers, and 256 paths each while that is cheap
    (48, 2, 64, 256),       # 48 + 16 fits 64
    (49, 2, 128, 128),      # 49 + 16 does not; 128 x 128 path slots
    (300, 12, 320, 32),     # 24 paths -> stride 32 (16,384 / 320 -> 32 too)
    (1000, 16, 1024, 32),   # 1000 + 16 -> 1024; 32 paths
    (4096, 4, 4160, 8),     # 8 paths: no room to spare at this size
])
def test_sizing_follows_the_peers_and_paths(n_peers, evs, peers, stride):
    sz = cfgmod.parse(toml(n_peers, evs)).sizing()
    assert (sz.peers, sz.stride) == (peers, stride)


def test_limits_set_the_room_explicitly():
    sz = cfgmod.parse(toml(3, 4, limits="[limits]\nmax_peers = 4096\nmax_paths_per_peer = 33\n")).sizing()
    assert (sz.peers, sz.stride) == (4096, 64)


@pytest.mark.parametrize("limits, n_peers, evs, msg", [
    ("max_peers = 2", 3, 4, "peer: 3 peers, more than limits.max_peers = 2"),
    ("max_paths_per_peer = 6", 2, 4, "peer[0]: 8 paths, more than limits.max_paths_per_peer = 6"),
    ("max_peers = 0", 1, 4, "limits.max_peers: 0 is out of range 1..16384"),
    ("max_peers = 20000", 1, 4, "limits.max_peers: 20000 is out of range 1..16384"),
    ("max_paths_per_peer = 257", 1, 4, "limits.max_paths_per_peer: 257 is out of range 1..256"),
    ("max_peer = 10", 1, 4, "limits.max_peer: unknown key (did you mean 'max_peers'?)"),
])
def test_over_capacity_is_a_config_error(limits, n_peers, evs, msg):
    with pytest.raises(cfgmod.ConfigError) as e:
        cfgmod.parse(toml(n_peers, evs, limits=f"[limits]\n{limits}\n"))
    assert str(e.value) == msg


def test_sizing_mirror():
    sz = wire.Sizing.of(4096, 32)
    assert (sz.peers, sz.path_shift, sz.stride, sz.path_entries) == (4096, 5, 32, 4096 * 32)
    assert sz.path_idx(4095, 31) == 4095 * 32 + 31
    assert wire.Sizing.of_maps(4096, 4096 * 32) == sz
    for bad in ((4096, 0), (0, 32), (4095, -1)):
        with pytest.raises(ValueError):
            sz.path_idx(*bad)
    with pytest.raises(ValueError):
        wire.Sizing(peers=wire.MRC_PEERS_LIMIT + 1, path_shift=0)


# ------------------------------------------------------------------ the loader

def test_loader_sizes_every_map(bpf_objects):
    sz = wire.Sizing.of(300, 24)
    want = map_entries(sz, planes=3)
    with load_objects(None, sz, planes=3) as dp:
        for name in PER_PEER:
            assert dp.maps[name].max_entries == 300, name
        for name in PER_PATH:
            assert dp.maps[name].max_entries == 300 * 32, name
        assert dp.maps["mrc_slots"].max_entries == 600
        assert dp.maps["mrc_rx_peers"].max_entries == 300 * 16    # every plane there could be
        assert {n: dp.maps[n].max_entries for n in want} == want
    assert map_entries(wire.Sizing.of(4096, 32), planes=4)["mrc_rx_peers"] == 4096 * 4
    assert map_entries(wire.Sizing.of(4096, 32), planes=6)["mrc_rx_peers"] == 4096 * 6


# ------------------------------------------------------------------ a non-default stride

BIG = wire.Sizing.of(128, 64)     # stride 64: path ids above 31 exist
PEER_HI = 100                     # above the compiled-in 64 peers


@pytest.fixture
def big(bpf_objects, bpffs):
    root = bpffs / f"t{uuid.uuid4().hex[:12]}"
    root.mkdir()
    d = Datapath(root, BIG)
    # 41 paths of plane 0 (IPv4), EVs 49152.. ; the slot table sprays on path 40 only
    paths = [dataclasses.replace(PATHS[0], ev=49152 + i) for i in range(41)]
    d.configure(paths=paths, slots=(40,), peer=PEER_HI)
    try:
        yield d
    finally:
        d.close()
        root.rmdir()


def _nonzero_stats(d: Datapath) -> dict[int, wire.PathCounters]:
    m, c = d.maps["mrc_path_stats"], d.maps["mrc_path_cnt"]
    hot, cold = m.read_range(0, m.max_entries), c.read_range(0, c.max_entries)
    step = (m.value_size + 7) & ~7
    out = {}
    for i, (h, k) in enumerate(zip(hot, cold)):
        if any(h) or any(k):
            out[i] = wire.PathCounters.of([h[j:j + m.value_size] for j in range(0, len(h), step)], k)
    return out


def test_tx_indexes_the_stride_the_loader_set(big):
    inner = pkt.overlay(pkt.udp(40000, 5201, b"x" * 200))
    ret, out = big.run_tx(inner)
    assert ret == TC_ACT_REDIRECT
    hdr = pkt.mrc_hdr_of(out)
    assert hdr.path_id == 40
    assert int.from_bytes(out[34:36], "big") == 49152 + 40      # the path's EV
    # counted at peer 100 << 6 | 40 and nowhere else
    got = _nonzero_stats(big)
    assert list(got) == [PEER_HI * 64 + 40]
    assert got[PEER_HI * 64 + 40].tx_packets == 1


@pytest.mark.parametrize("hook", ["xdp", "tc"])
def test_rx_indexes_the_stride_the_loader_set(big, hook):
    big.rx_hook = hook
    ret, _ = big.run_rx(pkt.mrc_frame(path_id=40, psn=7, tx_ts=4242))
    assert ret == XDP_PASS
    got = _nonzero_stats(big)
    assert list(got) == [PEER_HI * 64 + 40]
    assert got[PEER_HI * 64 + 40].rx_packets == 1
    live = big.live(40, peer=PEER_HI)
    assert live.last_rx_ts == 4242
    # the neighbour under the compiled-in stride (256) would be peer 25 path 40
    assert wire.PathLive.unpack(big.maps["mrc_live"].lookup(wire.u32(PEER_HI * 64 + 39))).last_rx_ts == 0
    assert big.seq(PEER_HI).rx_psn_max == 7


def test_rx_refuses_a_path_beyond_the_peers_paths(big):
    before = big.drops()
    ret, _ = big.run_rx(pkt.mrc_frame(path_id=41))
    assert ret == 1    # XDP_DROP
    assert big.drops()[wire.Reason.RX_UNKNOWN_PATH] == before[wire.Reason.RX_UNKNOWN_PATH] + 1
    assert _nonzero_stats(big) == {}


# ------------------------------------------------------------------ resize keeps state

def test_a_resized_map_is_recreated_with_its_entries_moved(bpf_objects):
    """Upgrade in place to a config with more peers and a smaller stride:
    every sized map is new (the old one had fewer entries), and what peers
    knew moves to their index under the new stride; maps of unchanged size
    are the same maps."""
    old_sz, new_sz = wire.DEFAULT_SIZING, wire.Sizing.of(200, 16)
    with load_objects(None, old_sz) as first:
        m = first.maps
        m["mrc_peer_seq"].update(wire.u32(3), wire.PeerSeq(psn=777, rx_psn_max=55).pack())
        m["mrc_admin"].update(old_sz.path_key(3, 5), wire.u32(wire.PathState.DENIED))
        m["mrc_live"].update(old_sz.path_key(3, 5), wire.PathLive(srtt_us=321, state=1).pack())
        m["mrc_path_stats"].update(old_sz.path_key(3, 15), wire.PathStats(tx_packets=9).pack())
        m["mrc_live"].update(old_sz.path_key(3, 20), wire.PathLive(srtt_us=999).pack())   # beyond 16
        m["mrc_slots"].update(wire.u32(wire.slots_idx(3, 1)), wire.Slots.of([5, 15]).pack())
        reuse = {n: libbpf.Map.from_id(x.id) for n, x in m.items()}
        old_ids = {n: x.id for n, x in m.items()}
        with load_objects(reuse, new_sz) as second:
            n = second.maps
            assert n["mrc_cfg"].id == old_ids["mrc_cfg"]
            for name in ("mrc_peer_seq", "mrc_admin", "mrc_live", "mrc_path_stats", "mrc_slots"):
                assert n[name].id != old_ids[name], name
            assert n["mrc_live"].max_entries == 200 * 16
            assert wire.PeerSeq.unpack(n["mrc_peer_seq"].lookup(wire.u32(3))).psn == 777
            assert wire.unpack_u32(n["mrc_admin"].lookup(new_sz.path_key(3, 5))) == wire.PathState.DENIED
            lv = wire.PathLive.unpack(n["mrc_live"].lookup(new_sz.path_key(3, 5)))
            assert (lv.srtt_us, lv.state) == (321, 1)
            per_cpu = n["mrc_path_stats"].lookup_percpu(new_sz.path_key(3, 15))   # 9 written on every CPU
            assert [wire.PathStats.unpack(v).tx_packets for v in per_cpu] == [9] * libbpf.num_possible_cpus()
            # nothing landed where the old stride would have put it, nothing past the new stride
            lives = n["mrc_live"].read_range(0, n["mrc_live"].max_entries)
            assert [i for i, v in enumerate(lives) if any(v)] == [new_sz.path_idx(3, 5)]
            assert wire.Slots.unpack(n["mrc_slots"].lookup(wire.u32(wire.slots_idx(3, 1)))).slot[:2] == [5, 15]


def test_probe_nonces_are_not_sized_just_past_a_power_of_two():
    """The hash's buckets are a power of two: 133,120 slots (4,096 peers and
    the default headroom) would take 262,144 of them, 2 MiB more."""
    assert map_entries(wire.Sizing.of(4160, 32))["mrc_probe_nonce"] == 131072
    assert map_entries(wire.Sizing.of(300, 24))["mrc_probe_nonce"] == 300 * 32     # 8,192 would be too few


def test_the_flowlet_cache_is_large_only_when_a_peer_sprays_flowlets():
    """16,384 flows (1.4 MiB) only for a config that uses them; 2,048 else."""
    plain = cfgmod.parse(toml(3))
    text = toml(3).replace('evs_per_plane = 4\n', 'evs_per_plane = 4\nspray = "flowlet"\n', 1)
    flowlet = cfgmod.parse(text)
    assert [p.spray for p in flowlet.peers] == ["flowlet", "weighted", "weighted"]
    assert plain.flowlet_room() == cfgmod.FLOWLETS_IDLE < flowlet.flowlet_room() == cfgmod.FLOWLETS_ROOM
    assert map_entries(plain.sizing(), 2, plain.flowlet_room())["mrc_flowlets"] == cfgmod.FLOWLETS_IDLE
    assert "mrc_flowlets" not in map_entries(plain.sizing(), 2)      # as compiled
