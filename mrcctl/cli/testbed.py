"""`scripts/testbed.py`: the command line of the namespace testbed
(mrcctl/lab/testbed.py). A separate program from `mrcctl`: it builds
throwaway hosts, it does not run mrc."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click

from ..lab.fabric import DIRECTIONS, Fabric, attach
from ..lab.testbed import DEFAULT_PREFIX, Testbed, TestbedError, cleanup

PROG = "testbed.py"


def _print_layout(lay: dict) -> None:
    if lay.get("kind") == "leaf-spine":
        return _print_fabric(lay)
    fam = "IPv4+IPv6" if lay["ipv6"] else "IPv4"
    print(f"testbed {lay['prefix']}: {lay['hosts']} hosts x {lay['planes']} planes, {fam}, mtu {lay['mtu']}"
          + ("" if lay.get("up", True) else "  [NOT UP]"))
    for h in lay["host_info"]:
        print(f"host {h['host']}  netns {h['ns']}  (overlay {h['overlay_addr']} by convention)")
        for d in h["devices"]:
            addrs = f"{d['addr4']}/24"
            if "addr6" in d:
                addrs += f" {d['addr6']}/64"
            extra = ""
            if "live" in d:
                lv = d["live"]
                extra = f"  {lv['state']:<7} {lv['qdisc']:<16}"
                if lv["faults"]:
                    extra += " FAULT: " + ", ".join(lv["faults"])
            else:
                extra = f"  rate {d['rate']}"
            print(f"  {d['dev']:<7} -> h{d['peer']}:{d['peer_dev']:<7} {d['mac']}  {addrs:<36}{extra}")


def _print_fabric(lay: dict) -> None:
    fam = "IPv4+IPv6" if lay["ipv6"] else "IPv4"
    print(f"fabric {lay['prefix']}: {lay['hosts']} hosts x {lay['planes']} leaf-spine planes "
          f"({lay['leaves']} leaves, {lay['spines']} spines each), {fam}, mtu {lay['mtu']}, "
          f"links {lay['link_rate']}, host ports {lay['host_rate']}" + ("" if lay.get("up", True) else "  [NOT UP]"))
    for h in lay["host_info"]:
        print(f"host {h['host']}  netns {h['ns']}  leaf {h['leaf']}  (overlay {h['overlay_addr']} by convention)")
        for d in h["devices"]:
            addrs = f"{d['addr4']}/24" + (f" {d['addr6']}/64" if "addr6" in d else "")
            extra = ""
            if "live" in d:
                lv = d["live"]
                extra = f"  {lv['state']:<7} {lv['qdisc']:<16}" + (" FAULT: " + ", ".join(lv["faults"]) if lv["faults"] else "")
            print(f"  {d['dev']:<4} {addrs:<36} via {d['gateway4']}{extra}")
    for link in lay["links"]:
        line = f"link plane {link['plane']} leaf {link['leaf']} <-> spine {link['spine']}  " \
               f"{link['leaf_ns']}:{link['leaf_dev']} {link['leaf_addr4']} - {link['spine_ns']}:{link['spine_dev']} " \
               f"{link['spine_addr4']}"
        if "live" in link:
            for end in ("up", "down"):
                lv = link["live"][end]
                if lv["faults"] or lv["state"] != "UP":
                    line += f"  {end}: {lv['state']} {' '.join(lv['faults'])}".rstrip()
        print(line)


def _common(fn):
    fn = click.option("--json", "as_json", is_flag=True, help="print JSON")(fn)
    return click.option("--prefix", default=DEFAULT_PREFIX, show_default=True, help="namespace prefix")(fn)


def _target(fn):
    fn = click.option("--peer", type=int, default=None, help="only the device toward this host")(fn)
    fn = click.option("--plane", type=int, required=True, help="plane index (0-based)")(fn)
    return click.option("--host", type=int, required=True, help="host index (0-based)")(fn)


def _run(fn, *args) -> None:
    """Root first, then one line for any failure of the bed itself (exit 1)."""
    if os.geteuid() != 0:
        click.echo(f"{PROG}: must run as root", err=True)
        sys.exit(1)
    try:
        code = fn(*args)
    except (TestbedError, subprocess.CalledProcessError) as e:
        click.echo(f"{PROG}: {e}", err=True)
        sys.exit(1)
    sys.exit(code or 0)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def testbed():
    """mrc namespace test bed: N hosts in network namespaces joined by veth
    planes (see mrcctl/lab/testbed.py)."""


@testbed.command()
@_common
@click.option("--hosts", type=int, default=2, show_default=True)
@click.option("--planes", type=int, default=4, show_default=True)
@click.option("--rate", default=None, help="tbf rate for every plane, e.g. 1gbit")
@click.option("--rates", default=None, help="comma-separated per-plane rates ('none' = unshaped)")
@click.option("--ipv6", is_flag=True, help="also add IPv6 underlay addresses")
@click.option("--mtu", type=int, default=1500, show_default=True)
@click.option("--fabric", type=click.Choice(["direct", "leaf-spine"]), default="direct", show_default=True,
              help="direct: a veth per host pair and plane; leaf-spine: every plane a routed fabric")
@click.option("--spines", type=int, default=2, show_default=True, help="leaf-spine: spines per plane")
@click.option("--leaves", type=int, default=2, show_default=True, help="leaf-spine: leaves per plane")
@click.option("--link-rate", default=None, help="leaf-spine: tbf rate of every leaf-spine link")
def up(prefix, as_json, hosts, planes, rate, rates, ipv6, mtu, fabric, spines, leaves, link_rate):
    """Build the test bed (--fabric leaf-spine: routed planes; --rate then
    shapes the host ports)."""
    if rate is not None and rates is not None:
        raise click.UsageError("--rate and --rates are mutually exclusive")
    if fabric == "leaf-spine" and rates is not None:
        raise click.UsageError("--rates is for direct planes; a fabric takes --rate and --link-rate")
    if fabric == "direct" and link_rate is not None:
        raise click.UsageError("--link-rate needs --fabric leaf-spine")

    def go():
        if fabric == "leaf-spine":
            tb = Fabric(hosts, planes, spines, leaves, link_rate, rate, ipv6, prefix, mtu).up()
        else:
            tb = Testbed(hosts, planes, rates.split(",") if rates else rate, ipv6, prefix, mtu).up()
        lay = tb.layout()
        if as_json:
            print(json.dumps(lay, indent=2))
        else:
            _print_layout(lay)
    _run(go)


@testbed.command()
@_common
def down(prefix, as_json):
    """Remove the test bed."""
    def go():
        removed = cleanup(prefix)
        if as_json:
            print(json.dumps({"removed": removed}))
        else:
            print(f"removed {len(removed)} namespace(s)" + (": " + " ".join(removed) if removed else ""))
    _run(go)


@testbed.command()
@_common
def status(prefix, as_json):
    """Show layout and live state."""
    def go():
        st = attach(prefix).status()
        if as_json:
            print(json.dumps(st, indent=2))
        else:
            _print_layout(st)
    _run(go)


@testbed.command()
@_common
@_target
@click.option("--off", is_flag=True, help="restore")
@click.option("--both", is_flag=True, help="both directions")
def blackhole(prefix, as_json, host, plane, peer, off, both):
    """Drop all egress of a host on a plane."""
    _run(lambda: attach(prefix).blackhole(host, plane, not off, peer, both))


@testbed.command()
@_common
@_target
@click.option("--percent", type=float, required=True)
@click.option("--both", is_flag=True, help="both directions")
def loss(prefix, as_json, host, plane, peer, percent, both):
    """Random egress loss of a host on a plane."""
    _run(lambda: attach(prefix).loss(host, plane, percent, peer, both))


@testbed.command()
@_common
@_target
@click.argument("state", type=click.Choice(["up", "down"]))
def carrier(prefix, as_json, host, plane, peer, state):
    """Set a host's plane device down/up."""
    _run(lambda: attach(prefix).carrier(host, plane, state == "up", peer))


