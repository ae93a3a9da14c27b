"""Slot tables: shares follow weights, consecutive slots alternate planes."""

from collections import Counter

from mrcctl import config, wire
from mrcctl.loader import slot_table


def peer(planes: int, evs: int, weights=None):
    weights = weights or [1] * planes
    toml = ['[overlay]\naddress = "172.31.0.1/24"']
    toml += [f'[[plane]]\ndevice = "p{p}"\nweight = {w}' for p, w in enumerate(weights)]
    toml.append(f'[[peer]]\nname = "b"\noverlay = "172.31.0.2"\nevs_per_plane = {evs}\n[peer.underlay]')
    toml += [f'p{p} = "10.{p}.0.2"' for p in range(planes)]
    return config.parse("\n".join(toml)).peers[0]


def test_equal_weights_alternate_planes_and_share_evenly():
    pr = peer(4, 4)
    table = slot_table(pr, [1] * 16, 1024)
    assert Counter(table) == {i: 64 for i in range(16)}
    planes = [pr.paths[s].plane.index for s in table]
    for i in range(len(planes) - 3):
        assert len(set(planes[i:i + 4])) == 4, planes[i:i + 8]


def test_weights_are_respected_exactly_over_whole_rounds():
    pr = peer(4, 4, [3, 1, 1, 1])
    w = [p.weight for p in pr.paths]
    n = (wire.MRC_SLOTS // sum(w)) * sum(w)
    per_plane = Counter(pr.paths[s].plane.index for s in slot_table(pr, w, n))
    assert [per_plane[p] / n for p in range(4)] == [0.5, 1 / 6, 1 / 6, 1 / 6]


def test_zero_weight_paths_get_no_slot():
    pr = peer(2, 2)
    assert set(slot_table(pr, [1, 0, 1, 1], 300)) == {0, 2, 3}
