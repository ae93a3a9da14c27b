"""rx_hook "auto": decided by the device's netlink link kind (topology.auto_rx_hook)."""

from __future__ import annotations

from pathlib import Path

from mrcctl.instance import config as cfgmod
from mrcctl.instance.reconcile import rx_hook_of
from mrcctl.instance.topology import Netlink


def test_auto_is_tc_on_a_veth_and_xdp_on_a_device_without_link_kind(veth):
    name = next(p.name for p in Path("/sys/class/net").iterdir()
                if (p / "ifindex").read_text().strip() == str(veth))
    with Netlink() as nl:
        assert nl.link_kind(name) == "veth"
        assert nl.auto_rx_hook(name) == "tc"
        # lo has no link kind, as a NIC's driver device has none
        assert nl.link_kind("lo") is None and nl.auto_rx_hook("lo") == "xdp"
        # an explicit hook wins over the device
        assert rx_hook_of(cfgmod.Plane(index=0, device=name, rx_hook="xdp"), nl) == "xdp"
        assert rx_hook_of(cfgmod.Plane(index=0, device="lo", rx_hook="tc"), nl) == "tc"
        assert rx_hook_of(cfgmod.Plane(index=0, device=name, rx_hook="auto"), nl) == "tc"
        # the default (config.RX_HOOK_DEFAULT) is auto
        assert rx_hook_of(cfgmod.Plane(index=0, device=name), nl) == "tc"
        assert rx_hook_of(cfgmod.Plane(index=0, device="lo"), nl) == "xdp"
