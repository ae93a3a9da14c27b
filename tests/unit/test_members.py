"""Peers added and removed live (issue #14.2), on the real programs and
maps: removing a peer clears everything of its index and leaves every
other peer's entries byte for byte; a peer added at a used index starts
afresh (no counters, no DENIED, no PSNs, no receive windows) and sends
its own epoch, which the transmit program puts in every header."""

from __future__ import annotations

import dataclasses
import ipaddress

import pytest
import unit_pkt as pkt
from test_ident import runtime, two_peers, view
from unit_pkt import mrc_hdr_of, overlay

from mrcctl.datapath import abi as wire
from mrcctl.instance import admin as adminmod
from mrcctl.instance import config as cfgmod
from mrcctl.instance.fill import PATH_STATE, PEER_STATE, fill_maps
from mrcctl.instance import members
from mrcctl.instance.members import add_peer, remove_peer

TC_ACT_REDIRECT = 7


class Routes:
    """The netlink calls add_peer/remove_peer make, recorded: routes are
    kernel state outside the maps under test (the integration test checks
    the real ones)."""

    def __init__(self):
        self.routes: set[str] = set()

    def routes_replace(self, dsts, dev, rto_min_ms=0):
        self.routes.update(dsts)
        return []

    def route_delete(self, dst, dev):
        self.routes.discard(dst)

    def neighbour(self, dev, addr):
        return None

    def next_hop(self, dev, addr):
        return str(addr)


def entries(v, index: int, n_paths: int) -> dict:
    """Every map entry that belongs to peer index `index`."""
    out = {}
    for name in PEER_STATE + ("mrc_peers", "mrc_auth"):
        out[name] = v.map(name).lookup(wire.u32(index))
    for name in PATH_STATE + ("mrc_paths", "mrc_path_mtu"):
        m = v.map(name)
        for pid in range(n_paths):
            key = v.sizing.path_key(index, pid)
            out[(name, pid)] = m.lookup_percpu(key) if name == "mrc_path_stats" else m.lookup(key)
    for t in (0, 1):
        out[("slots", t)] = v.map("mrc_slots").lookup(wire.u32(wire.slots_idx(index, t)))
    rx = v.map("mrc_rx_peers")
    out["rx"] = sorted(k for k in rx.keys() if wire.RxPeer.unpack(rx.lookup(k)).peer == index)
    return out


def send(dp, dst: str):
    return dp.run_tx(overlay(pkt.udp(40000, 5201, b"x" * 64), dst=dst))


