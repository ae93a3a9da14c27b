"""Slot tables: shares follow weights, consecutive slots alternate planes (equal or not)."""

from collections import Counter
from itertools import groupby

from mrcctl.datapath import abi as wire

from mrcctl.instance import config
from mrcctl.instance.slots import slot_table


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


def test_unequal_planes_alternate_too():
    """2/1/0.5/0.5 Gbit/s with 4 EVs a plane: planes take turns by weight
    (a plane's EVs are not sent back to back), each EV of a plane gets the
    same share, and no plane gets more than two slots in a row."""
    pr = peer(4, 4, [4, 2, 1, 1])
    w = [p.weight for p in pr.paths]
    n = (wire.MRC_SLOTS // sum(w)) * sum(w)
    table = slot_table(pr, w, n)
    planes = [pr.paths[s].plane.index for s in table]
    assert planes[:8] == [0, 1, 0, 2, 3, 0, 1, 0]
    assert max(len(list(g)) for _k, g in groupby(planes)) <= 2
    per_path = Counter(table)
    for p in range(4):
        assert {per_path[i] for i, path in enumerate(pr.paths) if path.plane.index == p} == \
            {n * [4, 2, 1, 1][p] // 8 // 4}


def test_large_weights_fill_the_table():
    """Weights up to the config's 1000 per plane, 16 EVs each: a plane's
    weight (16 000) exceeds the table; shares are then within a slot."""
    pr = peer(4, 16, [1000, 500, 250, 250])
    w = [p.weight for p in pr.paths]
    table = slot_table(pr, w, wire.MRC_SLOTS)
    per_plane = Counter(pr.paths[s].plane.index for s in table)
    assert [per_plane[p] for p in range(4)] == [512, 256, 128, 128]
    assert len(set(table)) == 64


def test_a_table_longer_than_one_round_repeats_the_round():
    """build_slot_table computes one round of sum(weights) slots and repeats
    it: the same table the round robin gives slot by slot."""
    from mrcctl.instance.slots import build_slot_table

    def slot_by_slot(weights, n):
        cur, out, total = [0] * len(weights), [], sum(weights)
        for _ in range(n):
            best = -1
            for i, w in enumerate(weights):
                if w > 0:
                    cur[i] += w
                    if best < 0 or cur[i] > cur[best]:
                        best = i
            cur[best] -= total
            out.append(best)
        return out

    for weights, n in (([3, 1, 1, 1], 1000), ([120, 60, 30, 30], 960), ([7, 0, 2], 999), ([1], 5)):
        assert build_slot_table(weights, n) == slot_by_slot(weights, n)
