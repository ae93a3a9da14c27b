"""mrcctl up, down, agent: an instance's life cycle."""

from __future__ import annotations

import click

from .common import CONFIG_OPT, load_config, need_privileges


@click.command()
@CONFIG_OPT
@click.option("--no-agent", is_flag=True, help="Do not start the background agent (probes, link events, "
              "EV events); the datapath forwards and judges liveness without it.")
def up(config_path, no_agent):
    """Validate the config, create the overlay, load and attach the datapath,
    start the agent.

    Idempotent: running it again with the same file changes nothing; with a
    changed file it applies the difference.
    """
    cfg = load_config(config_path, strict=True)
    need_privileges()
    from ..instance import reconcile
    click.echo(reconcile.up(cfg, agent=not no_agent))


@click.command()
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
    from ..instance import config as cfgmod
    cache = cfgmod.LoadCache()      # the peers watcher's first change parses only what changed
    cfg = load_config(config_path, cache=cache)
    need_privileges()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if verbose:   # ours only: pyroute2's debug output drowns everything
        logging.getLogger("mrc").setLevel(logging.DEBUG)
    from ..agent import loop
    loop.build(cfg, cache).run(duration)


@click.command()
@CONFIG_OPT
def down(config_path):
    """Remove everything `up` created (works on half-configured instances too)."""
    cfg = load_config(config_path)
    need_privileges()
    from ..instance import reconcile
    click.echo(reconcile.down(cfg))
