"""Static checks of the install/CI/VM files (no root, no network)."""

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _path(*parts):
    return os.path.join(ROOT, *parts)


def _read(*parts):
    with open(_path(*parts)) as f:
        return f.read()


def test_setup_sh_parses():
    cp = subprocess.run(["bash", "-n", _path("scripts", "setup.sh")], capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr


def test_setup_sh_is_strict_and_knows_its_modes():
    s = _read("scripts", "setup.sh")
    assert "set -euo pipefail" in s
    for needle in ("--demo", "--test", "dpkg-query", "make -C bpf", "/usr/local/bin/mrcctl",
                   "libbpf-dev", "clang", "iputils-ping", "pytest"):
        assert needle in s, needle
    # pytest's "no tests collected" must not pass silently
    assert re.search(r"rc -eq 5", s)


def test_setup_sh_help_and_bad_option():
    cp = subprocess.run(["bash", _path("scripts", "setup.sh"), "--help"], capture_output=True, text=True)
    assert cp.returncode == 0 and "--test" in cp.stdout
    cp = subprocess.run(["bash", _path("scripts", "setup.sh"), "--bogus"], capture_output=True, text=True)
    assert cp.returncode == 2 and "unknown option" in cp.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_shellcheck():
    cp = subprocess.run(["shellcheck", "-S", "warning", _path("scripts", "setup.sh"), _path(".ci", "run")],
                        capture_output=True, text=True)
    assert cp.returncode == 0, cp.stdout


def test_ci_run_calls_setup_test():
    p = _path(".ci", "run")
    assert os.path.isfile(p)
    s = _read(".ci", "run")
    assert s.startswith("#!") and "set -euo pipefail" in s
    assert re.search(r"scripts/setup\.sh\s+--test", s)
    cp = subprocess.run(["bash", "-n", p], capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr


def test_testbed_cli_help():
    cp = subprocess.run([sys.executable, _path("scripts", "testbed.py"), "--help"], capture_output=True, text=True)
    assert cp.returncode == 0 and "blackhole" in cp.stdout


# what the docs say to run them with (the distribution's interpreter, not
# the venv's): each must find mrc's packages itself (scripts/__init__.py)
SYSTEM_PYTHON = "/usr/bin/python3"
NO_HELP = {"__init__.py", "udpseq.py"}


@pytest.mark.parametrize("script", sorted(n for n in os.listdir(_path("scripts"))
                                          if n.endswith(".py") and n not in NO_HELP))
def test_scripts_run_under_the_system_python(script):
    cp = subprocess.run([SYSTEM_PYTHON, _path("scripts", script), "--help"],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert "usage" in cp.stdout.lower()


@pytest.mark.parametrize("script", sorted(n for n in os.listdir(_path("scripts")) if n.endswith(".py")))
def test_scripts_reach_the_venv_before_mrc(script):
    """--help alone does not show it (mrcctl imports pyroute2 lazily): what
    fails is the `mrcctl up` a benchmark runs with sys.executable. The first
    import of the project's code must therefore be scripts/ (or a script that
    starts with it)."""
    first = next((m.group(1) for m in re.finditer(
        r"^(?:from|import) (scripts|lab|mrcctl|bench_\w+|fuzzgen|unit_dp)\b",
        _read("scripts", script), re.M)), None)
    assert first in (None, "scripts") or first.startswith("bench_"), first


def test_vagrantfile_content():
    s = _read("Vagrantfile")
    assert 'config.vm.box = "bento/ubuntu-24.04"' in s
    assert "scripts/setup.sh" in s
    assert re.search(r"cpus\s*=\s*2", s) and re.search(r"memory\s*=\s*4096", s)


@pytest.mark.skipif(shutil.which("ruby") is None, reason="ruby not installed")
def test_vagrantfile_is_valid_ruby():
    cp = subprocess.run(["ruby", "-c", _path("Vagrantfile")], capture_output=True, text=True)
    assert cp.returncode == 0 and "Syntax OK" in cp.stdout, cp.stderr
