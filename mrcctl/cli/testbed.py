"""`scripts/testbed.py`: the command line of the namespace testbed
(mrcctl/lab/testbed.py). A separate program from `mrcctl`: it builds
throwaway hosts, it does not run mrc."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click

from ..lab.testbed import DEFAULT_PREFIX, Testbed, TestbedError, cleanup

PROG = "testbed.py"


def _print_layout(lay: dict) -> None:
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
def up(prefix, as_json, hosts, planes, rate, rates, ipv6, mtu):
    """Build the test bed."""
    if rate is not None and rates is not None:
        raise click.UsageError("--rate and --rates are mutually exclusive")

    def go():
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
        st = Testbed.attach(prefix).status()
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
    _run(lambda: Testbed.attach(prefix).blackhole(host, plane, not off, peer, both))


@testbed.command()
@_common
@_target
@click.option("--percent", type=float, required=True)
@click.option("--both", is_flag=True, help="both directions")
def loss(prefix, as_json, host, plane, peer, percent, both):
    """Random egress loss of a host on a plane."""
    _run(lambda: Testbed.attach(prefix).loss(host, plane, percent, peer, both))


@testbed.command()
@_common
@_target
@click.argument("state", type=click.Choice(["up", "down"]))
def carrier(prefix, as_json, host, plane, peer, state):
    """Set a host's plane device down/up."""
    _run(lambda: Testbed.attach(prefix).carrier(host, plane, state == "up", peer))


@testbed.command()
@_common
@_target
@click.argument("rate")
@click.option("--one-end", is_flag=True, help="only the host's end")
def rate(prefix, as_json, host, plane, peer, rate, one_end):
    """Change a plane's rate (tbf), 'none' for pfifo."""
    _run(lambda: Testbed.attach(prefix).set_rate(host, plane, rate, peer, not one_end))


@testbed.command()
@_common
def clear(prefix, as_json):
    """Remove all faults."""
    _run(lambda: Testbed.attach(prefix).clear_faults())


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
        return subprocess.call(Testbed.attach(prefix).ns_cmd(host, cmd))
    _run(go)


def main(argv: list[str] | None = None) -> None:
    testbed.main(args=argv, prog_name=PROG)
