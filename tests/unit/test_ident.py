"""State that belongs to a peer, not to an index, and one writer per field
(issue #13 items 3 and 4), on the real programs and maps:

- the sender's epoch in every header, and a receiver that restarts its
  windows for a new epoch instead of judging restarted PSNs as old;
- `up` (fill_maps) moving a peer's state with it when its index changes,
  and resetting what an index no longer owns;
- the operator's deny in a map of its own, which an agent task's
  whole-entry rewrite of mrc_paths cannot undo;
- the agent's retirements carried out by the mrc_ctl program, which leaves
  what the datapath wrote in place.
"""

from __future__ import annotations

import ipaddress
import time

import unit_pkt as pkt
from unit_dp import PATHS, PEER, UDP_PORT, XDP_DROP, XDP_PASS, drops_delta
from unit_pkt import mrc_frame, mrc_hdr_of, overlay

from mrcctl.datapath import abi as wire
from mrcctl.datapath.maps import Datapath as MrcDatapath
from mrcctl.datapath.objects import ctl_retire, load_ctl
from mrcctl.instance import admin as adminmod
from mrcctl.instance import config as cfgmod
from mrcctl.instance.fill import fill_maps
from mrcctl.instance.preflight import PlaneRuntime
from mrcctl.instance.slots import set_path_weights


def view(dp) -> MrcDatapath:
    """The product's Datapath over the test's maps (fill_maps, the admin
    and weight writers take one); never closed: the fixture owns the maps."""
    d = MrcDatapath.__new__(MrcDatapath)
    d.state = {"map_ids": {n: m.id for n, m in dp.maps.items()}}
    d._maps, d._ctl = dict(dp.maps), None
    return d


# ------------------------------------------------------------------ epoch

def test_tx_sends_the_configured_epoch(dp):
    for epoch in (0x1234, 0xFFFF):
        dp.set_cfg(udp_port=UDP_PORT, epoch=epoch)
        ret, out = dp.run_tx(overlay(pkt.udp(40000, 5201, b"x" * 64)))
        assert mrc_hdr_of(out).epoch == epoch


def test_new_epoch_restarts_receive_windows(dp):
    """Epoch A sends hedged PSNs 5..7; the peer restarts (epoch B) at PSN
    0: its PSNs are new, not duplicates or reordering. A straggler of A
    still arrives and is delivered, without touching B's windows."""
    A, B = 0x0A0A, 0x0B0B
    hedged = wire.MRC_F_HEDGE
    steps = [
        # description, epoch, psn, flags, verdict
        ("A: first copy", A, 5, hedged, XDP_PASS),
        ("A: second copy is a duplicate", A, 5, hedged, XDP_DROP),
        ("A: next", A, 6, hedged, XDP_PASS),
        ("A: next", A, 7, hedged, XDP_PASS),
        ("B: restarted at 0", B, 0, hedged, XDP_PASS),
        ("B: 5 again, new in B", B, 5, hedged, XDP_PASS),
        ("B: its second copy is a duplicate", B, 5, hedged, XDP_DROP),
        ("A: straggler of the previous epoch, delivered", A, 6, hedged, XDP_PASS),
        ("B: 6, still new in B (the straggler left no mark)", B, 6, hedged, XDP_PASS),
        ("B: in order", B, 7, 0, XDP_PASS),
    ]
    before = dp.drops()
    for desc, epoch, psn, flags, want in steps:
        ret, _ = dp.run_rx(mrc_frame(psn=psn, flags=flags, epoch=epoch))
        assert ret == want, desc
    assert drops_delta(before, dp.drops()) == {wire.Reason.RX_DUPLICATE: 2}
    st = dp.stats(0)
    # B's PSNs 0, 5, 6, 7 were neither reordered (0 < 7 of A) nor late
    assert st.rx_ooo == 0 and st.rx_late == 0, st
    assert dp.seq().rx_psn_max == 7
    ep = wire.RxEpoch.unpack(dp.maps["mrc_rx_epoch"].lookup(wire.u32(PEER)))
    assert (ep.cur, ep.prev) == (B | wire.MRC_EPOCH_SEEN, A | wire.MRC_EPOCH_SEEN)
    ro = wire.Reorder.sum(dp.maps["mrc_reorder"].lookup_percpu(wire.u32(PEER)))
    assert ro.resync == 1 and ro.dup == 2 and ro.lost == 0, ro   # one duplicate in each epoch


