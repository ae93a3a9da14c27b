"""Handles on the maps and programs of one running instance."""

from __future__ import annotations

from typing import Protocol

from ..errors import MrcError
from . import abi
from .libbpf import Map, Program


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

    def __init__(self, inst: Record):
        self.inst = inst
        self.state = inst.read()
        self._maps: dict[str, Map] = {}

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

    def path(self, peer: int, path_id: int) -> tuple[abi.Path, abi.PathLive]:
        """A path's entry (mrc_paths) and its liveness (mrc_live)."""
        key = abi.path_key(peer, path_id)
        return (abi.Path.unpack(self.map("mrc_paths").lookup(key)),
                abi.PathLive.unpack(self.map("mrc_live").lookup(key)))

    def usable(self, peer: int, path_id: int) -> bool:
        return abi.path_usable(*self.path(peer, path_id))

    def usable_paths(self, peer: int, n_paths: int) -> list[bool]:
        """usable() of the peer's paths 0..n_paths-1, read in two system calls."""
        first = abi.path_idx(peer, 0)
        ents = self.map("mrc_paths").lookup_range(first, n_paths)
        lives = self.map("mrc_live").lookup_range(first, n_paths)
        return [abi.path_usable(abi.Path.unpack(e), abi.PathLive.unpack(lv)) for e, lv in zip(ents, lives)]

    def close(self):
        for m in self._maps.values():
            m.close()
        self._maps.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