def test_remove_then_add_at_the_same_index(dp):
    v = view(dp)
    cfg = cfgmod.parse(two_peers("h1", "h2"))
    fill_maps(v, cfg, runtime(cfg), 1, {})
    h1, h2 = cfg.peer("h1"), cfg.peer("h2")
    by_dev = {rt.plane.device: rt for rt in runtime(cfg)}
    # h2's first life: traffic, a deny, a retired path, PSNs, windows
    for _ in range(3):
        ret, _out = send(dp, str(h2.overlay))
        assert ret == TC_ACT_REDIRECT
    adminmod.write_admin(v, h2, [h2.paths[0]], deny=True)
    dp.set_live(1, peer=h2.index, state=wire.PathState.ASSUMED_BAD, srtt_us=700)
    dp.set_seq(peer=h2.index, psn=5000, rx_psn_max=9000)
    dp.maps["mrc_rx_epoch"].update(wire.u32(h2.index), wire.RxEpoch(cur=0x1_0007).pack())
    dp.maps["mrc_dedup"].update(wire.u32(h2.index), wire.Dedup(w=b"\x01" * (wire.MRC_DEDUP_WORDS * 8)).pack())
    dp.maps["mrc_path_mtu"].update(dp.sizing.path_key(h2.index, 0), wire.PathMtu(mtu=1500, icmps=1, s=7).pack())
    send(dp, str(h1.overlay))
    h1_before = entries(v, h1.index, len(h1.paths))

    nl = Routes()
    nl.routes = {f"{h1.overlay}/32", f"{h2.overlay}/32"}
    assert remove_peer(v, nl, "mrc0", str(h2.overlay), h2.index) == [f"{h2.overlay}/32"]
    assert nl.routes == {f"{h1.overlay}/32"}
    ret, _out = send(dp, str(h2.overlay))
    assert ret != TC_ACT_REDIRECT, "a removed peer must get nothing"
    assert v.map("mrc_peer_ip").lookup(wire.OvlKey.of(h2.overlay).pack()) is None
    gone = entries(v, h2.index, len(h2.paths))
    assert gone["rx"] == [] and wire.Peer.unpack(gone["mrc_peers"]).n_paths == 0
    assert wire.PeerSeq.unpack(gone["mrc_peer_seq"]).psn == 0
    for pid in range(len(h2.paths)):
        assert set(gone[("mrc_path_mtu", pid)]) == {0}
        assert wire.PathStats.sum(gone[("mrc_path_stats", pid)]).tx_packets == 0
        assert gone[("mrc_admin", pid)] == wire.u32(wire.PathState.GOOD)
    assert entries(v, h1.index, len(h1.paths)) == h1_before, "removing h2 touched h1"

    # h3 is given h2's index (no free one left, say): nothing of h2 passes
    third = cfgmod.parse(two_peers("h1", "h3"))
    h3 = dataclasses.replace(third.peer("h3"), index=h2.index)
    add_peer(v, nl, third, h3, by_dev, epoch=0x4242)
    assert entries(v, h1.index, len(h1.paths)) == h1_before, "adding h3 touched h1"
    assert f"{h3.overlay}/32" in nl.routes
    assert wire.Peer.unpack(v.map("mrc_peers").lookup(wire.u32(h3.index))).epoch == 0x4242
    for p in h3.paths:
        ent, lv = v.path(h3.index, p.id)
        assert ent.admin == wire.PathState.GOOD and lv.state == wire.PathState.GOOD and lv.srtt_us == 0
        assert dp.stats(p.id, peer=h3.index).tx_packets == 0
    assert dp.seq(peer=h3.index).rx_psn_max == 0
    assert wire.RxEpoch.unpack(dp.maps["mrc_rx_epoch"].lookup(wire.u32(h3.index))).cur == 0
    # mrc_dedup holds entries only for peers that sent hedged units: none, or an empty one
    dd = dp.maps["mrc_dedup"].lookup(wire.u32(h3.index))
    assert dd is None or set(wire.Dedup.unpack(dd).w) == {0}
    ret, out = send(dp, str(h3.overlay))
    assert ret == TC_ACT_REDIRECT
    hdr = mrc_hdr_of(out)
    assert hdr.epoch == 0x4242 and hdr.psn == 0, "h3's receiver must see a restart"
    # h1 keeps the instance's epoch, and the rest of its entries
    cfg_epoch = wire.Config.unpack(v.map("mrc_cfg").lookup(wire.u32(0))).epoch
    assert mrc_hdr_of(send(dp, str(h1.overlay))[1]).epoch == cfg_epoch


TWO_PLANES = """
[overlay]
address = "172.31.0.1/24"
[[plane]]
device = "p0"
[[plane]]
device = "p9"
[[peer]]
name = "h1"
overlay = "172.31.0.2"
[peer.underlay]
p0 = "10.200.0.2"
[[peer]]
name = "h3"
overlay = "172.31.0.4"
[peer.underlay]
p0 = "10.200.0.4"
[[peer]]
name = "h4"
overlay = "172.31.0.5"
[peer.underlay]
p9 = "10.209.0.5"
"""


