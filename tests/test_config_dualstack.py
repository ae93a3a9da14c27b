"""Dual-stack overlay and prefixes behind peers (issue #14.3) in the config
and in what `up` writes from it, without root: the keys' forms (the old
single-string form still works), what each owner owns, the contents of the
two LPM maps (mrc_peer_ip, mrc_ovl_owner) as packed keys, and a peer's
identity across `up`. Refused forms: tests/test_config_errors.py."""

from __future__ import annotations

import ipaddress

from mrcctl.datapath import abi as wire
from mrcctl.instance import config
from mrcctl.instance.fill import owner_entries, peer_entries, peer_identity

DUAL = """
[overlay]
address = ["172.31.0.1/24", "fd31::1/64"]
prefixes = ["10.244.1.0/24", "fd00:1::/64"]
[[plane]]
device = "p0h1"
[[peer]]
name = "h1"
overlay = ["172.31.0.2", "fd31::2"]
prefixes = ["10.244.2.0/24", "fd00:2::/64"]
[peer.underlay]
p0h1 = "10.200.0.2"
[[peer]]
name = "h2"
overlay = "fd31::3"
[peer.underlay]
p0h1 = "10.200.0.3"
"""


def net(s: str):
    return ipaddress.ip_network(s)


def test_dual_stack_keys():
    cfg = config.parse(DUAL)
    assert [str(a) for a in cfg.overlay_addresses] == ["172.31.0.1/24", "fd31::1/64"]
    assert str(cfg.overlay_address) == "172.31.0.1/24" and cfg.overlay_families() == {4, 6}
    h1, h2 = cfg.peers
    assert [str(a) for a in h1.overlays] == ["172.31.0.2", "fd31::2"] and str(h1.overlay) == "172.31.0.2"
    assert h1.owned() == [net("172.31.0.2/32"), net("fd31::2/128"), net("10.244.2.0/24"), net("fd00:2::/64")]
    assert h2.owned() == [net("fd31::3/128")] and h2.prefixes == ()
    assert cfg.local_owned() == [net("172.31.0.1/32"), net("fd31::1/128"), net("10.244.1.0/24"),
                                 net("fd00:1::/64")]


def test_single_string_form_unchanged():
    cfg = config.parse(DUAL.replace('["172.31.0.1/24", "fd31::1/64"]', '"172.31.0.1/24"')
                       .replace('prefixes = ["10.244.1.0/24", "fd00:1::/64"]\n', "")
                       .replace('["172.31.0.2", "fd31::2"]', '"172.31.0.2"')
                       .replace('prefixes = ["10.244.2.0/24", "fd00:2::/64"]\n', "")
                       .replace('overlay = "fd31::3"', 'overlay = "172.31.0.3"'))
    assert [str(a) for a in cfg.overlay_addresses] == ["172.31.0.1/24"] and cfg.overlay_prefixes == ()
    assert [p.owned() for p in cfg.peers] == [[net("172.31.0.2/32")], [net("172.31.0.3/32")]]


def test_lpm_contents():
    """mrc_peer_ip: every peer's addresses and prefixes -> the peer; the
    owner map: the same plus ours and overlay.prefixes -> this host. Keys are
    family-tagged (prefixlen counts the family word)."""
    cfg = config.parse(DUAL)
    routes = {wire.OvlKey.unpack(k).network: v for k, v in peer_entries(cfg).items()}
    assert routes == {net("172.31.0.2/32"): 0, net("fd31::2/128"): 0, net("10.244.2.0/24"): 0,
                      net("fd00:2::/64"): 0, net("fd31::3/128"): 1}
    owners = {wire.OvlKey.unpack(k).network: v for k, v in owner_entries(cfg).items()}
    local = {n: wire.MRC_OWNER_LOCAL for n in cfg.local_owned()}
    assert owners == {**routes, **local}
    k = wire.OvlKey.of("fd00:2::/64")
    assert (k.prefixlen, k.family) == (wire.MRC_OVL_FAMILY_BITS + 64, 6)
    assert wire.OvlKey.unpack(k.pack()) == k and len(k.pack()) == wire.OvlKey.size() == 24


def test_peer_identity():
    """mrc_peer.overlay, how `up` recognises a peer after reordering: its
    IPv4 overlay address, else the last 32 bits of its IPv6 one."""
    h1, h2 = config.parse(DUAL).peers
    assert peer_identity(h1) == "172.31.0.2"
    assert peer_identity(h2) == "0.0.0.3"
