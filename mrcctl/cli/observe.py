"""mrcctl status, top, exporter, events: reading a running instance."""

from __future__ import annotations

import json
import sys

import click

from ..errors import MrcError
from .common import CONFIG_OPT, load_config, need_privileges


@click.command()
@CONFIG_OPT
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object (schema: docs/status.schema.json).")
@click.option("--peer", "peers", multiple=True, metavar="NAME",
              help="Only this peer (repeatable); the others' maps are not read.")
@click.option("--view", type=click.Choice(["auto", "paths", "planes", "peers"]), default="auto", show_default=True,
              help="Text output: a row per path, per plane of each peer, or per peer (auto: by how many paths "
                   "there are).")
def status(config_path, as_json, peers, view):
    """Per-peer, per-path state and counters; peers in trouble first."""
    cfg = load_config(config_path)
    need_privileges(net=False)
    from ..observe import snapshot
    snap = snapshot.snapshot(cfg, peers=set(peers) if peers else None)
    if as_json:
        # indented for a person at a terminal; compact for a program, which
        # also keeps json's C encoder (an indent falls back to the Python
        # one: seconds for thousands of peers)
        click.echo(json.dumps(snap, indent=2 if sys.stdout.isatty() else None))
    else:
        from ..observe.render import print_status
        print_status(snap, view=view)


@click.command()
@CONFIG_OPT
@click.option("--interval", type=click.FloatRange(0.1, 10), default=0.25, show_default=True, metavar="SECONDS",
              help="Time between refreshes (longer while a refresh costs more than a quarter of it).")
@click.option("--once", is_flag=True, help="Print one frame and exit (also when stdout is not a terminal).")
@click.option("--fold", is_flag=True, help="Start with one row per plane (key f toggles).")
def top(config_path, interval, once, fold):
    """Live dashboard: per-path state, rates, share, RTT, loss, reorder, events.

    Keys: q quit, f fold EVs into one row per plane.
    """
    cfg = load_config(config_path)
    need_privileges(net=False)
    from ..observe import top as topmod
    sys.exit(topmod.run(cfg, interval=interval, once=once, folded=fold))


@click.command()
@CONFIG_OPT
@click.option("--listen", metavar="HOST:PORT", default=None,
              help="Address to serve /metrics on (default: [metrics] listen, else 127.0.0.1:9477).")
@click.option("--per-path/--aggregates-only", default=None,
              help="Also serve one series per path (default: [metrics] per_path, else off).")
def exporter(config_path, listen, per_path):
    """Serve Prometheus metrics of the instance in the foreground.

    Per-peer and per-plane aggregates always; per-path series on request."""
    cfg = load_config(config_path)
    need_privileges(net=False)
    from ..observe import exporter as exp
    exp.run(cfg, listen, per_path)


@click.command()
@CONFIG_OPT
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events until interrupted.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def events(config_path, follow, as_json):
    """EV events: every path state change (datapath, agent, operator) with
    time, peer, path (id, plane, EV), old -> new state and reason."""
    import time as _time
    cfg = load_config(config_path)
    from ..instance.events import format_event, read_events
    from ..instance.state import Instance
    inst = Instance(cfg.overlay_device)
    if not inst.exists():
        raise MrcError(f"{cfg.overlay_device}: not up in this network namespace; run `mrcctl up` first")

    def show(e):
        click.echo(json.dumps(e, sort_keys=True) if as_json else format_event(e))

    seen = read_events(inst)
    for e in seen:
        show(e)
    if not follow:
        return
    n = len(seen)
    while True:   # ends with Ctrl-C / SIGPIPE
        _time.sleep(0.2)
        cur = read_events(inst)
        if len(cur) < n:   # rotated: the old file now holds what we showed
            n = 0
        for e in cur[n:]:
            show(e)
        n = len(cur)
