"""`python -m mrcctl.cli.udpgen`: the sending end of the testbed's cross
traffic (mrcctl/lab/udpgen.py), run inside a fabric router. Its own program,
not an mrcctl command: fabric.Fabric.cross_traffic starts it by module name.
Prints one JSON line; exit 1 when the socket could not be set up."""

from __future__ import annotations

import json
import sys

import click

from ..lab.udpgen import udp_blast


@click.command()
@click.option("--to", required=True)
@click.option("--port", type=int, required=True)
@click.option("--rate", type=int, required=True, help="bit/s of UDP payload")
@click.option("--seconds", type=float, required=True)
@click.option("--tos", type=int, default=0, help="the IP TOS byte (2: ECT(0))")
def udpgen(to, port, rate, seconds, tos):
    """A paced UDP stream that sends GSO buffers."""
    try:
        out = udp_blast(to, port, rate, seconds, tos)
    except OSError as e:
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        sys.exit(1)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    udpgen.main(prog_name="python -m mrcctl.cli.udpgen")
