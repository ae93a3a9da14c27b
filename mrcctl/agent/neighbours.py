"""Agent subsystem: keep each path's destination MAC in step with the kernel.

`up` resolves the peers' underlay MACs once; a peer that re-creates its
interface (or a routed underlay whose next hop moves) would otherwise keep
receiving frames for a MAC that no longer exists. After the kernel reports
a neighbour change (RTNLGRP_NEIGH), every second while a peer is behind a
gateway and every FULL_S regardless, the agent dumps the neighbour table
and rewrites only the paths whose MAC differs; a peer behind a gateway
gets the MAC of the next hop its route names. A
path whose next hop is unknown gets the zero MAC, which makes mrc_tx use
bpf_redirect_neigh so the kernel resolves it.
"""

from __future__ import annotations

import socket
import struct

from ..datapath import abi as wire
from ..instance import topology
from . import loop as agentmod

PERIOD_S = 1.0
FULL_S = 10.0          # a dump at least this often, events or not
RTMGRP_NEIGH = 0x4
_AT = wire.Path.offsets()
_IFINDEX = struct.Struct("=I")


@agentmod.subsystem
def setup(agent: agentmod.Agent) -> None:
    nl = topology.Netlink()
    paths_m = agent.dp.map("mrc_paths")

    remote = {}       # str() of each path's peer address, once

    seen: dict[int, int] = {}       # peer -> a hash of its entries when last checked, if all on-link
    changed = [True]                # a neighbour event came since the last dump
    end = max((agent.dp.path_idx(p.index, 0) + len(p.paths) for p in agent.cfg.peers), default=0)
    last_table: list = [None]
    # The table is dumped again only when the kernel said a neighbour
    # changed (RTNLGRP_NEIGH), when a peer is routed (its route may move
    # without a neighbour event), and every FULL_S: a dump of thousands of
    # neighbours a second was 3 % of a core at 1,024 peers x 4 planes.
    events = _neigh_monitor(agent, changed)
    next_full = [0.0]

    def refresh(now: float) -> None:
        if events is not None and not changed[0] and len(seen) == len(agent.cfg.peers) and now < next_full[0]:
            return
        changed[0] = False
        next_full[0] = now + FULL_S
        table = {k: wire.mac_str(v) for k, v in nl.neighbour_table().items()}
        hops: dict[tuple[str, str], str] = {}
        same_table = table == last_table[0]
        last_table[0] = table
        # every path's entry in one read, its bytes not unpacked: one read
        # per peer was 2 % of a core at 1,024 peers
        vs = paths_m.value_size
        whole = paths_m.read_raw(0, end)
        for peer in agent.cfg.peers:
            first = agent.dp.path_idx(peer.index, 0)
            mine = whole[first * vs:(first + len(peer.paths)) * vs]
            token = hash(mine)
            # neither the neighbours nor the peer's entries changed: nothing
            # to do for its paths; a peer behind a gateway is looked at every
            # time (its route may have moved)
            if same_table and seen.get(peer.index) == token:
                continue
            raws = [mine[i:i + vs] for i in range(0, len(mine), vs)]
            if _refresh_peer(peer, raws, table, hops):
                seen.pop(peer.index, None)
            else:
                seen[peer.index] = token

    def _refresh_peer(peer, raws, table, hops) -> bool:
        """True if a path of the peer is routed (its MAC is a gateway's)."""
        routed = False
        for path in peer.paths:
            if path.id >= len(raws):
                continue
            raw = raws[path.id]
            ifindex = _IFINDEX.unpack_from(raw, _AT["ifindex"])[0]
            addr = remote.get(path.remote)
            if addr is None:
                addr = remote[path.remote] = str(path.remote)
            new = table.get((ifindex, addr))
            if new is None:
                # routed plane: the gateway's MAC, from the route now in force
                routed = True
                hop = (path.plane.device, addr)
                if hop not in hops:
                    hops[hop] = nl.next_hop(*hop)
                new = table.get((ifindex, hops[hop]))
            mac = wire.mac_bytes(new or "00:00:00:00:00:00")
            at = _AT["dmac"]
            if raw[at:at + 6] != mac:
                paths_m.update(agent.dp.path_key(peer.index, path.id), raw[:at] + mac + raw[at + 6:])
        return routed

    agent.add_task("neighbours", PERIOD_S, refresh)


def _neigh_monitor(agent: agentmod.Agent, changed: list):
    """A netlink socket on the neighbour group that sets changed[0] when
    any neighbour entry changes; None if it cannot be had (then the table
    is dumped every period, as before)."""
    try:
        s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        s.bind((0, RTMGRP_NEIGH))
        s.setblocking(False)
    except OSError:
        return None

    def drain() -> None:
        while True:
            try:
                if not s.recv(65536):
                    break
            except BlockingIOError:
                break
            except OSError:       # ENOBUFS: events were lost; the dump catches up
                break
        changed[0] = True

    agent.add_reader(s.fileno(), drain)
    return s
