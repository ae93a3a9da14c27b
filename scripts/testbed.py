#!/usr/bin/env python3
"""Test bed tool: N hosts in network namespaces joined by veth planes.

The testbed is mrcctl/lab/testbed.py (so `mrcctl demo` and the tests share
it), its command line mrcctl/cli/testbed.py; this wrapper runs that from a
checkout without installing. See `scripts/testbed.py --help`.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import scripts  # noqa: E402,F401  (under the venv's interpreter: scripts/__init__.py)
from mrcctl.cli.testbed import main  # noqa: E402

if __name__ == "__main__":
    main()
