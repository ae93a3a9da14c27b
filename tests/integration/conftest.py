import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(items):
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session", autouse=True)
def _built_objects():
    if os.geteuid() != 0:
        pytest.skip("integration tests need root")
    if not shutil.which("clang"):
        pytest.skip("clang not installed")
    r = subprocess.run(["make", "-C", str(REPO / "bpf")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