# ------------------------------------------------------------------ one writer per field

def test_agent_rewrite_of_paths_cannot_undo_a_deny(dp):
    """The operator's deny lands between an agent task's read of a path
    entry and its write-back (the lost update of issue #13.4): the deny
    stays, and the datapath refuses the path."""
    v = view(dp)
    cfg = cfgmod.parse(TWO_PEERS)
    h1 = cfg.peer("h1")
    fill_maps(v, cfg, runtime(cfg), 1, {})
    paths_m = v.map("mrc_paths")
    real_lookup = paths_m.lookup
    denied = []

    def lookup_then_deny(key):
        raw = real_lookup(key)
        if not denied:          # the operator, between the agent's read and write
            denied.extend(adminmod.write_admin(v, h1, list(h1.paths), deny=True))
        return raw

    paths_m.lookup = lookup_then_deny
    try:
        set_path_weights(v, h1, {p.id: 7 for p in h1.paths})
    finally:
        del paths_m.lookup
    assert len(denied) == len(h1.paths)
    for p in h1.paths:
        ent, _lv = v.path(h1.index, p.id)
        assert ent.weight == 7
        assert ent.admin == wire.PathState.DENIED, p.id
        assert not wire.path_usable(ent, _lv)


def test_ctl_retire_keeps_what_the_datapath_wrote(dp):
    """The agent's retirement is a compare-and-swap in the datapath: the
    fields the programs own stay as they wrote them, and a path that is
    not GOOD is left alone (no event for the agent to log)."""
    prog = load_ctl(dp.maps)
    try:
        dp.set_live(0, srtt_us=321, rtt_us=300, last_ack_ns=12345, probe_seq=9, good_ns=77)
        assert ctl_retire(prog, PEER, 0) is True
        lv = dp.live(0)
        assert lv.state == wire.PathState.ASSUMED_BAD and lv.bad_ns > 0 and lv.probe_ok == 0
        assert (lv.srtt_us, lv.rtt_us, lv.last_ack_ns, lv.probe_seq, lv.good_ns) == (321, 300, 12345, 9, 77)
        assert ctl_retire(prog, PEER, 0) is False           # already ASSUMED_BAD
        assert dp.live(0).bad_ns == lv.bad_ns
        assert ctl_retire(prog, PEER, 1) is True and dp.live(1).state == wire.PathState.ASSUMED_BAD
        assert dp.live(2).state == wire.PathState.GOOD      # only the named path
    finally:
        prog.close()


def test_ctl_retire_counts_toward_flap_damping(dp):
    """A path the agent retires within 1 s of its recovery relapsed just as
    if the judge had retired it: the probes it needs next time double
    (bpf/path.h path_retired), or a plane flapping faster than the judge
    sees, which the agent retires on probe loss, would come back after
    recover_probes every time."""
    prog = load_ctl(dp.maps)
    try:
        now = time.monotonic_ns()
        dp.set_live(0, good_ns=now - 100 * 1000 * 1000, flaps=1)
        dp.set_live(1, good_ns=now - 3 * 1000 * 1000 * 1000, flaps=3)
        assert ctl_retire(prog, PEER, 0) and ctl_retire(prog, PEER, 1)
        assert dp.live(0).flaps == 2            # recovered 100 ms ago: a relapse
        assert dp.live(1).flaps == 0            # 3 s of GOOD: the damping resets
    finally:
        prog.close()


# ------------------------------------------------------------------ state follows the peer

TEMPLATE = """
[overlay]
address = "172.31.0.1/24"
[[plane]]
device = "p0"
[[peer]]
name = "{a}"
overlay = "{a_ovl}"
[peer.underlay]
p0 = "{a_ul}"
[[peer]]
name = "{b}"
overlay = "{b_ovl}"
[peer.underlay]
p0 = "{b_ul}"
"""
PEER_ADDR = {"h1": ("172.31.0.2", "10.200.0.2"), "h2": ("172.31.0.3", "10.200.0.3"),
             "h3": ("172.31.0.4", "10.200.0.4")}


def two_peers(a: str, b: str) -> str:
    return TEMPLATE.format(a=a, a_ovl=PEER_ADDR[a][0], a_ul=PEER_ADDR[a][1],
                            b=b, b_ovl=PEER_ADDR[b][0], b_ul=PEER_ADDR[b][1])


TWO_PEERS = two_peers("h1", "h2")


