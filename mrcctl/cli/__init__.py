"""mrcctl: the command line, the only one mrc has (scripts/testbed.py and
the demo's stream ends are click programs in this package too).

One module per command group; this one assembles the `mrcctl` group and
turns every failure into one line on stderr: exit 2 for bad input (config,
arguments), 1 when the system refused something. Command bodies import the
layers they drive lazily, so `mrcctl status` does not load pyroute2.
"""

from __future__ import annotations

import os
import sys

import click

from .. import __version__
from ..errors import MrcError
from . import demo, instance, observe, path, peer
from .common import fail


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


for _cmd in (instance.up, instance.agent, instance.down, observe.status, observe.top, observe.exporter,
             demo.demo, observe.events, path.path, path.spray, peer.peer):
    cli.add_command(_cmd)


def main(argv=None) -> None:
    try:
        cli.main(args=argv, prog_name="mrcctl", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.ctx.get_help() if e.ctx else str(e))
        sys.exit(2)
    except click.UsageError as e:
        cmd = e.ctx.command_path if e.ctx else "mrcctl"
        fail(f"{e.format_message()} (see `{cmd} --help`)", 2)
    except click.exceptions.Abort:
        fail("aborted", 130)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except MrcError as e:
        fail(str(e), e.exit_code)
    except KeyboardInterrupt:
        fail("interrupted", 130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as e:  # a bug: still one line, the traceback on request
        if os.environ.get("MRC_DEBUG"):
            raise
        fail(f"internal error: {type(e).__name__}: {e} (set MRC_DEBUG=1 for a traceback)", 1)
    sys.exit(0)