def test_a_peer_that_fails_leaves_nothing_and_the_ones_before_it_stay(dp):
    """h3 and h4 added in one change; h4's plane is gone from the running
    planes, so writing its paths fails half way: h4 is taken out again
    entirely, h3 stays, and the record says so."""
    v = view(dp)
    cfg = cfgmod.parse(TWO_PLANES)
    base = dataclasses.replace(cfg, peers=cfg.peers[:1])
    fill_maps(v, base, runtime(base), 1, {})
    state: dict = {"routes": ["172.31.0.2/32"]}
    members.note(state, base)
    ch = members.diff(state, cfg)
    assert [p.name for p in ch.added] == ["h3", "h4"]
    nl = Routes()
    with pytest.raises(members.PartlyApplied, match="adding peer h4"):
        members.change_peers(v, state, cfg, ch, nl, runtime(cfg))      # no runtime for p9
    h3, h4 = cfg.peer("h3"), cfg.peer("h4")
    assert set(state["members"]["peers"]) == {"172.31.0.2", "172.31.0.4"}
    assert state["routes"] == ["172.31.0.2/32", "172.31.0.4/32"]
    assert nl.routes == {"172.31.0.4/32"}
    assert wire.Peer.unpack(v.map("mrc_peers").lookup(wire.u32(h3.index))).n_paths == len(h3.paths)
    assert v.map("mrc_peer_ip").lookup(wire.OvlKey.of(h3.overlay).pack()) == wire.u32(h3.index)
    gone = entries(v, h4.index, len(h4.paths))
    assert wire.Peer.unpack(gone["mrc_peers"]).n_paths == 0 and gone["rx"] == []
    assert v.map("mrc_peer_ip").lookup(wire.OvlKey.of(h4.overlay).pack()) is None
    assert wire.AuthKey.unpack(gone["mrc_auth"]).key is None


def test_live_peer_with_both_families_and_prefixes(dp):
    """A peer added live with an IPv6 overlay address and prefixes of both
    families: every one of them is routed and in both LPM maps, mrc_tx finds
    it for an address inside its IPv6 prefix; removing it takes every entry
    and route away again and leaves the other peer's."""
    v = view(dp)
    text = two_peers("h1", "h2").replace('address = "172.31.0.1/24"',
                                         'address = ["172.31.0.1/24", "fd31::1/64"]')
    cfg = cfgmod.parse(text)
    fill_maps(v, cfg, runtime(cfg), 1, {})
    h1, h2 = cfg.peer("h1"), cfg.peer("h2")
    h2 = dataclasses.replace(h2, overlays=(h2.overlay, ipaddress.ip_address("fd31::3")),
                             prefixes=(ipaddress.ip_network("10.244.3.0/24"),
                                       ipaddress.ip_network("fd00:3::/64")))
    by_dev = {rt.plane.device: rt for rt in runtime(cfg)}
    remove_peer(v, Routes(), "mrc0", str(h2.overlay), h2.index)
    nl = Routes()
    add_peer(v, nl, cfg, h2, by_dev, epoch=7)
    owned = {str(n) for n in h2.owned()}
    assert nl.routes == owned == {f"{h2.overlay}/32", "fd31::3/128", "10.244.3.0/24", "fd00:3::/64"}
    for n in h2.owned():
        key = wire.OvlKey.of(n).pack()
        assert v.map("mrc_peer_ip").lookup(key) == v.map("mrc_ovl_owner").lookup(key) == wire.u32(h2.index)
    ret, out = dp.run_tx(pkt.overlay6(pkt.udp(1, 2, b"6" * 40), dst="fd00:3::9", src="fd31::1"))
    assert ret == TC_ACT_REDIRECT
    assert sorted(remove_peer(v, nl, "mrc0", str(h2.overlay), h2.index)) == sorted(owned)
    assert nl.routes == set()
    left = {wire.OvlKey.unpack(k).network for k in v.map("mrc_peer_ip").keys()}
    assert left == {ipaddress.ip_network(f"{h1.overlay}/32")}
