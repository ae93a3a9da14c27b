"""Netlink work through pyroute2: the overlay device, routes, neighbours,
XDP and tc attachment, and the per-device sysctls traffic needs.

All functions act on the network namespace the process runs in.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import time
from contextlib import suppress

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

XDP_FLAGS_UPDATE_IF_NOEXIST = 1
XDP_FLAGS_DRV_MODE = 4
TC_H_CLSACT = 0xFFFFFFF1
TC_EGRESS = 0xFFFFFFF3
TC_INGRESS = 0xFFFFFFF2
TC_PRIO = 1
TC_HANDLE = 1
IFF_NOARP = 0x80


class TopologyError(RuntimeError):
    pass


def overlay_peer_name(device: str) -> str:
    """The unused far end of the overlay veth pair."""
    return device + "p"


class Netlink:
    def __init__(self):
        self.ipr = IPRoute()

    def close(self):
        self.ipr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------ links
    def index(self, name: str) -> int | None:
        found = self.ipr.link_lookup(ifname=name)
        return found[0] if found else None

    def link(self, name: str):
        idx = self.index(name)
        if idx is None:
            return None
        return self.ipr.link("get", index=idx)[0]

    def mtu(self, name: str) -> int:
        return self.link(name).get("mtu")

    def mac(self, name: str) -> bytes:
        return bytes.fromhex(self.link(name).get("address").replace(":", ""))

    def is_up(self, name: str) -> bool:
        link = self.link(name)
        return link is not None and link.get("operstate") in ("UP", "UNKNOWN")

    def addresses(self, name: str) -> list[ipaddress.IPv4Interface | ipaddress.IPv6Interface]:
        idx = self.index(name)
        out = []
        for msg in self.ipr.get_addr(index=idx):
            a = msg.get("address")
            if a is None:
                continue
            iface = ipaddress.ip_interface(f"{a}/{msg['prefixlen']}")
            if iface.version == 6 and iface.ip.is_link_local:
                continue
            out.append(iface)
        return out

    def create_overlay(self, device: str, mtu: int, address: ipaddress.IPv4Interface) -> None:
        """A veth pair whose first end carries the overlay address.

        ARP is off because the tc program owns the layer-2 header: without it
        the kernel would ARP for peers into the unused far end and never send.
        """
        peer = overlay_peer_name(device)
        if self.index(device) is None:
            self.ipr.link("add", ifname=device, kind="veth", peer={"ifname": peer})
        for name in (device, peer):
            set_sysctl(f"net/ipv6/conf/{name}/disable_ipv6", "1", missing_ok=True)
        for name in (device, peer):
            idx = self.index(name)
            self.ipr.link("set", index=idx, mtu=mtu)
            link = self.ipr.link("get", index=idx)[0]
            flags = link["flags"] | IFF_NOARP
            self.ipr.link("set", index=idx, flags=flags, change=IFF_NOARP)
        idx = self.index(device)
        if not any(a == address for a in self.addresses(device)):
            self.ipr.addr("add", index=idx, address=str(address.ip), prefixlen=address.network.prefixlen)
        for name in (peer, device):
            self.ipr.link("set", index=self.index(name), state="up")

    def delete_link(self, name: str) -> bool:
        idx = self.index(name)
        if idx is None:
            return False
        with suppress(NetlinkError):
            self.ipr.link("del", index=idx)
        return True

    # ------------------------------------------------------------ routes
    def route_replace(self, dst: str, device: str) -> None:
        self.ipr.route("replace", dst=dst, oif=self.index(device), scope="link")

    def route_delete(self, dst: str, device: str) -> None:
        idx = self.index(device)
        if idx is not None:
            with suppress(NetlinkError):
                self.ipr.route("del", dst=dst, oif=idx)

    def routes_via(self, device: str) -> list[str]:
        idx = self.index(device)
        if idx is None:
            return []
        out = []
        for r in self.ipr.get_routes(family=socket.AF_INET, oif=idx):
            dst = r.get("dst")
            if dst:
                out.append(f"{dst}/{r['dst_len']}")
        return out

    # ------------------------------------------------------------ neighbours
    def next_hop(self, device: str, addr) -> str:
        """Where frames for `addr` out of `device` go first: the route's
        gateway (a leaf switch on a routed plane), or `addr` itself when it
        is on-link. Every frame mrc builds (data, hedged copies, probes)
        carries that hop's MAC."""
        try:
            routes = self.ipr.route("get", dst=str(addr), oif=self.index(device))
        except NetlinkError:
            return str(addr)
        for r in routes:
            gw = r.get_attr("RTA_GATEWAY")
            if gw:
                return str(ipaddress.ip_address(gw))
        return str(addr)

    def neighbour_mac(self, device: str, addr) -> bytes | None:
        """MAC of the next hop toward addr on device, if the kernel knows it."""
        idx = self.index(device)
        hop = self.next_hop(device, addr)
        family = socket.AF_INET6 if ipaddress.ip_address(hop).version == 6 else socket.AF_INET
        for n in self.ipr.get_neighbours(family=family, ifindex=idx, dst=hop):
            mac = n.get("lladdr")
            # NUD_INCOMPLETE (1) and NUD_FAILED (0x20) have no usable address.
            if mac and not n["state"] & 0x21:
                return bytes.fromhex(mac.replace(":", ""))
        return None

    def neighbour_table(self) -> dict[tuple[int, str], bytes]:
        """Every usable neighbour entry: (ifindex, address) -> MAC, one dump."""
        out = {}
        for family in (socket.AF_INET, socket.AF_INET6):
            for n in self.ipr.get_neighbours(family=family):
                mac, dst = n.get("lladdr"), n.get("dst")
                if mac and dst and not n["state"] & 0x21:
                    out[(n["ifindex"], str(ipaddress.ip_address(dst)))] = \
                        bytes.fromhex(mac.replace(":", ""))
        return out

    def resolve_neighbours(self, wanted: list[tuple[str, object]], timeout: float = 1.5) -> dict:
        """Ask the kernel to resolve each (device, address), wait for the answers.

        A datagram to the discard port bound to the plane makes the kernel run
        ARP/ND; entries not resolved in time stay None and the tc program falls
        back to bpf_redirect_neigh for them.
        """
        result = {key: self.neighbour_mac(*key) for key in wanted}
        pending = [k for k, v in result.items() if v is None]
        deadline = time.monotonic() + timeout
        poke_at = 0.0
        while pending and time.monotonic() < deadline:
            if time.monotonic() >= poke_at:
                for dev, addr in pending:
                    _poke(dev, addr)
                poke_at = time.monotonic() + 0.5
            time.sleep(0.02)
            for key in pending:
                result[key] = self.neighbour_mac(*key)
            pending = [k for k, v in result.items() if v is None]
        return result

    # ------------------------------------------------------------ XDP
    def xdp_prog_id(self, device: str) -> int:
        link = self.link(device)
        if link is None:
            return 0
        xdp = link.get("xdp") or {}
        attrs = dict(xdp.get("attrs", []))
        return attrs.get("IFLA_XDP_DRV_PROG_ID") or attrs.get("IFLA_XDP_PROG_ID") or \
            attrs.get("IFLA_XDP_SKB_PROG_ID") or 0

    def attach_xdp(self, device: str, prog_fd: int) -> None:
        """Native (driver) mode only: generic XDP misses packets tc redirected."""
        try:
            self.ipr.link("set", index=self.index(device),
                          xdp={"attrs": [("IFLA_XDP_FD", prog_fd), ("IFLA_XDP_FLAGS", XDP_FLAGS_DRV_MODE)]})
        except NetlinkError as e:
            raise TopologyError(f"attaching XDP (native mode) to {device} failed: "
                                f"{os_strerror(e.code)}") from None

    def detach_xdp(self, device: str) -> None:
        idx = self.index(device)
        if idx is None:
            return
        for flags in (XDP_FLAGS_DRV_MODE, 0):
            with suppress(NetlinkError):
                self.ipr.link("set", index=idx, xdp={"attrs": [("IFLA_XDP_FD", -1), ("IFLA_XDP_FLAGS", flags)]})

    def link_kind(self, device: str) -> str | None:
        """IFLA_INFO_KIND: "veth", "bridge", "vxlan", ... for a virtual
        device, None for a NIC (a driver's device has no link kind).
        Netlink, not sysfs: right inside any network namespace."""
        link = self.link(device)
        if link is None:
            return None
        info = link.get_attr("IFLA_LINKINFO")
        return info.get_attr("IFLA_INFO_KIND") if info is not None else None

    def auto_rx_hook(self, device: str) -> str:
        """rx_hook "auto": tc ingress on a virtual device (XDP on a veth
        costs its peer TSO: docs/benchmarks/receive-hook.md), XDP on a NIC."""
        return "tc" if self.link_kind(device) else "xdp"

    # ------------------------------------------------------------ tc
    def attach_tc_egress(self, device: str, prog_fd: int, name: str) -> None:
        self._attach_tc(device, prog_fd, name, TC_EGRESS, "egress")

    def attach_tc_ingress(self, device: str, prog_fd: int, name: str) -> None:
        self._attach_tc(device, prog_fd, name, TC_INGRESS, "ingress")

    def _attach_tc(self, device: str, prog_fd: int, name: str, parent: int, where: str) -> None:
        idx = self.index(device)
        with suppress(NetlinkError):
            self.ipr.tc("add", "clsact", idx)
        try:
            self.ipr.tc("replace-filter", "bpf", idx, handle=TC_HANDLE, fd=prog_fd, name=name,
                        parent=parent, prio=TC_PRIO, classid=1, direct_action=True)
        except NetlinkError as e:
            raise TopologyError(f"attaching the tc {where} program to {device} failed: "
                                f"{os_strerror(e.code)}") from None

    def tc_egress_prog_id(self, device: str) -> int:
        """Id of the program in mrc's egress filter slot, 0 if none.

        Asked through libbpf's bpf_tc_query: pyroute2 does not decode
        TCA_BPF_ID.
        """
        return self._tc_prog_id(device, "egress")

    def tc_ingress_prog_id(self, device: str) -> int:
        """Id of the program in mrc's ingress filter slot, 0 if none."""
        return self._tc_prog_id(device, "ingress")

    def _tc_prog_id(self, device: str, where: str) -> int:
        from ..datapath.libbpf import TC_EGRESS as LB_EGRESS, TC_INGRESS as LB_INGRESS, LibbpfError, tc_query
        idx = self.index(device)
        if idx is None:
            return 0
        try:
            return tc_query(idx, where=LB_INGRESS if where == "ingress" else LB_EGRESS,
                            handle=TC_HANDLE, priority=TC_PRIO)
        except LibbpfError:
            return 0

    def detach_tc_ingress(self, device: str) -> None:
        """Only mrc's filter: a plane's clsact may carry other filters (an
        operator's, the testbed's fault filters), so it stays."""
        idx = self.index(device)
        if idx is not None:
            with suppress(NetlinkError):
                self.ipr.tc("del-filter", "bpf", idx, handle=TC_HANDLE, parent=TC_INGRESS, prio=TC_PRIO)

    def detach_tc(self, device: str) -> None:
        idx = self.index(device)
        if idx is not None:
            with suppress(NetlinkError):
                self.ipr.tc("del", "clsact", idx)


def os_strerror(code: int) -> str:
    import os
    try:
        return f"{os.strerror(code)} ({errno.errorcode.get(code, code)})"
    except (ValueError, TypeError):
        return str(code)


def _poke(device: str, addr) -> None:
    addr = ipaddress.ip_address(addr)
    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    with suppress(OSError), socket.socket(family, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, device.encode())
        s.sendto(b"", (str(addr), 9))


def sysctl_path(key: str) -> str:
    """Keys use slashes ("net/ipv4/conf/a0/rp_filter"): device names may hold dots."""
    return "/proc/sys/" + key


def get_sysctl(key: str) -> str | None:
    try:
        with open(sysctl_path(key)) as f:
            return f.read().strip()
    except OSError:
        return None


def set_sysctl(key: str, value: str, missing_ok: bool = False) -> None:
    try:
        with open(sysctl_path(key), "w") as f:
            f.write(value)
    except FileNotFoundError:
        if not missing_ok:
            raise
