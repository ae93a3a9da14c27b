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
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
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