def runtime(cfg) -> list[PlaneRuntime]:
    return [PlaneRuntime(plane=cfg.planes[0], ifindex=77, mac=b"\x02\0\0\0\0\x01", mtu=1500,
                         local={4: ipaddress.ip_address("10.200.0.1")}, subnets=[])]


def test_up_moves_state_with_the_peer(dp):
    """`up` with the [[peer]] blocks swapped: h1's denial and h2's
    ASSUMED_BAD paths follow their peers to their new indices, and so do
    the per-peer sequence and receive state; a peer new to an index
    starts afresh. Every `up` sends a new epoch."""
    v = view(dp)
    cfg = cfgmod.parse(two_peers("h1", "h2"))
    fill_maps(v, cfg, runtime(cfg), 1, {})
    epoch1 = wire.Config.unpack(v.map("mrc_cfg").lookup(wire.u32(0))).epoch
    h1, h2 = cfg.peer("h1"), cfg.peer("h2")
    assert (h1.index, h2.index) == (0, 1)
    adminmod.write_admin(v, h1, list(h1.paths), deny=True)
    for p in h2.paths:        # what the transmit judge would have done
        dp.set_live(p.id, peer=h2.index, state=wire.PathState.ASSUMED_BAD, srtt_us=500 + p.id)
    dp.set_seq(peer=h1.index, psn=1000, rx_psn_max=4000)
    dp.maps["mrc_rx_epoch"].update(wire.u32(h1.index), wire.RxEpoch(cur=0x1_0005).pack())
    dp.maps["mrc_dedup"].update(wire.u32(h2.index), wire.Dedup(w=b"\x01" * (wire.MRC_DEDUP_WORDS * 8)).pack())

    swapped = cfgmod.parse(two_peers("h2", "h1"))
    fill_maps(v, swapped, runtime(swapped), 1, {})
    epoch2 = wire.Config.unpack(v.map("mrc_cfg").lookup(wire.u32(0))).epoch
    assert 1 <= epoch1 <= 0xFFFF and 1 <= epoch2 <= 0xFFFF and epoch1 != epoch2
    n1, n2 = swapped.peer("h1"), swapped.peer("h2")
    assert (n1.index, n2.index) == (1, 0)
    for p in n1.paths:
        ent, lv = v.path(n1.index, p.id)
        assert ent.admin == wire.PathState.DENIED, f"h1/{p.id}: the operator's deny lost"
        assert lv.state == wire.PathState.GOOD
    for p in n2.paths:
        ent, lv = v.path(n2.index, p.id)
        assert ent.admin == wire.PathState.GOOD, f"h2/{p.id}: h1's deny passed to h2"
        assert lv.state == wire.PathState.ASSUMED_BAD and lv.srtt_us == 500 + p.id, f"h2/{p.id}"
    assert dp.seq(peer=n1.index).psn == 1000 and dp.seq(peer=n2.index).psn == 0
    assert wire.RxEpoch.unpack(dp.maps["mrc_rx_epoch"].lookup(wire.u32(n1.index))).cur == 0x1_0005
    assert wire.RxEpoch.unpack(dp.maps["mrc_rx_epoch"].lookup(wire.u32(n2.index))).cur == 0
    assert set(wire.Dedup.unpack(dp.maps["mrc_dedup"].lookup(wire.u32(n2.index))).w) == {1}
    # afresh: no filter (made by the peer's first hedged packet, bpf/dedup.h)
    assert dp.maps["mrc_dedup"].lookup(wire.u32(n1.index)) is None

    # h1 leaves, h3 takes its index: nothing of h1's passes to h3
    third = cfgmod.parse(two_peers("h2", "h3"))
    fill_maps(v, third, runtime(third), 1, {})
    h3 = third.peer("h3")
    assert h3.index == 1
    for p in h3.paths:
        ent, lv = v.path(h3.index, p.id)
        assert ent.admin == wire.PathState.GOOD and lv.state == wire.PathState.GOOD and lv.srtt_us == 0
    assert dp.seq(peer=h3.index).psn == 0
    assert wire.RxEpoch.unpack(dp.maps["mrc_rx_epoch"].lookup(wire.u32(h3.index))).cur == 0
    # and h2, which stayed, kept everything
    assert all(v.path(0, p.id)[1].state == wire.PathState.ASSUMED_BAD for p in third.peer("h2").paths)