@testbed.command()
@_common
@_target
@click.argument("rate")
@click.option("--one-end", is_flag=True, help="only the host's end")
def rate(prefix, as_json, host, plane, peer, rate, one_end):
    """Change a plane's rate (tbf), 'none' for pfifo."""
    _run(lambda: attach(prefix).set_rate(host, plane, rate, peer, not one_end))


@testbed.command()
@_common
def clear(prefix, as_json):
    """Remove all faults."""
    _run(lambda: attach(prefix).clear_faults())


@testbed.command("exec", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--prefix", default=DEFAULT_PREFIX, show_default=True, help="namespace prefix")
@click.argument("host", type=int)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def exec_(prefix, host, command):
    """Run a command inside host N: exec N -- CMD..."""
    def go():
        cmd = list(command[1:] if command[:1] == ("--",) else command)
        if not cmd:
            click.echo("exec: no command", err=True)
            return 2
        return subprocess.call(attach(prefix).ns_cmd(host, cmd))
    _run(go)


def _link(fn):
    fn = click.option("--spine", type=int, required=True, help="spine index (0-based)")(fn)
    fn = click.option("--leaf", type=int, required=True, help="leaf index (0-based)")(fn)
    return click.option("--plane", type=int, required=True, help="plane index (0-based)")(fn)


def _fabric(prefix: str) -> Fabric:
    tb = attach(prefix)
    if not isinstance(tb, Fabric):
        raise TestbedError(f"testbed {prefix!r} has direct planes; fabric links need 'up --fabric leaf-spine'")
    return tb


_direction = click.option("--direction", type=click.Choice(DIRECTIONS), default="both", show_default=True,
                          help="up: leaf -> spine, down: spine -> leaf")


@testbed.group()
def link():
    """Faults on one leaf-spine link (a gray failure keeps the carrier up)."""


@link.command("blackhole")
@_common
@_link
@_direction
@click.option("--off", is_flag=True, help="restore")
def link_blackhole(prefix, as_json, plane, leaf, spine, direction, off):
    """Drop everything on the link in one direction or both."""
    _run(lambda: _fabric(prefix).link_blackhole(plane, leaf, spine, not off, direction))


@link.command("loss")
@_common
@_link
@_direction
@click.option("--percent", type=float, required=True)
def link_loss(prefix, as_json, plane, leaf, spine, direction, percent):
    """Random loss on the link (0 removes it)."""
    _run(lambda: _fabric(prefix).link_loss(plane, leaf, spine, percent, direction))


@link.command("rate")
@_common
@_link
@_direction
@click.argument("rate")
def link_rate_cmd(prefix, as_json, plane, leaf, spine, direction, rate):
    """Shape the link (tbf), 'none' for pfifo."""
    _run(lambda: _fabric(prefix).set_link_rate(plane, leaf, spine, rate, direction))


@link.command("ecn")
@_common
@_link
@_direction
@click.option("--rate", default=None, metavar="RATE",
              help="mark only while the link carries more than RATE (e.g. 450mbit: a phantom queue "
                   "draining at RATE); default: mark every ECN-capable packet")
@click.option("--queue", "queue_bytes", type=int, default=30000, show_default=True,
              help="with --rate: bytes of phantom backlog above which packets are marked")
@click.option("--off", is_flag=True, help="restore")
def link_ecn(prefix, as_json, plane, leaf, spine, direction, rate, queue_bytes, off):
    """Mark CE on ECN-capable packets the link carries (a congested, marking queue)."""
    _run(lambda: _fabric(prefix).link_ecn_mark(plane, leaf, spine, not off, direction, rate=rate,
                                               queue_bytes=queue_bytes))


@link.command("carrier")
@_common
@_link
@click.argument("state", type=click.Choice(["up", "down"]))
def link_carrier(prefix, as_json, plane, leaf, spine, state):
    """Take the link down or up (both routers see it)."""
    _run(lambda: _fabric(prefix).link_carrier(plane, leaf, spine, state == "up"))


@link.command("mtu")
@_common
@_link
@click.argument("mtu")
def link_mtu(prefix, as_json, plane, leaf, spine, mtu):
    """Set the link's MTU on both ends ('default': the fabric's)."""
    _run(lambda: _fabric(prefix).link_mtu(plane, leaf, spine, None if mtu == "default" else int(mtu)))


@testbed.command()
@_common
@_link
@click.option("--direction", type=click.Choice(["up", "down"]), default="up", show_default=True)
@click.option("--rate", "xrate", required=True, help="e.g. 300mbit")
@click.option("--seconds", type=float, default=10, show_default=True, help="at most 600")
def cross(prefix, as_json, plane, leaf, spine, direction, xrate, seconds):
    """Bounded UDP cross traffic through one fabric link; waits for it to end."""
    def go():
        proc = _fabric(prefix).cross_traffic(plane, leaf, spine, xrate, seconds, direction)
        out, err = proc.communicate(timeout=seconds + 30)
        if proc.returncode != 0:
            raise TestbedError(f"the cross stream failed: {(out + err).strip()[-500:]}")
        sent = json.loads(out)
        if as_json:
            print(json.dumps(sent))
        else:
            print(f"sent {sent['bytes']} bytes in {sent['seconds']:.1f} s ({sent['bits_per_second'] / 1e6:.0f} Mbit/s), "
                  f"{sent['lost_percent']:.1f} % lost on the way")
    _run(go)


@testbed.command()
@_common
@click.option("--plane", type=int, required=True)
@click.option("--src", type=int, required=True, help="sending host")
@click.option("--dst", type=int, required=True, help="receiving host")
@click.option("--evs", default="49152-49167", show_default=True, help="EV range FIRST-LAST (outer UDP source ports)")
@click.option("--port", type=int, default=4794, show_default=True, help="outer UDP destination port")
def evs(prefix, as_json, plane, src, dst, evs, port):
    """Which spine each EV from src to dst crosses, as the leaf's FIB says."""
    def go():
        try:
            first, _, last = evs.partition("-")
            rng = range(int(first), int(last or first) + 1)
        except ValueError:
            raise TestbedError(f"--evs {evs!r}: give FIRST-LAST, e.g. 49152-49159") from None
        m = _fabric(prefix).ev_spines(plane, src, dst, rng, port)
        if as_json:
            print(json.dumps({str(k): v for k, v in m.items()}))
        else:
            for ev, s in m.items():
                print(f"ev {ev}: " + ("same leaf, no spine" if s is None else f"spine {s}"))
    _run(go)


def main(argv: list[str] | None = None) -> None:
    testbed.main(args=argv, prog_name=PROG)
