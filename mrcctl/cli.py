"""mrcctl: the command line.

Every failure is one line on stderr: exit 2 for bad input (config, arguments),
1 when the system refused something.
"""

from __future__ import annotations

import json
import os
import sys

import click

from . import __version__
from . import config as cfgmod
from .errors import InputError, MrcError
from .privileges import missing

CONFIG_OPT = click.option("-c", "--config", "config_path", required=True,
                          type=click.Path(dir_okay=False), metavar="FILE",
                          help="mrc TOML config (see docs/operator-guide.md).")


def _fail(msg: str, code: int) -> None:
    click.echo(f"mrcctl: error: {msg}", err=True)
    sys.exit(code)


def need_privileges(bpf: bool = True, net: bool = True) -> None:
    lacking = missing(need_bpf=bpf, need_net=net)
    if lacking:
        raise MrcError(f"missing capability {', '.join(lacking)} (run as root)")


def load_config(path: str) -> cfgmod.Config:
    try:
        return cfgmod.load(path)
    except cfgmod.ConfigError as e:
        raise InputError(f"{path}: {e}") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mrcctl")
def cli():
    """mrc: spray every packet of unmodified applications over many paths
    (planes x EVs) with eBPF, and retire bad paths in the kernel.

    \b
    Typical use:
      mrcctl up -c /etc/mrc/mrc.toml       bring the overlay up
      mrcctl status -c /etc/mrc/mrc.toml   per-path state and counters
      mrcctl down -c /etc/mrc/mrc.toml     remove everything up created
    """


@cli.command()
@CONFIG_OPT
@click.option("--no-agent", is_flag=True, help="Do not start the background agent (probes, link events, "
              "EV events); the datapath forwards and judges liveness without it.")
def up(config_path, no_agent):
    """Validate the config, create the overlay, load and attach the datapath,
    start the agent.

    Idempotent: running it again with the same file changes nothing; with a
    changed file it applies the difference.
    """
    cfg = load_config(config_path)
    need_privileges()
    from . import loader
    click.echo(loader.up(cfg, agent=not no_agent))


@cli.command()
@CONFIG_OPT
@click.option("--duration", type=float, default=None, metavar="SECONDS",
              help="Exit after this long (default: run until SIGTERM).")
@click.option("-v", "--verbose", is_flag=True, help="Log every task error with its traceback.")
def agent(config_path, duration, verbose):
    """Run the instance's agent in the foreground (for systemd: Type=simple).

    `up` starts one in the background unless --no-agent; this command is for
    supervisors that want to own the process.
    """
    import logging
    cfg = load_config(config_path)
    need_privileges()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if verbose:   # ours only: pyroute2's debug output drowns everything
        logging.getLogger("mrc").setLevel(logging.DEBUG)
    from . import agent as agentmod
    agentmod.build(cfg).run(duration)


@cli.command()
@CONFIG_OPT
def down(config_path):
    """Remove everything `up` created (works on half-configured instances too)."""
    cfg = load_config(config_path)
    need_privileges()
    from . import loader
    click.echo(loader.down(cfg))


@cli.command()
@CONFIG_OPT
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object (schema: docs/status.schema.json).")
def status(config_path, as_json):
    """Per-peer, per-path state and counters."""
    cfg = load_config(config_path)
    need_privileges(net=False)
    from . import stats
    snap = stats.snapshot(cfg)
    if as_json:
        click.echo(json.dumps(snap, indent=2))
    else:
        from .render import print_status
        print_status(snap)


@cli.command()
@CONFIG_OPT
@click.option("--interval", type=click.FloatRange(0.1, 10), default=0.25, show_default=True, metavar="SECONDS",
              help="Time between refreshes.")
@click.option("--once", is_flag=True, help="Print one frame and exit (also when stdout is not a terminal).")
@click.option("--fold", is_flag=True, help="Start with one row per plane (key f toggles).")
def top(config_path, interval, once, fold):
    """Live dashboard: per-path state, rates, share, RTT, loss, reorder, events.

    Keys: q quit, f fold EVs into one row per plane.
    """
    cfg = load_config(config_path)
    need_privileges(net=False)
    from . import top as topmod
    sys.exit(topmod.run(cfg, interval=interval, once=once, folded=fold))


@cli.command()
@CONFIG_OPT
@click.option("--listen", metavar="HOST:PORT", default=None,
              help="Address to serve /metrics on (default: [metrics] listen, else 127.0.0.1:9477).")
def exporter(config_path, listen):
    """Serve Prometheus metrics of the instance in the foreground."""
    cfg = load_config(config_path)
    need_privileges(net=False)
    from . import exporter as exp
    exp.run(cfg, listen)


@cli.command()
@click.option("--duration", type=click.FloatRange(3, 3600), default=9.0, show_default=True, metavar="SECONDS",
              help="Length of the TCP stream.")
@click.option("--planes", type=click.IntRange(1, 16), default=4, show_default=True, help="Planes between the hosts.")
@click.option("--no-fault", is_flag=True, help="Do not blackhole a plane in the middle.")
@click.option("--rate", default="250mbit", show_default=True, metavar="RATE",
              help="Shaping of every plane (tc units, 'none' = unshaped).")
