"""Routed leaf-spine planes in network namespaces: where an EV is a real ECMP path.

Every plane is its own routed fabric (planes fail independently, as NICs on
separate rails do): L leaf (ToR) namespaces and S spine namespaces, every
leaf joined to every spine. Hosts are split across the leaves in blocks
(hosts 0..N/L-1 on leaf 0, ...), so with two leaves a transfer from the first
half to the second half crosses a spine. Each host has one device per plane
with its plane address in a subnet of its own and its leaf as the gateway.
Leaves hash on addresses and L4 ports (``fib_multipath_hash_policy=3`` with
``fib_multipath_hash_fields``, see HASH_FIELDS) over one next hop per spine, so the outer UDP source port of an mrc packet (its EV) picks the
spine. A flow's two directions are hashed independently on the two leaves.

Names (prefix default "mrcf"):

* host i: namespace ``{prefix}-h{i}``, device ``p{p}`` on plane p,
  ``10.{100+p}.{i}.2/24`` (gateway ``.1`` on the leaf); with ipv6 also
  ``fd01:{p:x}:{i:x}::2/64``.
* leaf l of plane p: namespace ``{prefix}-p{p}l{l}``, device ``h{i}`` toward
  host i, ``s{s}`` toward spine s (``10.{150+p}.{l*16+s}.1/24``).
* spine s of plane p: namespace ``{prefix}-p{p}s{s}``, device ``l{l}`` toward
  leaf l (``10.{150+p}.{l*16+s}.2/24``).
* Leaf routes: its hosts' subnets are connected; the plane's whole range
  ``10.{100+p}.0.0/16`` has one ``nexthop via SPINE`` per spine. Spines route
  each host subnet to the host's leaf. Hosts route the plane's range via
  their leaf.

Which spine an EV takes, asked from the kernel (as `ev_spine` does)::

    ip -n {prefix}-p0l0 route get 10.100.1.2 from 10.100.0.2 iif h0 \\
        ipproto udp sport 49152 dport 4794

Fabric links are named (plane, leaf, spine); a direction is "up"
(leaf -> spine), "down" (spine -> leaf) or "both". Faults are the same
classic-BPF tc egress filters as the point-to-point testbed, placed on the
egress of the link end that sends in the chosen direction, so forwarded
traffic is dropped with the carrier up (a gray failure). Cross traffic is a
bounded, paced UDP stream from one end of a link to the other (GSO sends,
mrcctl/lab/udpgen.py), counted at the far end.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import struct
import subprocess
import sys
import time
from typing import Iterable

from ..datapath.objects import bpf_dir
from . import testbed as tbmod
from .testbed import (FAULT_PREF_BLACKHOLE, FAULT_PREF_ECN, FAULT_PREF_LOSS, Testbed, TestbedError, _CBPF_DROP_ALL, _run,
                      device_status, format_rate, loss_bytecode, parse_rate, set_egress_filter)

DEFAULT_PREFIX = "mrcf"
MAX_FABRIC_HOSTS = 200
MAX_LEAVES = 16
MAX_SPINES = 16
MAX_FABRIC_PLANES = 40  # keeps 150+p <= 190 and 100+p below the link range
DIRECTIONS = ("up", "down", "both")
# Routers hash (source, destination address, protocol, source, destination
# port) with the custom policy 3, as a switch hashes header fields. Policy 1
# would reuse an L4 hash the packet already carries (skb->hash survives veth;
# the sender's stack or mrc's inner TCP flow set it), so every EV of a flow
# took one spine, whatever `ip route get` said.
HASH_FIELDS = 0x0001 | 0x0002 | 0x0004 | 0x0010 | 0x0020
XDP_PASS_OBJ = bpf_dir() / "xdp_pass.bpf.o"
ECN_MARK_OBJ = bpf_dir() / "ecn_mark.bpf.o"
ECN_MARK_QUEUE = 30000   # bytes in the phantom queue above which a rate-limited marker marks


class Fabric(Testbed):
    """N hosts over P routed leaf-spine planes; see the module doc."""

    __test__ = False

    def __init__(self, hosts: int = 4, planes: int = 2, spines: int = 2, leaves: int = 2,
                 link_rate=None, host_rate=None, ipv6: bool = False,
                 prefix: str = DEFAULT_PREFIX, mtu: int = 1500):
        if not 2 <= int(hosts) <= MAX_FABRIC_HOSTS:
            raise TestbedError(f"hosts must be 2..{MAX_FABRIC_HOSTS}")
        if not 1 <= int(planes) <= MAX_FABRIC_PLANES:
            raise TestbedError(f"planes must be 1..{MAX_FABRIC_PLANES}")
        if not 1 <= int(leaves) <= min(MAX_LEAVES, int(hosts)):
            raise TestbedError(f"leaves must be 1..{min(MAX_LEAVES, int(hosts))} (at most one per host)")
        if not 1 <= int(spines) <= MAX_SPINES:
            raise TestbedError(f"spines must be 1..{MAX_SPINES}")
        super().__init__(hosts=2, planes=1, rates=host_rate, ipv6=ipv6, prefix=prefix, mtu=mtu)
        self.n_hosts = int(hosts)
        self.n_planes = int(planes)
        self.n_leaves = int(leaves)
        self.n_spines = int(spines)
        self.host_rate = parse_rate(host_rate)
        self.link_rate = parse_rate(link_rate)
        self.rates = [self.host_rate] * self.n_planes
        self._ecn_state: dict[tuple[str, str], int] = {}   # (ns, dev) -> the marker's ecn_state map id

    # ---- names and addresses -------------------------------------------

    def leaf_of(self, i: int) -> int:
        self._check_host(i)
        return i * self.n_leaves // self.n_hosts

    def leaf_ns(self, p: int, leaf: int) -> str:
        self._check_plane(p)
        self._check_leaf(leaf)
        return f"{self.prefix}-p{p}l{leaf}"

    def spine_ns(self, p: int, spine: int) -> str:
        self._check_plane(p)
        self._check_spine(spine)
        return f"{self.prefix}-p{p}s{spine}"

    def routers(self) -> list[str]:
        return [self.leaf_ns(p, lf) for p in range(self.n_planes) for lf in range(self.n_leaves)] + \
               [self.spine_ns(p, s) for p in range(self.n_planes) for s in range(self.n_spines)]

    def dev(self, i: int, j: int, p: int) -> str:
        """Host i's device on plane p (the same toward every peer j)."""
        self._check_link(i, j, p)
        return f"p{p}"

    def planes(self, i: int, j: int | None = None) -> list[str]:
        self._check_host(i)
        return [f"p{p}" for p in range(self.n_planes)]

    def host_addr(self, i: int, p: int, family: int = 4) -> str:
        self._check_host(i)
        self._check_plane(p)
        return tbmod.family_addr(family, self.ipv6, "fabric", f"10.{100 + p}.{i}.2", f"fd01:{p:x}:{i:x}::2")

    def gateway(self, i: int, p: int, family: int = 4) -> str:
        return self.host_addr(i, p, family)[:-1] + "1"

    def addr(self, i: int, j: int, p: int, family: int = 4) -> str:
        """Host i's address on plane p (independent of the peer j)."""
        self._check_link(i, j, p)
        return self.host_addr(i, p, family)

    def link_addr(self, p: int, leaf: int, spine: int, end: str, family: int = 4) -> str:
        """Address of the leaf ("leaf") or spine ("spine") end of a fabric link."""
        self._check_fabric_link(p, leaf, spine)
        host = {"leaf": 1, "spine": 2}[end]
        if family == 4:
            return f"10.{150 + p}.{leaf * 16 + spine}.{host}"
        return str(ipaddress.IPv6Address(f"fd02:{p:x}:{leaf * 16 + spine:x}::{host}"))

    def mac(self, i: int, j: int, p: int) -> str:
        self._check_link(i, j, p)
        return self.host_mac(i, p)

    def host_mac(self, i: int, p: int) -> str:
        return f"02:6e:{p:02x}:01:00:{i:02x}"

    @staticmethod
    def _router_mac(p: int, kind: int, a: int, b: int) -> str:
        return f"02:6e:{p:02x}:{kind:02x}:{a:02x}:{b:02x}"

    def links(self) -> Iterable[tuple[int, int, int]]:
        """(plane, leaf, spine) for every fabric link."""
        for p in range(self.n_planes):
            for lf in range(self.n_leaves):
                for s in range(self.n_spines):
                    yield p, lf, s

    def _check_plane(self, p: int) -> None:
        if not (isinstance(p, int) and 0 <= p < self.n_planes):
            raise TestbedError(f"no plane {p!r} (planes are 0..{self.n_planes - 1})")

    def _check_leaf(self, leaf: int) -> None:
        if not (isinstance(leaf, int) and 0 <= leaf < self.n_leaves):
            raise TestbedError(f"no leaf {leaf!r} (leaves are 0..{self.n_leaves - 1})")

    def _check_spine(self, spine: int) -> None:
        if not (isinstance(spine, int) and 0 <= spine < self.n_spines):
            raise TestbedError(f"no spine {spine!r} (spines are 0..{self.n_spines - 1})")

    def _check_fabric_link(self, p: int, leaf: int, spine: int) -> None:
        self._check_plane(p)
        self._check_leaf(leaf)
        self._check_spine(spine)

    def layout(self) -> dict:
        hosts = []
        for i in self.hosts():
            devs = [{"dev": f"p{p}", "plane": p, "leaf": self.leaf_of(i),
                     "addr4": self.host_addr(i, p), "gateway4": self.gateway(i, p),
                     "mac": self.host_mac(i, p), "rate": format_rate(self.host_rate),
                     **({"addr6": self.host_addr(i, p, 6), "gateway6": self.gateway(i, p, 6)}
                        if self.ipv6 else {})}
                    for p in range(self.n_planes)]
            hosts.append({"host": i, "ns": self.ns(i), "leaf": self.leaf_of(i),
                          "overlay_addr": self.overlay_addr(i), "devices": devs})
        return {
            "kind": "leaf-spine",
            "prefix": self.prefix,
            "hosts": self.n_hosts,
            "planes": self.n_planes,
            "leaves": self.n_leaves,
            "spines": self.n_spines,
            "ipv6": self.ipv6,
            "mtu": self.mtu,
            "link_rate": format_rate(self.link_rate),
            "host_rate": format_rate(self.host_rate),
            "namespaces": [self.ns(i) for i in self.hosts()] + self.routers(),
            "host_info": hosts,
            "links": [{"plane": p, "leaf": lf, "spine": s,
                       "leaf_ns": self.leaf_ns(p, lf), "leaf_dev": f"s{s}",
                       "spine_ns": self.spine_ns(p, s), "spine_dev": f"l{lf}",
                       "leaf_addr4": self.link_addr(p, lf, s, "leaf"),
                       "spine_addr4": self.link_addr(p, lf, s, "spine")}
                      for p, lf, s in self.links()],
        }

    # ---- lifecycle ---------------------------------------------------------

    def _router_sysctls(self) -> list[str]:
        lines = ["echo 1 > /proc/sys/net/ipv4/ip_forward",
                 "echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter",
                 "echo 0 > /proc/sys/net/ipv4/conf/default/rp_filter",
                 "echo 3 > /proc/sys/net/ipv4/fib_multipath_hash_policy",
                 f"echo {HASH_FIELDS:#06x} > /proc/sys/net/ipv4/fib_multipath_hash_fields"]
        if self.ipv6:
            lines += ["echo 1 > /proc/sys/net/ipv6/conf/all/forwarding",
                      "echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad",
                      "echo 3 > /proc/sys/net/ipv6/fib_multipath_hash_policy",
                      f"echo {HASH_FIELDS:#06x} > /proc/sys/net/ipv6/fib_multipath_hash_fields"]
        else:
            lines.append("if [ -d /proc/sys/net/ipv6 ]; then "
                         "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6; fi")
        return lines

    def _build(self) -> None:
        if not XDP_PASS_OBJ.exists():
            raise TestbedError(f"{XDP_PASS_OBJ} is missing: build the BPF objects (make -C bpf)")
        for ns in [self.ns(i) for i in self.hosts()] + self.routers():
            _run(["ip", "netns", "add", ns])
        for i in self.hosts():
            lines = ["echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter",
                     "echo 0 > /proc/sys/net/ipv4/conf/default/rp_filter"]
            lines.append("echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad" if self.ipv6 else
                         "if [ -d /proc/sys/net/ipv6 ]; then "
                         "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6; fi")
            _run(["ip", "netns", "exec", self.ns(i), "sh", "-ec", "\n".join(lines)])
            _run(["ip", "-n", self.ns(i), "link", "set", "lo", "up"])
        for ns in self.routers():
            _run(["ip", "netns", "exec", ns, "sh", "-ec", "\n".join(self._router_sysctls())])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])

        mtu = self.mtu
        for p in range(self.n_planes):
            # host <-> leaf links, created from the leaf
            for lf in range(self.n_leaves):
                cmds = []
                for i in (h for h in self.hosts() if self.leaf_of(h) == lf):
                    cmds.append(f"link add h{i} address {self._router_mac(p, 2, lf, i)} mtu {mtu} "
                                f"type veth peer name p{p} address {self.host_mac(i, p)} mtu {mtu} "
                                f"netns {self.ns(i)}")
                for s in range(self.n_spines):
                    cmds.append(f"link add s{s} address {self._router_mac(p, 3, lf, s)} mtu {mtu} "
                                f"type veth peer name l{lf} address {self._router_mac(p, 4, s, lf)} "
                                f"mtu {mtu} netns {self.spine_ns(p, s)}")
                self._ns_batch("ip", self.leaf_ns(p, lf), cmds)

        v6 = self.ipv6
        for i in self.hosts():
            cmds, tc = [], []
            for p in range(self.n_planes):
                lf_mac = self._router_mac(p, 2, self.leaf_of(i), i)
                cmds += [f"addr add {self.host_addr(i, p)}/24 dev p{p}", f"link set p{p} up",
                         self._neigh(self.gateway(i, p), lf_mac, f"p{p}"),
                         f"route add 10.{100 + p}.0.0/16 via {self.gateway(i, p)} dev p{p}",
                         # the routers' own links, so that their ICMP answers
                         # (EV traces: agent/evmap.py) pass reverse-path filtering
                         f"route add 10.{150 + p}.0.0/16 via {self.gateway(i, p)} dev p{p}"]
                if v6:
                    cmds += [f"addr add {self.host_addr(i, p, 6)}/64 dev p{p} nodad",
                             self._neigh(self.gateway(i, p, 6), lf_mac, f"p{p}"),
                             f"route add fd01:{p:x}::/32 via {self.gateway(i, p, 6)} dev p{p}"]
                tc.append(self._qdisc_cmd(f"p{p}", self.host_rate))
            self._ns_batch("ip", self.ns(i), self._v6_ordered(cmds))
            self._ns_batch("tc", self.ns(i), tc)
        for p in range(self.n_planes):
            for lf in range(self.n_leaves):
                ns = self.leaf_ns(p, lf)
                cmds, tc, hop4, hop6 = [], [], [], []
                for i in (h for h in self.hosts() if self.leaf_of(h) == lf):
                    cmds += [f"addr add {self.gateway(i, p)}/24 dev h{i}", f"link set h{i} up",
                             self._neigh(self.host_addr(i, p), self.host_mac(i, p), f"h{i}")]
                    if v6:
                        cmds += [f"addr add {self.gateway(i, p, 6)}/64 dev h{i} nodad",
                                 self._neigh(self.host_addr(i, p, 6), self.host_mac(i, p), f"h{i}")]
                    tc.append(self._qdisc_cmd(f"h{i}", self.host_rate))
                for s in range(self.n_spines):
                    sp_mac = self._router_mac(p, 4, s, lf)
                    cmds += [f"addr add {self.link_addr(p, lf, s, 'leaf')}/24 dev s{s}",
                             f"link set s{s} up",
                             self._neigh(self.link_addr(p, lf, s, 'spine'), sp_mac, f"s{s}")]
                    hop4.append(f"nexthop via {self.link_addr(p, lf, s, 'spine')} dev s{s}")
                    if v6:
                        cmds += [f"addr add {self.link_addr(p, lf, s, 'leaf', 6)}/64 dev s{s} nodad",
                                 self._neigh(self.link_addr(p, lf, s, 'spine', 6), sp_mac, f"s{s}")]
                        hop6.append(f"nexthop via {self.link_addr(p, lf, s, 'spine', 6)} dev s{s}")
                    tc.append(self._qdisc_cmd(f"s{s}", self.link_rate))
                cmds.append(f"route add 10.{100 + p}.0.0/16 " + " ".join(hop4))
                if v6:
                    cmds.append(f"route add fd01:{p:x}::/32 " + " ".join(hop6))
                self._ns_batch("ip", ns, self._v6_ordered(cmds))
                self._ns_batch("tc", ns, tc)
                # mrc answers probes with XDP_TX; a veth delivers those frames
                # only to a peer that runs XDP (bpf/xdp_pass.bpf.c says why).
                for i in (h for h in self.hosts() if self.leaf_of(h) == lf):
                    # xdp.frags: veth refuses XDP without multi-buffer
                    # support once the link's MTU exceeds a page (jumbo).
                    _run(["ip", "-n", ns, "link", "set", "dev", f"h{i}", "xdpdrv", "obj", str(XDP_PASS_OBJ),
                          "sec", "xdp.frags"])
            for s in range(self.n_spines):
                ns = self.spine_ns(p, s)
                cmds, tc = [], []
                for lf in range(self.n_leaves):
                    lf_mac = self._router_mac(p, 3, lf, s)
                    cmds += [f"addr add {self.link_addr(p, lf, s, 'spine')}/24 dev l{lf}",
                             f"link set l{lf} up",
                             self._neigh(self.link_addr(p, lf, s, 'leaf'), lf_mac, f"l{lf}")]
                    if v6:
                        cmds += [f"addr add {self.link_addr(p, lf, s, 'spine', 6)}/64 dev l{lf} nodad",
                                 self._neigh(self.link_addr(p, lf, s, 'leaf', 6), lf_mac, f"l{lf}")]
                    tc.append(self._qdisc_cmd(f"l{lf}", self.link_rate))
                for i in self.hosts():
                    lf = self.leaf_of(i)
                    cmds.append(f"route add 10.{100 + p}.{i}.0/24 via "
                                f"{self.link_addr(p, lf, s, 'leaf')} dev l{lf}")
                    if v6:
                        cmds.append(f"route add fd01:{p:x}:{i:x}::/64 via "
                                    f"{self.link_addr(p, lf, s, 'leaf', 6)} dev l{lf}")
                self._ns_batch("ip", ns, self._v6_ordered(cmds))
                self._ns_batch("tc", ns, tc)
        self._write_state()

    @staticmethod
    def _neigh(addr: str, mac: str, dev: str) -> str:
        # Permanent neighbours keep a one-way fault one-way: with ARP/ND the
        # far end's entry would age out and its probes, answered over the
        # dead direction, would fail the healthy direction too.
        return f"neigh replace {addr} lladdr {mac} dev {dev} nud permanent"

    @staticmethod
    def _v6_ordered(cmds: list[str]) -> list[str]:
        # Routes and neighbours need their addresses and links up first.
        late = ("route", "neigh")
        return [c for c in cmds if not c.startswith(late)] + [c for c in cmds if c.startswith(late)]

    @staticmethod
    def _ns_batch(tool: str, ns: str, cmds: list[str]) -> None:
        if cmds:
            _run([tool, "-n", ns, "-batch", "-"], input="\n".join(cmds) + "\n")

    def _write_state(self) -> None:
        os.makedirs(tbmod.STATE_DIR, exist_ok=True)
        state = {"kind": "leaf-spine", "hosts": self.n_hosts, "planes": self.n_planes,
                 "leaves": self.n_leaves, "spines": self.n_spines,
                 "link_rate": format_rate(self.link_rate), "host_rate": format_rate(self.host_rate),
                 "ipv6": self.ipv6, "prefix": self.prefix, "mtu": self.mtu}
        path = tbmod.state_path(self.prefix)
        with open(path + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(path + ".tmp", path)

    @classmethod
    def from_state(cls, st: dict) -> "Fabric":
        none = lambda r: None if r == "none" else r  # noqa: E731
        return cls(st["hosts"], st["planes"], st["spines"], st["leaves"], none(st["link_rate"]),
                   none(st["host_rate"]), st["ipv6"], st["prefix"], st["mtu"])

    def is_up(self) -> bool:
        return all(os.path.exists(os.path.join(tbmod.NETNS_DIR, ns))
                   for ns in [self.ns(i) for i in self.hosts()] + self.routers())

    # ---- running things in routers -------------------------------------

    def router_exec(self, ns: str, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        if ns not in self.routers():
            raise TestbedError(f"{ns!r} is not a router of this fabric")
        check = kw.pop("check", True)
        return _run(["ip", "netns", "exec", ns, *map(str, cmd)], check=check, **kw)

    # ---- which spine an EV takes ---------------------------------------

    def ev_spine(self, p: int, src: int, dst: int, ev: int, port: int = 4794,
                 family: int = 4) -> int | None:
        """The spine that src's leaf on plane p sends a packet from src to dst
        with outer UDP source port ev through, as the kernel's FIB says;
        None when both hosts share a leaf (no spine is crossed)."""
        return self.ev_spines(p, src, dst, [ev], port, family)[ev]

    def ev_spines(self, p: int, src: int, dst: int, evs: Iterable[int], port: int = 4794,
                  family: int = 4) -> dict[int, int | None]:
        evs = list(evs)
        if family != 4:
            # Measured on kernel 6.18: for IPv6, `ip route get ... iif` names
            # a different spine than forwarding takes for about half the EVs
            # (with policy 1 or 3 alike), so its answer is not evidence.
            raise TestbedError("the kernel's route lookup predicts EV spines for IPv4 only")
        lf = self.leaf_of(src)
        if lf == self.leaf_of(dst):
            return {ev: None for ev in evs}
        cmds = [f"route get {self.host_addr(dst, p, family)} from {self.host_addr(src, p, family)} "
                f"iif h{src} ipproto udp sport {ev} dport {port}" for ev in evs]
        out = _run(["ip", "-n", self.leaf_ns(p, lf), "-batch", "-"], input="\n".join(cmds) + "\n").stdout
        spines = [int(m.group(1)) for m in re.finditer(r" dev s(\d+)", out)]
        if len(spines) != len(evs):
            raise TestbedError(f"route get on {self.leaf_ns(p, lf)} answered {out!r}")
        return dict(zip(evs, spines))

    def evs_across(self, p: int, leaf: int, spine: int, src: int, dst: int, evs: Iterable[int],
                   port: int = 4794, family: int = 4) -> list[int]:
        """Of `evs`, those whose packets from src to dst cross the link
        (p, leaf, spine) in either direction of that link."""
        self._check_fabric_link(p, leaf, spine)
        if leaf not in (self.leaf_of(src), self.leaf_of(dst)):
            return []
        return [ev for ev, s in self.ev_spines(p, src, dst, evs, port, family).items() if s == spine]

    # ---- faults on fabric links ----------------------------------------

    def _link_ends(self, p: int, leaf: int, spine: int, direction: str) -> list[tuple[str, str]]:
        """(namespace, device) of the sending end(s) for a direction."""
        self._check_fabric_link(p, leaf, spine)
        if direction not in DIRECTIONS:
            raise TestbedError(f"direction must be one of {', '.join(DIRECTIONS)}")
        ends = []
        if direction in ("up", "both"):
            ends.append((self.leaf_ns(p, leaf), f"s{spine}"))
        if direction in ("down", "both"):
            ends.append((self.spine_ns(p, spine), f"l{leaf}"))
        return ends

    def link_blackhole(self, p: int, leaf: int, spine: int, on: bool = True,
                       direction: str = "both") -> None:
        """Gray failure: drop everything on the link in `direction`, carrier up."""
        for ns, dev in self._link_ends(p, leaf, spine, direction):
            set_egress_filter(ns, dev, FAULT_PREF_BLACKHOLE, _CBPF_DROP_ALL if on else None)

    def link_loss(self, p: int, leaf: int, spine: int, percent: float, direction: str = "both") -> None:
        code = loss_bytecode(percent)
        for ns, dev in self._link_ends(p, leaf, spine, direction):
            set_egress_filter(ns, dev, FAULT_PREF_LOSS, code)

    def link_ecn_mark(self, p: int, leaf: int, spine: int, on: bool = True, direction: str = "both",
                      rate=None, queue_bytes: int = ECN_MARK_QUEUE) -> None:
        """A congested link that marks CE on ECN-capable packets instead of
        dropping them (bpf/ecn_mark.bpf.c: this kernel has no RED/CoDel):
        every one, or with `rate` only those that find more than
        `queue_bytes` in a phantom queue draining at that rate, i.e. while
        the link carries more than `rate` (set it a little under the link's
        own rate, as HULL does)."""
        bits = parse_rate(rate) if rate is not None else 0
        if rate is not None and not bits:
            raise TestbedError("a marking rate must be above 0")
        if not 0 < int(queue_bytes) <= 1 << 30:
            raise TestbedError("queue_bytes must be 1..2^30")
        for ns, dev in self._link_ends(p, leaf, spine, direction):
            if not on:
                _run(["tc", "-n", ns, "filter", "del", "dev", dev, "egress", "pref", str(FAULT_PREF_ECN)],
                     check=False)
                self._ecn_state.pop((ns, dev), None)
                continue
            self._ecn_state[(ns, dev)] = _attach_ecn_marker(ns, dev, bits // 8, int(queue_bytes))

    def ecn_marks(self, p: int, leaf: int, spine: int, direction: str = "up") -> dict[str, int]:
        """What the CE marker this object attached to the link's end saw:
        {"seen": wire packets, "marked": wire packets} (a GSO skb counts its segments)."""
        from ..datapath.libbpf import Map

        (ns, dev), = self._link_ends(p, leaf, spine, direction)
        if (ns, dev) not in self._ecn_state:
            raise TestbedError(f"no CE marker attached here on {dev} in {ns}")
        with Map.from_id(self._ecn_state[(ns, dev)]) as m:
            _, _, marked, seen = struct.unpack("=4Q", m.lookup(b"\0" * 4))
        return {"seen": seen, "marked": marked}

    def link_carrier(self, p: int, leaf: int, spine: int, up: bool) -> None:
        """Take the link down (both ends see it: the routers drop its next hop)."""
        self._check_fabric_link(p, leaf, spine)
        _run(["ip", "-n", self.leaf_ns(p, leaf), "link", "set", f"s{spine}", "up" if up else "down"])

    def link_mtu(self, p: int, leaf: int, spine: int, mtu: int | None = None) -> None:
        """Set the link's MTU on both ends (None: the fabric's own). A smaller
        one makes its routers answer full-size DF packets with ICMP
        "fragmentation needed", as a misconfigured or tunnelled hop would."""
        mtu = self.mtu if mtu is None else int(mtu)
        if not 68 <= mtu <= 65535:
            raise TestbedError("mtu must be 68..65535")
        for ns, dev in self._link_ends(p, leaf, spine, "both"):
            _run(["ip", "-n", ns, "link", "set", "dev", dev, "mtu", str(mtu)])

    def set_link_rate(self, p: int, leaf: int, spine: int, rate, direction: str = "both") -> None:
        bits = parse_rate(rate)
        for ns, dev in self._link_ends(p, leaf, spine, direction):
            _run(["tc", "-n", ns, *self._qdisc_cmd(dev, bits).split()])

    def link_status(self, p: int, leaf: int, spine: int) -> dict:
        """Both ends of a link: "up" is the leaf's end (it sends toward the
        spine), "down" the spine's."""
        return {end: {"ns": ns, **device_status(ns, dev)}
                for end, (ns, dev) in zip(("up", "down"), self._link_ends(p, leaf, spine, "both"))}

    def clear_faults(self, host: int | None = None, plane: int | None = None) -> None:
        for p, lf, s in self.links():
            if plane in (None, p):
                self.link_blackhole(p, lf, s, on=False)
                self.link_loss(p, lf, s, 0)
                self.link_ecn_mark(p, lf, s, on=False)
                self.link_carrier(p, lf, s, True)
                self.link_mtu(p, lf, s)
        super().clear_faults(host, plane)

    # host links: the host's own egress, or with both=True the leaf's too
    def _targets(self, host: int, plane: int, peer: int | None) -> list[tuple[int, int, str]]:
        self._check_host(host)
        self._check_plane(plane)
        return [(host, -1, f"p{plane}")]

    def blackhole(self, host: int, plane: int, on: bool = True, peer: int | None = None,
                  both: bool = False) -> None:
        self._set_filter(host, f"p{plane}", FAULT_PREF_BLACKHOLE, _CBPF_DROP_ALL if on else None)
        if both:
            set_egress_filter(self.leaf_ns(plane, self.leaf_of(host)), f"h{host}",
                                FAULT_PREF_BLACKHOLE, _CBPF_DROP_ALL if on else None)

    def loss(self, host: int, plane: int, percent: float, peer: int | None = None,
             both: bool = False) -> None:
        code = loss_bytecode(percent)
        self._set_filter(host, f"p{plane}", FAULT_PREF_LOSS, code)
        if both:
            set_egress_filter(self.leaf_ns(plane, self.leaf_of(host)), f"h{host}", FAULT_PREF_LOSS, code)

    def set_rate(self, host: int, plane: int, rate, peer: int | None = None, both_ends: bool = True) -> None:
        bits = parse_rate(rate)
        self._tc(host, self._qdisc_cmd(f"p{plane}", bits).split())
        if both_ends:
            _run(["tc", "-n", self.leaf_ns(plane, self.leaf_of(host)),
                  *self._qdisc_cmd(f"h{host}", bits).split()])

    def device_status(self, i: int, j: int, p: int) -> dict:
        return device_status(self.ns(i), f"p{p}")

    def status(self) -> dict:
        lay = self.layout()
        lay["up"] = self.is_up()
        if lay["up"]:
            for h in lay["host_info"]:
                for d in h["devices"]:
                    d["live"] = self.device_status(h["host"], -1, d["plane"])
            for link in lay["links"]:
                link["live"] = self.link_status(link["plane"], link["leaf"], link["spine"])
        return lay

    # ---- cross traffic -------------------------------------------------

    def cross_traffic(self, p: int, leaf: int, spine: int, rate, seconds: float,
                      direction: str = "up", port: int = 5301, ecn: bool = False) -> "CrossTraffic":
        """A bounded UDP stream at `rate` (of payload) through one fabric link
        in one direction ("up": leaf -> spine); ECN-capable (ECT(0)) with
        `ecn`. The sender is mrcctl/lab/udpgen.py (GSO sends, so that it keeps
        its rate beside a busy transfer); the far end counts and drops the
        stream in its prerouting hook. Returns the running stream; it ends by
        itself after `seconds` (and is ended by down())."""
        if direction not in ("up", "down"):
            raise TestbedError("cross traffic runs in one direction: up or down")
        if not 0 < float(seconds) <= 600:
            raise TestbedError("seconds must be in (0, 600]")
        bits = parse_rate(rate)
        if not bits:
            raise TestbedError("cross traffic needs a rate")
        src, dst = ((self.leaf_ns(p, leaf), self.spine_ns(p, spine)) if direction == "up"
                    else (self.spine_ns(p, spine), self.leaf_ns(p, leaf)))
        dst_addr = self.link_addr(p, leaf, spine, "spine" if direction == "up" else "leaf")
        table = f"mrc_cross_{port}"
        _run(["ip", "netns", "exec", dst, "nft", "-f", "-"], input=(
            f"table ip {table} {{\n chain pre {{\n  type filter hook prerouting priority -300;\n"
            f"  ip daddr {dst_addr} udp dport {port} counter drop\n }}\n}}\n"))
        client = subprocess.Popen(["ip", "netns", "exec", src, sys.executable, "-m", "mrcctl.cli.udpgen",
                                   "--to", dst_addr, "--port", str(port), "--rate", str(bits),
                                   "--seconds", str(seconds), *(["--tos", "2"] if ecn else [])],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
        self._procs.append(client)
        return CrossTraffic(client, dst, table)


class CrossTraffic:
    """A running cross stream (Fabric.cross_traffic). communicate() waits for
    it like Popen's and returns (JSON text, stderr): what the sender sent
    (packets, bytes, seconds, bits_per_second of payload) and what reached
    the link's far end (received_packets, lost_packets, lost_percent)."""

    def __init__(self, proc: subprocess.Popen, ns: str, table: str):
        self.proc, self.ns, self.table = proc, ns, table
        self.returncode: int | None = None

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        self.returncode = self.proc.returncode
        skbs, size = self._counted()
        if self.returncode != 0:
            return out, err
        sent = json.loads(out)
        # A GSO buffer may cross an unshaped link whole: one skb with one
        # IPv4 + UDP header over many datagrams' payload.
        got = (size - 28 * skbs) // (sent["bytes"] // sent["packets"]) if sent["packets"] else 0
        lost = max(0, sent["packets"] - got)
        sent.update(received_packets=got, lost_packets=lost,
                    lost_percent=round(100 * lost / sent["packets"], 3) if sent["packets"] else 0.0)
        return json.dumps(sent), err

    def _counted(self) -> tuple[int, int]:
        """(skbs, bytes) the far end's rule counted; removes the rule."""
        r = _run(["ip", "netns", "exec", self.ns, "nft", "-j", "list", "table", "ip", self.table], check=False)
        _run(["ip", "netns", "exec", self.ns, "nft", "delete", "table", "ip", self.table], check=False)
        try:
            for x in json.loads(r.stdout)["nftables"]:
                for e in x.get("rule", {}).get("expr", []):
                    if "counter" in e:
                        return int(e["counter"]["packets"]), int(e["counter"]["bytes"])
        except (ValueError, KeyError):
            pass
        return 0, 0


def _attach_ecn_marker(ns: str, dev: str, rate_Bps: int, queue_bytes: int) -> int:
    """Load a fresh ecn_mark program (its own phantom queue), set its rate
    and attach it to dev's egress in namespace ns. The filter keeps the
    program and its maps alive after this process closes its handles.
    Returns the id of its ecn_state map."""
    from ..datapath.libbpf import BpfObject, LibbpfError

    if not ECN_MARK_OBJ.exists():
        raise TestbedError(f"{ECN_MARK_OBJ} is missing: build the BPF objects (make -C bpf)")
    try:
        obj = BpfObject.open(str(ECN_MARK_OBJ))
        obj.load()
        obj.map("ecn_cfg").update(b"\0" * 4, struct.pack("=QQ", rate_Bps, queue_bytes))
        prog = obj.program("ecn_mark")
        state_id = obj.map("ecn_state").id
    except LibbpfError as e:
        raise TestbedError(f"loading {ECN_MARK_OBJ.name}: {e}") from None
    try:
        attach_tc_bpf(ns, dev, prog.fd, "ecn_mark", TC_EGRESS, FAULT_PREF_ECN)
    except TestbedError as e:
        raise TestbedError(f"attaching the CE marker: {e}") from None
    finally:
        obj.close()
    return state_id


TC_INGRESS, TC_EGRESS = 0xFFFFFFF2, 0xFFFFFFF3     # clsact's parents


def attach_tc_bpf(ns: str, dev: str, fd: int, name: str, parent: int, prio: int) -> None:
    """A loaded BPF program as a direct-action filter on dev's clsact
    ingress or egress (`parent`) in namespace ns, at `prio`; the filter
    keeps the program alive after its loader closes it."""
    from pyroute2 import NetNS
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        with NetNS(ns) as ipr:
            idx = ipr.link_lookup(ifname=dev)[0]
            try:
                ipr.tc("add", "clsact", idx)
            except NetlinkError:
                pass                                # already there
            ipr.tc("replace-filter", "bpf", idx, handle=1, fd=fd, name=name,
                   parent=parent, prio=prio, classid=1, direct_action=True)
    except (NetlinkError, IndexError) as e:
        raise TestbedError(f"{name} on {dev} in {ns}: {e}") from None


def attach(prefix: str) -> Testbed:
    """The Testbed or Fabric that is up under `prefix`."""
    try:
        with open(tbmod.state_path(prefix)) as f:
            st = json.load(f)
    except FileNotFoundError:
        return Testbed.attach(prefix)
    if st.get("kind") == "leaf-spine":
        return Fabric.from_state(st)
    return Testbed.attach(prefix)
