"""mrcctl without the privileges it needs: one line naming the missing
capabilities, exit 1, nothing touched.

"Not root" is tried two ways: the real user nobody (uid 65534, kept able to
read the interpreter under /root with CAP_DAC_READ_SEARCH only, which mrc
never needs), and uid 0 with capabilities removed from the bounding set.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="needs root and setpriv to drop privileges")

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
          "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]

CONFIG = """\
[overlay]
device = "hpv0"
address = "172.31.9.1/24"

[[plane]]
device = "lo"

[[peer]]
name = "h1"
overlay = "172.31.9.2"
[peer.underlay]
lo = "10.9.9.2"
"""


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    # pytest's tmp dirs are 0700: nobody could not read a config there.
    d = Path(f"/tmp/hpriv-{os.getpid()}")
    d.mkdir(mode=0o755, exist_ok=True)
    os.chmod(d, 0o755)
    p = d / "mrc.toml"
    p.write_text(CONFIG)
    os.chmod(p, 0o644)
    bad = d / "bad.toml"
    bad.write_text(CONFIG.replace('"lo"', '"lo"\nweight = -3', 1))
    os.chmod(bad, 0o644)
    secret = d / "secret.toml"
    secret.write_text(CONFIG)
    os.chmod(secret, 0o600)
    os.chown(secret, 65534, 65534)      # root without CAP_DAC_OVERRIDE cannot read it
    yield {"ok": p, "bad": bad, "secret": secret}
    shutil.rmtree(d, ignore_errors=True)


def run(prefix: list[str], *args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MRC_DEBUG"}
    return subprocess.run([*prefix, sys.executable, "-m", "mrcctl", *map(str, args)],
                          capture_output=True, text=True, timeout=60, cwd="/", env=env)


def instances() -> list[str]:
    """This namespace's record of the test's overlay (other tests run
    instances of their own meanwhile)."""
    d = Path(f"/run/mrc/instances/ns{os.stat('/proc/self/ns/net').st_ino}-hpv0")
    return [d.name] if d.exists() else []


@pytest.mark.parametrize("who,command,missing", [
    ("nobody", "up", "CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN"),
    ("nobody", "down", "CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN"),
    ("nobody", "agent", "CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN"),
    ("nobody", "status", "CAP_BPF, CAP_SYS_ADMIN"),
    ("root-no-caps", "up", "CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN"),
    ("root-no-net-admin", "up", "CAP_NET_ADMIN"),
    ("root-no-sys-admin", "up", "CAP_SYS_ADMIN"),
    ("root-no-sys-admin", "status", "CAP_SYS_ADMIN"),
    ("root-no-bpf-no-sys-admin", "status", "CAP_BPF, CAP_SYS_ADMIN"),
])
def test_missing_capability_is_named(cfg, who, command, missing):
    prefix = {
        "nobody": NOBODY,
        "root-no-caps": ["setpriv", "--bounding-set=-all", "--inh-caps=-all"],
        "root-no-net-admin": ["setpriv", "--bounding-set=-net_admin"],
        "root-no-sys-admin": ["setpriv", "--bounding-set=-sys_admin"],
        "root-no-bpf-no-sys-admin": ["setpriv", "--bounding-set=-sys_admin,-bpf"],
    }[who]
    before = instances()
    cp = run(prefix, command, "-c", cfg["ok"])
    assert cp.stderr == f"mrcctl: error: missing capability {missing} (run as root)\n"
    assert cp.returncode == 1
    assert cp.stdout == ""
    assert instances() == before
    assert subprocess.run(["ip", "link", "show", "hpv0"], capture_output=True).returncode != 0


def test_bad_config_is_reported_before_privileges(cfg):
    """Validation needs no privilege: a user checking a file sees its error."""
    cp = run(NOBODY, "up", "-c", cfg["bad"])
    assert cp.stderr == f"mrcctl: error: {cfg['bad']}: plane[0].weight: -3 is out of range 0..1000\n"
    assert cp.returncode == 2


def test_unreadable_config(cfg):
    cp = run(["setpriv", "--bounding-set=-all", "--inh-caps=-all"], "up", "-c", cfg["secret"])
    assert cp.stderr == (f"mrcctl: error: Invalid value for '-c' / '--config': File '{cfg['secret']}' "
                         "is not readable. (see `mrcctl up --help`)\n")
    assert cp.returncode == 2


def test_help_and_version_need_nothing(cfg):
    for args in (["--help"], ["--version"], ["up", "--help"]):
        cp = run(NOBODY, *args)
        assert cp.returncode == 0, cp.stderr
        assert cp.stderr == ""