def demo(duration, planes, no_fault, rate):
    """Build a throwaway two-host testbed, run mrc on it with a TCP stream,
    blackhole a plane at 1/3 of the run and restore it at 2/3, show it live,
    then remove everything (Ctrl-C included)."""
    from . import demo as demomod
    sys.exit(demomod.run(duration=duration, planes=planes, fault=not no_fault, rate=rate))


@cli.command()
@CONFIG_OPT
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events until interrupted.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def events(config_path, follow, as_json):
    """EV events: every path state change (datapath, agent, operator) with
    time, peer, path (id, plane, EV), old -> new state and reason."""
    import time as _time
    cfg = load_config(config_path)
    from . import health
    from .state import Instance
    inst = Instance(cfg.overlay_device)
    if not inst.exists():
        raise MrcError(f"{cfg.overlay_device}: not up in this network namespace; run `mrcctl up` first")

    def show(e):
        click.echo(json.dumps(e, sort_keys=True) if as_json else health.format_event(e))

    seen = health.read_events(inst)
    for e in seen:
        show(e)
    if not follow:
        return
    n = len(seen)
    while True:   # ends with Ctrl-C / SIGPIPE
        _time.sleep(0.2)
        cur = health.read_events(inst)
        if len(cur) < n:   # rotated: the old file now holds what we showed
            n = 0
        for e in cur[n:]:
            show(e)
        n = len(cur)


@cli.group()
def path():
    """Operator path control: `path deny|allow -c FILE SPEC`.

    \b
    SPEC selects paths of one peer:
      PEER/ID          path id (0..255), as in `status`
      PEER/EV          an EV (outer UDP source port, >= 1024)
      PEER/PLANE       every path on that plane device
      PEER/PLANE/EV    one path by plane and EV
      PEER/all         every path of the peer
    """


def _admin(config_path, spec, deny):
    cfg = load_config(config_path)
    need_privileges(net=False)
    from . import health
    try:
        recs = health.set_admin(cfg, spec, deny)
    except cfgmod.ConfigError as e:
        raise InputError(str(e)) from None
    if not recs:
        click.echo(f"{spec}: already {'denied' if deny else 'allowed'}")
    for r in recs:
        click.echo(health.format_event(r))


@path.command()
@CONFIG_OPT
@click.argument("spec")
def deny(config_path, spec):
    """Stop using the selected paths (state DENIED) until `path allow`."""
    _admin(config_path, spec, True)


@path.command()
@CONFIG_OPT
@click.argument("spec")
def allow(config_path, spec):
    """Return denied paths to the liveness judgement."""
    _admin(config_path, spec, False)


@cli.command()
@CONFIG_OPT
@click.argument("peer_name", metavar="PEER")
@click.argument("mode", type=click.Choice(cfgmod.SPRAY_MODES))
@click.option("--gap-us", type=click.IntRange(0, 10_000_000), default=None, metavar="MICROSECONDS",
              help="Flowlet idle gap; 0 hands it back to the agent (adaptive). Default: keep the current one.")
def spray(config_path, peer_name, mode, gap_us):
    """Switch PEER's spray mode at run time: weighted, flowlet or hash.

    Lasts until the next `up` with a changed config (which applies the
    config's peer.spray); put it in the config to make it permanent.
    """
    cfg = load_config(config_path)
    need_privileges(net=False)
    try:
        peer = cfg.peer(peer_name)
    except KeyError:
        raise InputError(f"no peer {peer_name!r} in {config_path} "
                         f"(peers: {', '.join(p.name for p in cfg.peers)})") from None
    from . import weights
    from .loader import Datapath
    from .state import Instance
    with Datapath(Instance(cfg.overlay_device)) as dp:
        ent = weights.set_spray(dp, peer, mode, gap_us)
    gap = f", flowlet gap {ent.flowlet_gap_us} us" if mode == "flowlet" and ent.flowlet_gap_us else ""
    click.echo(f"{peer.name}: spray {wire_label(ent.spray_mode)}{gap}")


def wire_label(mode: int) -> str:
    from .wire import SprayMode
    return SprayMode(mode).label


def main(argv=None) -> None:
    try:
        cli.main(args=argv, prog_name="mrcctl", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.ctx.get_help() if e.ctx else str(e))
        sys.exit(2)
    except click.UsageError as e:
        cmd = e.ctx.command_path if e.ctx else "mrcctl"
        _fail(f"{e.format_message()} (see `{cmd} --help`)", 2)
    except click.exceptions.Abort:
        _fail("aborted", 130)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except MrcError as e:
        _fail(str(e), e.exit_code)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as e:  # a bug: still one line, the traceback on request
        if os.environ.get("MRC_DEBUG"):
            raise
        _fail(f"internal error: {type(e).__name__}: {e} (set MRC_DEBUG=1 for a traceback)", 1)
    sys.exit(0)


if __name__ == "__main__":
    main()
