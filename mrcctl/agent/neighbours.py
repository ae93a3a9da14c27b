"""Agent subsystem: keep each path's destination MAC in step with the kernel.

`up` resolves the peers' underlay MACs once; a peer that re-creates its
interface (or a routed underlay whose next hop moves) would otherwise keep
receiving frames for a MAC that no longer exists. Once a second the agent
dumps the neighbour table and rewrites only the paths whose MAC changed; a
peer behind a gateway gets the MAC of the next hop its route names. A
path whose next hop is unknown gets the zero MAC, which makes mrc_tx use
bpf_redirect_neigh so the kernel resolves it.
"""

from __future__ import annotations

import dataclasses

from ..datapath import abi as wire
from ..instance import topology
from . import loop as agentmod

PERIOD_S = 1.0


@agentmod.subsystem
def setup(agent: agentmod.Agent) -> None:
    nl = topology.Netlink()
    paths_m = agent.dp.map("mrc_paths")

    remote = {}       # str() of each path's peer address, once

    def refresh(_now: float) -> None:
        table = {k: wire.mac_str(v) for k, v in nl.neighbour_table().items()}
        hops: dict[tuple[str, str], str] = {}
        for _peer, path, key, entry in agent.path_entries():
            addr = remote.get(path.remote)
            if addr is None:
                addr = remote[path.remote] = str(path.remote)
            new = table.get((entry.ifindex, addr))
            if new is None:
                # routed plane: the gateway's MAC, from the route now in force
                hop = (path.plane.device, addr)
                if hop not in hops:
                    hops[hop] = nl.next_hop(*hop)
                new = table.get((entry.ifindex, hops[hop]))
            new = new or "00:00:00:00:00:00"
            if new != entry.dmac:
                paths_m.update(key, dataclasses.replace(entry, dmac=new).pack())

    agent.add_task("neighbours", PERIOD_S, refresh)
