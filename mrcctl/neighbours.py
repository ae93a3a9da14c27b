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

from . import agent as agentmod
from . import topology, wire

PERIOD_S = 1.0


@agentmod.subsystem
def setup(agent: agentmod.Agent) -> None:
    nl = topology.Netlink()
    paths_m = agent.dp.map("mrc_paths")

    def refresh(_now: float) -> None:
        table = nl.neighbour_table()
        hops: dict[tuple[str, str], str] = {}
        for peer in agent.cfg.peers:
            for path in peer.paths:
                key = wire.path_key(peer.index, path.id)
                raw = paths_m.lookup(key)
                if raw is None:
                    continue
                entry = wire.Path.unpack(raw)
                mac = table.get((entry.ifindex, str(path.remote)))
                if mac is None:
                    # routed plane: the gateway's MAC, from the route now in force
                    key = (path.plane.device, str(path.remote))
                    if key not in hops:
                        hops[key] = nl.next_hop(*key)
                    mac = table.get((entry.ifindex, hops[key]))
                new = wire.mac_str(mac) if mac else "00:00:00:00:00:00"
                if new != entry.dmac:
                    entry.dmac = new
                    paths_m.update(key, entry.pack())

    agent.add_task("neighbours", PERIOD_S, refresh)
