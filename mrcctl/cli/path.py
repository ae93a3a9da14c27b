"""mrcctl path deny|allow, spray: the operator's hand on a running instance."""

from __future__ import annotations

import click

from ..datapath.abi import SprayMode
from ..errors import InputError
from ..instance import config as cfgmod
from .common import CONFIG_OPT, load_config, need_privileges


@click.group()
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
    from ..instance import admin
    from ..instance.events import format_event
    try:
        recs = admin.set_admin(cfg, spec, deny)
    except cfgmod.ConfigError as e:
        raise InputError(str(e)) from None
    if not recs:
        click.echo(f"{spec}: already {'denied' if deny else 'allowed'}")
    for r in recs:
        click.echo(format_event(r))


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


def _either(words) -> str:
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else words[0]


# The help names the modes the ABI mirror knows, so a new mode needs no edit here.
@click.command(help=f"""Switch PEER's spray mode at run time: {_either(cfgmod.SPRAY_MODES)}.

    Lasts until the next `up` with a changed config (which applies the
    config's peer.spray); put it in the config to make it permanent.
    """)
@CONFIG_OPT
@click.argument("peer_name", metavar="PEER")
@click.argument("mode", type=click.Choice(cfgmod.SPRAY_MODES))
@click.option("--gap-us", type=click.IntRange(0, 10_000_000), default=None, metavar="MICROSECONDS",
              help="Flowlet idle gap; 0 hands it back to the agent (adaptive). Default: keep the current one.")
def spray(config_path, peer_name, mode, gap_us):
    cfg = load_config(config_path)
    need_privileges(net=False)
    try:
        peer = cfg.peer(peer_name)
    except KeyError:
        raise InputError(f"no peer {peer_name!r} in {config_path} "
                         f"(peers: {', '.join(p.name for p in cfg.peers)})") from None
    from ..datapath.maps import Datapath
    from ..instance import admin
    from ..instance.state import Instance
    with Datapath(Instance(cfg.overlay_device)) as dp:
        ent = admin.set_spray(dp, peer, mode, gap_us)
    gap = f", flowlet gap {ent.flowlet_gap_us} us" if mode == SprayMode.FLOWLET.label and ent.flowlet_gap_us else ""
    click.echo(f"{peer.name}: spray {SprayMode(ent.spray_mode).label}{gap}")
