"""Handles on the maps and programs of one running instance."""

from __future__ import annotations

import struct
from typing import Protocol

from ..errors import MrcError
from . import abi
from .libbpf import Map, Program


_U64 = struct.Struct("=Q")
_ACK_MAX_AT = abi.PeerSeq.offsets()["ack_max_ns"]


def changed(new: list[int], old: list[int] | None) -> list[int]:
    """Indices where two readings of a field differ (every index when the
    lengths do): the lists compared whole first, since mostly none did."""
    if old is None or len(old) != len(new):
        return list(range(len(new)))
    if new == old:
        return []
    return [i for i, (a, b) in enumerate(zip(new, old)) if a != b]


def resized(old: list[int], n: int, fresh) -> list[int]:
    """A reading of a per-peer field carried over a change of peers: `n`
    long, 0 at the indices in `fresh` (peers removed or added, whose state
    the applier cleared) and beyond the old reading, so that the next
    reading differs only where a peer's field moved, not everywhere."""
    out = (old + [0] * n)[:n] if len(old) != n else list(old)
    for i in fresh:
        if i < n:
            out[i] = 0
    return out


class Record(Protocol):
    """What Datapath needs of an instance's state record (instance.state.Instance):
    taking it as a parameter keeps this layer free of the instance layer."""

    overlay: str

    def read(self) -> dict: ...


class Datapath:
    """The maps and programs of one running instance, found by BPF object id.

    Ids, not pins: `ip netns exec` gives each invocation a private mount
    namespace, so a bpffs mounted by one invocation is gone for the next,
    while ids are global and live as long as the attached programs (and the
    agent) hold the objects.
    """

    _sizing: abi.Sizing | None = None

    def __init__(self, inst: Record):
        self.inst = inst
        self.state = inst.read()
        self._maps: dict[str, Map] = {}
        self._ctl: Program | None = None

    def exists(self) -> bool:
        return bool(self.state.get("map_ids"))

    def map(self, name: str) -> Map:
        m = self._maps.get(name)
        if m is None:
            mid = self.state.get("map_ids", {}).get(name)
            if mid is None:
                raise MrcError(f"{self.inst.overlay}: not up in this network namespace; run `mrcctl up` first")
            try:
                m = Map.from_id(mid)
            except OSError:
                raise MrcError(f"{self.inst.overlay}: the datapath is gone (map {name} id {mid} no longer "
                               "exists); run `mrcctl down` then `mrcctl up`") from None
            if m.name != name:
                m.close()
                raise MrcError(f"{self.inst.overlay}: map id {mid} is no longer {name}; run `mrcctl up`")
            self._maps[name] = m
        return m

    def program(self, name: str) -> Program:
        pid = self.state.get("prog_ids", {}).get(name)
        if pid is None:
            raise MrcError(f"{self.inst.overlay}: program {name} unknown; run `mrcctl up`")
        return Program.from_id(pid)

    @property
    def sizing(self) -> abi.Sizing:
        """How this datapath's maps are sized (their sizes say it)."""
        if self._sizing is None:
            self._sizing = abi.Sizing.of_maps(self.map("mrc_peers").max_entries,
                                              self.map("mrc_paths").max_entries)
        return self._sizing

    def path_key(self, peer: int, path_id: int) -> bytes:
        """The key of (peer, path) in this datapath's per-path maps."""
        return self.sizing.path_key(peer, path_id)

    def path_idx(self, peer: int, path_id: int) -> int:
        return self.sizing.path_idx(peer, path_id)

    def path(self, peer: int, path_id: int) -> tuple[abi.Path, abi.PathLive]:
        """A path's entry (mrc_paths, with .admin from mrc_admin) and its
        liveness (mrc_live)."""
        key = self.path_key(peer, path_id)
        p = abi.Path.unpack(self.map("mrc_paths").lookup(key))
        p.admin = abi.unpack_u32(self.map("mrc_admin").lookup(key))
        return p, abi.PathLive.unpack(self.map("mrc_live").lookup(key))

    def counters(self, peer: int, path_id: int) -> abi.PathCounters:
        """Every counter of a path (mrc_path_stats over the CPUs, mrc_path_cnt)."""
        key = self.path_key(peer, path_id)
        return abi.PathCounters.of(self.map("mrc_path_stats").lookup_percpu(key),
                                   self.map("mrc_path_cnt").lookup(key))

    def tx_psns(self, span: int) -> list[int]:
        """Every peer's next tx PSN (mrc_peer_seq.psn, the first u64 of each
        entry) for indices 0..span-1, read from the map's memory (no system
        call: the agent looks ~150 times a second)."""
        seq_m = self.map("mrc_peer_seq")
        with memoryview(seq_m.mapped()) as mv:
            return mv.cast("Q")[:span * (seq_m.value_size // 8):seq_m.value_size // 8].tolist()

    def ack_max_ns(self, peer: int) -> int:
        """mrc_peer_seq.ack_max_ns of one peer (the newest send time that any
        of its evidence covers), from the map's memory."""
        seq_m = self.map("mrc_peer_seq")
        return _U64.unpack_from(seq_m.mapped(), peer * seq_m.value_size + _ACK_MAX_AT)[0]

    def usable(self, peer: int, path_id: int) -> bool:
        return abi.path_usable(*self.path(peer, path_id))

    def usable_paths(self, peer: int, n_paths: int) -> list[bool]:
        """usable() of the peer's paths 0..n_paths-1, read in three system calls."""
        first = self.path_idx(peer, 0)
        ents = self.map("mrc_paths").lookup_range(first, n_paths)
        admins = self.map("mrc_admin").lookup_range(first, n_paths)
        lives = self.map("mrc_live").lookup_range(first, n_paths)
        out = []
        for e, a, lv in zip(ents, admins, lives):
            p = abi.Path.unpack(e)
            p.admin = abi.unpack_u32(a)
            out.append(abi.path_usable(p, abi.PathLive.unpack(lv)))
        return out

    def ctl(self) -> Program:
        """The mrc_ctl program on this instance's maps, loaded on first use."""
        from .objects import MAP_NAMES, load_ctl
        if self._ctl is None:
            self._ctl = load_ctl({n: self.map(n) for n in MAP_NAMES if n in self.state.get("map_ids", {})})
        return self._ctl

    def retire(self, peer: int, path_id: int) -> bool:
        """Ask the datapath to move a GOOD path to ASSUMED_BAD (the agent's
        retirements: bpf/ctl.bpf.c); True if this call made the change."""
        from .objects import ctl_retire
        return ctl_retire(self.ctl(), peer, path_id)

    def close(self):
        for m in self._maps.values():
            m.close()
        self._maps.clear()
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
