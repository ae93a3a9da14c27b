"""Agent subsystem: keep each path's destination MAC in step with the kernel.

`up` resolves the peers' underlay MACs once; a peer that re-creates its
interface (or a routed underlay whose next hop moves) would otherwise keep
receiving frames for a MAC that no longer exists. A peer behind a gateway
gets the MAC of the next hop its route names. The kernel says when either
changes (RTNLGRP_NEIGH; RTNLGRP_IPV4_ROUTE, _IPV6_ROUTE and _NEXTHOP): the
agent then dumps the neighbour table, asks the routes of the peers behind
gateways again (all on one socket, topology.next_hops) after a route
event, and rewrites only the paths whose MAC differs; every FULL_S it does
both regardless. Without the event socket it does both every second. A path
whose next hop is unknown gets the zero MAC, which makes mrc_tx use
bpf_redirect_neigh so the kernel resolves it.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import time

from ..datapath import abi as wire
from ..datapath import netdev
from ..instance import topology
from . import loop as agentmod

PERIOD_S = 1.0
FULL_S = 10.0          # a dump and every route asked again at least this often, events or not
EVENT_DELAY_S = 0.02   # a look this long after the kernel's event: the rest of a burst arrives first
SOL_NETLINK, NETLINK_ADD_MEMBERSHIP = 270, 1
RTNLGRP_NEIGH, RTNLGRP_IPV4_ROUTE, RTNLGRP_IPV6_ROUTE, RTNLGRP_NEXTHOP = 3, 7, 11, 32
RTM_DELROUTE, RTM_NEWNEIGH, RTM_DELNEIGH = 25, 28, 29
ALL = "all"            # changed["route"]: every route may have moved (else a list of the networks that did)
ROUTES_MAX = 64        # more changed networks than this between two looks count as ALL
_AT = wire.Path.offsets()
_IFINDEX = struct.Struct("=I")


@agentmod.subsystem
def setup(agent: agentmod.Agent) -> None:
    paths_m = agent.dp.map("mrc_paths")

    # per peer, its paths by plane: (the plane's path ids, the peer's
    # address there); every path of a plane goes to the same next hop
    groups = {peer.index: _groups(peer) for peer in agent.cfg.peers}
    seen: dict[int, int] = {}       # peer -> a hash of its entries when last checked
    # peers with a path behind a gateway at the last look -> (ifindex,
    # address) of each of their planes
    behind: dict[int, list] = {}
    hops: dict[tuple[int, str], str] = {}   # (ifindex, address) -> next hop, for addresses not neighbours
    # what the kernel said changed since the last look: the neighbours
    # (bool) and the routes (None, ALL, or the networks whose routes changed)
    changed: dict = {"neigh": True, "route": ALL}
    end = [agent.paths_end()]
    last_table: list = [None]
    # The table is dumped again only when the kernel said a neighbour
    # changed, and the routes asked again only when it said a route changed
    # (and both every FULL_S): a dump of thousands of neighbours a second was
    # 3 % of a core at 1,024 peers x 4 planes, and asking the route of each
    # of 1,024 peers behind gateways every second took the whole core.
    task: list = []
    events = _monitor(agent, changed, task)
    next_full = [0.0]
    zero = bytes(6)
    at = _AT["dmac"]

    def refresh(now: float) -> None:
        full = now >= next_full[0]
        if events is not None and not changed["neigh"] and not changed["route"] and not full:
            return
        route = changed["route"]
        stale: list[int] = []       # peers behind a gateway to look at again
        if events is None or full or route == ALL:
            hops.clear()
            stale = list(behind)
        elif route:
            # only the next hops of addresses in a network whose route changed,
            # and only the peers that use them: a host whose pods come and go
            # changes routes all the time, none of them toward a peer (asking
            # all 4,096 routes of 1,024 peers behind gateways costs ~55 ms of
            # CPU, looking at every one of them again ~20 ms)
            dead = {k for k in hops if any(_ip(k[1]) in n for n in route)}
            for k in dead:
                del hops[k]
            stale = [i for i, where in behind.items() if any(w in dead for w in where)]
        for i in stale:
            seen.pop(i, None)
        changed["route"] = None
        if route and route != ALL and not stale and not changed["neigh"] and not full:
            return              # routes toward nobody mrc sends to
        changed["neigh"] = False
        if full:
            next_full[0] = now + FULL_S
        table = topology.neighbour_table()
        same_table = table == last_table[0]
        last_table[0] = table
        # every path's entry in one read, its bytes not unpacked: one read
        # per peer was 2 % of a core at 1,024 peers
        vs = paths_m.value_size
        whole = paths_m.read_raw(0, end[0])
        later = []      # peers with an address whose next hop is not known yet
        for peer in agent.cfg.peers:
            first = agent.dp.path_idx(peer.index, 0)
            mine = whole[first * vs:(first + len(peer.paths)) * vs]
            token = hash(mine)
            # neither the neighbours, the routes nor the peer's entries
            # changed: nothing to do for its paths
            if same_table and seen.get(peer.index) == token:
                continue
            # (ifindex, address) of each plane, the ifindex from its first path's entry
            where = [(_IFINDEX.unpack_from(mine, ids[0] * vs + _AT["ifindex"])[0], addr)
                     if (ids[0] + 1) * vs <= len(mine) else None for ids, addr in groups[peer.index]]
            if all(w is None or w in table or w in hops for w in where):
                apply(peer, token, mine, where, table)
            else:
                later.append((peer, token, mine, where))
        if later:
            # their next hops, asked at once
            hops.update(topology.next_hops([w for *_, where in later for w in where
                                            if w and w not in table and w not in hops]))
            for item in later:
                apply(*item, table)

    def apply(peer, token: int, mine: bytes, where: list, table: dict) -> None:
        """Write the MAC each path of the peer should carry where it differs."""
        vs = paths_m.value_size
        routed = False
        gws = {}
        for (ids, _addr), w in zip(groups[peer.index], where):
            if w is None:
                continue
            mac = table.get(w)
            if mac is None:
                routed = True
                hop = hops.get(w, w[1])
                if hop != w[1]:
                    gws[w[0]] = hop
                mac = table.get((w[0], hop))
            if mac is None or len(mac) != 6:     # none yet, or not Ethernet's
                mac = zero
            for pid in ids:
                o = pid * vs
                if o + vs <= len(mine) and mine[o + at:o + at + 6] != mac:
                    paths_m.update(agent.dp.path_key(peer.index, pid), mine[o:o + at] + mac + mine[o + at + 6:o + vs])
        seen[peer.index] = token
        if routed:
            behind[peer.index] = where
        else:
            behind.pop(peer.index, None)
        if gws:
            agent.gateways[peer.index] = gws
        else:
            agent.gateways.pop(peer.index, None)

    def peers_changed(cfg, touched: set[int]) -> None:
        """A peer added here got its MACs from `add_peer`; it is looked at
        again by the next refresh, brought forward to now (its gateway may
        be one no other peer used)."""
        for i in touched:
            groups.pop(i, None)
            seen.pop(i, None)
            behind.pop(i, None)
            agent.gateways.pop(i, None)
        for peer in cfg.peers:
            if peer.index in touched:
                groups[peer.index] = _groups(peer)
        end[0] = agent.paths_end()
        changed["neigh"] = True
        task[0].due = 0.0

    task.append(agent.add_task("neighbours", PERIOD_S, refresh))
    agent.on_peers(peers_changed)


def _groups(peer) -> list[tuple[list[int], str]]:
    by_plane: dict[str, tuple[list[int], str]] = {}
    for path in peer.paths:
        g = by_plane.get(path.plane.device)
        if g is None:
            g = by_plane[path.plane.device] = ([], str(path.remote))
        g[0].append(path.id)
    return list(by_plane.values())


def _monitor(agent: agentmod.Agent, changed: dict, task: list):
    """A netlink socket on the neighbour, route and nexthop groups that
    marks in `changed` what the kernel said changed and brings the task
    (task[0]) forward to EVENT_DELAY_S from then; None if it cannot be had
    (then the table is dumped and the routes asked every period)."""
    try:
        s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        s.bind((0, 0))
        s.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, RTNLGRP_NEIGH)
        for group in (RTNLGRP_IPV4_ROUTE, RTNLGRP_IPV6_ROUTE, RTNLGRP_NEXTHOP):
            try:
                s.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, group)
            except OSError:       # a kernel without the group (nexthop objects: 5.3)
                pass
        s.setblocking(False)
    except OSError:
        return None

    def drain() -> None:
        while True:
            try:
                buf = s.recv(65536)
            except BlockingIOError:
                break
            except OSError:       # ENOBUFS: events were lost; a look at both catches up
                changed["neigh"], changed["route"] = True, ALL
                break
            if not buf:
                break
            for mtype, _seq, start, end in netdev.messages(buf):
                if mtype in (RTM_NEWNEIGH, RTM_DELNEIGH):
                    changed["neigh"] = True
                else:       # a route, or a nexthop object (any route may use it)
                    net = _route_dst(buf, start, end) if mtype in (topology.RTM_NEWROUTE, RTM_DELROUTE) else None
                    if net is None or changed["route"] == ALL or len(changed["route"] or ()) >= ROUTES_MAX:
                        changed["route"] = ALL
                    else:
                        changed["route"] = (changed["route"] or []) + [net]
        if task and (changed["neigh"] or changed["route"]):
            task[0].due = min(task[0].due, time.monotonic() + EVENT_DELAY_S)

    agent.add_reader(s.fileno(), drain)
    return s


def _route_dst(buf: bytes, off: int, end: int):
    """The network of a route message (struct rtmsg, then RTA_DST); None for
    a default route or one that cannot be read: every address may use it."""
    if off + topology.RTMSG.size > end:
        return None
    family, dst_len = topology.RTMSG.unpack_from(buf, off)[:2]
    dst = netdev.attrs(buf, off + topology.RTMSG.size, end).get(topology.RTA_DST)
    if not dst_len or not dst or family not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        return ipaddress.ip_network((ipaddress.ip_address(dst), dst_len), strict=False)
    except ValueError:
        return None


_IPS: dict[str, object] = {}


def _ip(addr: str):
    """ipaddress.ip_address(addr), made once per address."""
    ip = _IPS.get(addr)
    if ip is None:
        if len(_IPS) > 1 << 16:
            _IPS.clear()
        ip = _IPS[addr] = ipaddress.ip_address(addr)
    return ip
