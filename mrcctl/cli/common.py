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


def load_config(path: str) -> cfgmod.Config:
    try:
        return cfgmod.load(path)
    except cfgmod.ConfigError as e:
        raise InputError(f"{path}: {e}") from None
