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
