"""The EV map on routed leaf-spine planes: EV traces answered by the spines,
each plane's EVs moved onto ports that the leaf hashes evenly over its
spines (as the kernel itself says: Fabric.ev_spines), and real traffic
following the ports in use."""

from __future__ import annotations

from lab import FAST_HEALTH, Lab
from test_fabric_mrc import spine_tx

PLANES = 2
EVS = 4
EVMAP = """
[ev_map]
mode = "auto"
candidates = 3
"""


def _wire_evs(lab: Lab, i: int, peer: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for x in lab.paths(i, peer):
        out.setdefault(x["plane"], []).append(x["wire_ev"])
    return out


def test_each_planes_evs_are_spread_evenly_over_the_spines(tmp_path):
    with Lab(tmp_path, 2, PLANES, prefix="evm", evs=EVS, extra=FAST_HEALTH + EVMAP,
             fabric=dict(spines=2, leaves=2, link_rate="1gbit")) as lab:
        lab.up(settle=True)
        # the map of every plane of both hosts, within the routers' ICMP rate limits
        done = lab.wait_ev_map()
        assert all(len(d) == PLANES for d in done.values()), done
        for i in (0, 1):
            evs = _wire_evs(lab, i, f"h{1 - i}")
            for p in range(PLANES):
                ports = evs[f"p{p}"]
                assert len(set(ports)) == EVS, ports
                spines = lab.tb.ev_spines(p, i, 1 - i, ports)
                # 2:2 over the two spines, as the leaf's FIB hashes them
                split = sorted(sum(1 for ev in ports if spines[ev] == s) for s in (0, 1))
                assert split == [2, 2], (i, p, spines, done[i])
                # the traces named the spine the kernel names
                hops = done[i][f"p{p}"]["hops"]
                for ev in ports:
                    assert hops[str(ev)][0] == f"10.{150 + p}.{16 * lab.tb.leaf_of(i) + spines[ev]}.2", (ev, hops, spines)
        # real traffic crosses the spines in that split and arrives intact
        before = spine_tx(lab)
        s, r = lab.transfer(0, 1, "32M", port=5611)
        assert s["sha256"] == r["sha256"] and s["bytes"] == r["bytes"] == 32 << 20
        moved = {k: v - before[k] for k, v in spine_tx(lab).items()}
        for p in range(PLANES):
            total = moved[(p, 0)] + moved[(p, 1)]
            assert abs(moved[(p, 0)] / total - 0.5) < 0.15, moved
        # path names are unchanged: the configured EVs
        names = sorted(x["ev"] for x in lab.paths(0, "h1"))
        assert names == list(range(49152, 49152 + EVS * PLANES))
