"""Benchmarks and long-running checks (run as `python3 scripts/NAME.py`)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def preflight(name: str, needs: str, build: bool = True) -> str | None:
    """What every script checks before it touches the kernel: root, and the
    BPF objects built. Returns the one-line error to print, or None."""
    if os.geteuid() != 0:
        return f"{name}: error: needs root ({needs})"
    if build:
        r = subprocess.run(["make", "-s", "-C", str(REPO / "bpf")], capture_output=True, text=True)
        if r.returncode:
            return f"{name}: error: make -C bpf failed: {r.stderr.strip()[-500:]}"
    return None


def write_section(f: Path, title: str, begin: str, end: str, lines: list[str]) -> None:
    """Put a benchmark's generated lines between its begin/end markers in
    the doc f (the hand-written text around them stays), or append them
    with the markers if f has none yet (a new f starts with title)."""
    body = "\n".join([begin, *lines, end])
    text = f.read_text() if f.exists() else f"# {title}\n\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + body + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + body + "\n"
    f.parent.mkdir(parents=True, exist_ok=True)     # a fresh --out DIR
    f.write_text(text)


def command(script: str, ap, a, dests: tuple[str, ...]) -> str:
    """The command line that reproduces a run, for the results doc: the
    script and those of `dests` (argparse destinations) whose values differ
    from their defaults, in that order."""
    def arg(d):
        v = getattr(a, d)
        return f" --{d.replace('_', '-')}" + ("" if v is True else f" {v}")
    return f"sudo python3 scripts/{script}" + "".join(arg(d) for d in dests if getattr(a, d) != ap.get_default(d))
