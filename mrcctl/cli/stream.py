"""`python -m mrcctl.cli.stream send|recv`: the two ends of the demo's TCP
stream (mrcctl/lab/stream.py), each run inside a testbed host. Its own
program, not an mrcctl command: the demo and the tests start it by module
name. Prints one JSON line; exit 1 when the stream failed."""

from __future__ import annotations

import json
import socket
import sys

import click

from ..lab.stream import PORT, stream_recv, stream_send


def _report(role: str, fn, *args) -> None:
    try:
        out = fn(*args)
    except (OSError, socket.timeout) as e:
        print(json.dumps({"role": role, "error": f"{type(e).__name__}: {e}"}), flush=True)
        sys.exit(1)
    print(json.dumps(out), flush=True)


@click.group()
def stream():
    """A time-bounded TCP stream with sha256 at both ends."""


@stream.command()
@click.option("--to", required=True)
@click.option("--port", type=int, default=PORT)
@click.option("--seconds", type=float, default=9)
@click.option("--seed", type=int, default=1)
@click.option("--timeout", type=float, default=30)
def send(to, port, seconds, seed, timeout):
    _report("send", stream_send, to, port, seconds, seed, timeout)


@stream.command()
@click.option("--bind", default="0.0.0.0")
@click.option("--port", type=int, default=PORT)
@click.option("--timeout", type=float, default=60)
def recv(bind, port, timeout):
    _report("recv", stream_recv, bind, port, timeout)


if __name__ == "__main__":
    stream.main(prog_name="python -m mrcctl.cli.stream")
