#!/usr/bin/env python3
"""Test bed tool: N hosts in network namespaces joined by veth planes.

The implementation lives in mrcctl/testbed.py (so `mrcctl demo` and the
tests share it); this wrapper runs it from a checkout without installing.
See `scripts/testbed.py --help`.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mrcctl.testbed import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
