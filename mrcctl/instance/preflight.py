"""Everything `up` can check before it changes anything."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ..errors import InputError
from . import config as cfgmod
from . import topology
from .state import Instance


@dataclass
class PlaneRuntime:
    plane: cfgmod.Plane
    ifindex: int
    mac: bytes
    mtu: int
    local: dict[int, ipaddress.IPv4Address | ipaddress.IPv6Address]   # family -> address
    subnets: list


def preflight(cfg: cfgmod.Config, nl: topology.Netlink) -> tuple[list[PlaneRuntime], int]:
    """Everything that can be checked before changing anything."""
    planes = []
    for pl in cfg.planes:
        link = nl.link(pl.device)
        if link is None:
            raise InputError(f"plane {pl.device}: no such interface in this network namespace")
        addrs = nl.addresses(pl.device)
        local = {}
        for fam in (4, 6):
            if pl.address is not None:
                if pl.address.version == fam:
                    local[fam] = pl.address
                continue
            for a in addrs:
                if a.version == fam:
                    local[fam] = a.ip
                    break
        for peer in cfg.peers:
            remote = peer.underlay.get(pl.device)
            if remote is not None and remote.version not in local:
                raise InputError(f"plane {pl.device}: has no IPv{remote.version} address for peer "
                                 f"{peer.name} ({remote}); add one or set plane.address")
        for a in addrs:
            for ov in cfg.overlay_addresses:
                if a.version == ov.version and a.network.overlaps(ov.network):
                    raise InputError(f"overlay.address: {ov} overlaps the subnet {a.network} "
                                     f"of plane {pl.device}")
        planes.append(PlaneRuntime(pl, link["index"], nl.mac(pl.device), link.get("mtu"), local,
                                   [a.network for a in addrs]))
    # Key files are checked now (permissions, format), so a bad one stops
    # `up` before it changes anything; fill_maps reads them again.
    for peer in cfg.peers:
        if cfg.key_file_of(peer):
            try:
                cfgmod.read_key(f"peer[{peer.index}].key_file" if peer.key_file else "security.key_file",
                                cfg.key_file_of(peer))
            except cfgmod.ConfigError as e:
                raise InputError(str(e)) from None
    need = cfg.overhead()
    smallest = min(p.mtu for p in planes)
    mtu = cfg.mtu if cfg.mtu is not None else smallest - need
    if mtu + need > smallest:
        raise InputError(f"overlay.mtu: {mtu} + {need} bytes of encapsulation exceeds the smallest "
                         f"plane MTU {smallest}")
    # IPv6 needs 1280-byte links (RFC 8200); the overhead does not depend on
    # the inner family (inner headers are inside the overlay MTU)
    least = 1280 if 6 in cfg.overlay_families() else 576
    if mtu < least:
        raise InputError(f"overlay.mtu: plane MTU {smallest} leaves only {mtu} bytes for the overlay "
                         f"(at least {least} needed{' for an IPv6 overlay' if least == 1280 else ''})")
    dev = nl.link(cfg.overlay_device)
    if dev is not None and not Instance(cfg.overlay_device).exists():
        raise InputError(f"overlay.device: {cfg.overlay_device} already exists and is not managed by mrc")
    return planes, mtu

