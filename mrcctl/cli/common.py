"""What every mrcctl command shares: the -c option, reading the config,
the privilege check, and the one-line failure."""

from __future__ import annotations

import sys

import click

from ..errors import InputError, MrcError
from ..instance import config as cfgmod
from ..privileges import missing

CONFIG_OPT = click.option("-c", "--config", "config_path", required=True,
                          type=click.Path(dir_okay=False), metavar="FILE",
                          help="mrc TOML config (see docs/operator-guide.md).")


def fail(msg: str, code: int) -> None:
    click.echo(f"mrcctl: error: {msg}", err=True)
    sys.exit(code)


def need_privileges(bpf: bool = True, net: bool = True) -> None:
    lacking = missing(need_bpf=bpf, need_net=net)
    if lacking:
        raise MrcError(f"missing capability {', '.join(lacking)} (run as root)")


def load_config(path: str, peer_files: dict | None = None, strict: bool = False,
                cache: cfgmod.LoadCache | None = None) -> cfgmod.Config:
    """The config with its peers dir, its peers at the indices the running
    instance gave them (instance/members.py). Not strict: a peer file that
    does not validate is left out (cfg.peer_errors), so that one bad file
    stops no command but `up`."""
    from ..instance import members
    try:
        return members.bind(cfgmod.load(path, peer_files, strict=strict, cache=cache))
    except cfgmod.ConfigError as e:
        raise InputError(f"{path}: {e}") from None
