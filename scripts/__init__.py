"""Benchmarks and long-running checks (run as `python3 scripts/NAME.py`)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def venv_python() -> Path | None:
    """The interpreter of the venv setup.sh made (MRC_VENV, else the one
    /etc/default/mrc names, else <repo>/.venv), if it exists."""
    venv = os.environ.get("MRC_VENV")
    if not venv and os.access("/etc/default/mrc", os.R_OK):
        for line in Path("/etc/default/mrc").read_text().splitlines():
            if line.startswith("MRC_VENV="):
                venv = line.split("=", 1)[1].strip()
    py = Path(venv or REPO / ".venv") / "bin" / "python"
    return py if py.exists() else None


def _into_venv() -> None:
    """The docs say `sudo python3 scripts/NAME.py`: the system interpreter,
    which lacks what the venv holds (pyroute2, click, rich). Run the script
    again under the venv's, before anything imports mrcctl."""
    if sys.prefix != sys.base_prefix or importlib.util.find_spec("pyroute2") is not None:
        return
    py = venv_python()
    if py is None:
        sys.exit(f"{Path(sys.argv[0]).name}: error: no Python venv with mrc's packages "
                 "(run: sudo bash scripts/setup.sh)")
    os.execv(py, [str(py), *sys.argv])


_into_venv()


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
