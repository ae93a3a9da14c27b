"""mrcctl demo: mrc on a throwaway two-host testbed."""

from __future__ import annotations

import sys

import click


@click.command()
@click.option("--duration", type=click.FloatRange(3, 3600), default=9.0, show_default=True, metavar="SECONDS",
              help="Length of the TCP stream.")
@click.option("--planes", type=click.IntRange(1, 16), default=4, show_default=True, help="Planes between the hosts.")
@click.option("--no-fault", is_flag=True, help="Do not blackhole a plane in the middle.")
@click.option("--rate", default="250mbit", show_default=True, metavar="RATE",
              help="Shaping of every plane (tc units, 'none' = unshaped).")
@click.option("--fabric", is_flag=True,
              help="Make every plane a routed leaf-spine fabric (2 spines) and fail one leaf-spine link "
                   "instead of a whole plane (a gray failure: only the EVs hashed across it are hit).")
def demo(duration, planes, no_fault, rate, fabric):
    """Build a throwaway two-host testbed, run mrc on it with a TCP stream,
    blackhole a plane (with --fabric: one spine link) at 1/3 of the run and
    restore it at 2/3, show it live, then remove everything (Ctrl-C included)."""
    from ..lab import demo as demomod
    sys.exit(demomod.run(duration=duration, planes=planes, fault=not no_fault, rate=rate, fabric=fabric))
