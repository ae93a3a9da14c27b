"""Syntax checks of what ships under deploy/ and docs/ (no root, no network)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "systemd" / "mrc-agent@.service"


def _unit_sections(text: str) -> dict[str, dict[str, list[str]]]:
    """systemd's INI dialect: repeated keys are allowed, so no configparser dedup."""
    sections: dict[str, dict[str, list[str]]] = {}
    cur = None
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s[0] in "#;":
            continue
        m = re.fullmatch(r"\[([A-Za-z]+)\]", s)
        if m:
            cur = sections.setdefault(m.group(1), {})
            continue
        assert cur is not None, f"line {n}: key outside a section"
        key, sep, value = s.partition("=")
        assert sep and re.fullmatch(r"[A-Za-z]+", key), f"line {n}: not KEY=VALUE: {line!r}"
        cur.setdefault(key, []).append(value)
    return sections


def test_systemd_unit_content():
    sec = _unit_sections(UNIT.read_text())
    assert set(sec) == {"Unit", "Service", "Install"}
    svc = sec["Service"]
    assert svc["Type"] == ["simple"]
    assert "/etc/mrc/%i.toml" in UNIT.read_text()
    assert any(re.search(r"mrcctl up --no-agent -c ", v) for v in svc["ExecStartPre"])
    assert any(re.search(r"mrcctl agent -c ", v) for v in svc["ExecStart"])
    assert any(re.search(r"mrcctl down -c ", v) for v in svc["ExecStopPost"])
    assert sec["Install"]["WantedBy"] == ["multi-user.target"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_unit_verifies(tmp_path):
    # an instance name, as systemctl would use it
    unit = tmp_path / "mrc-agent@test.service"
    shutil.copy(UNIT, unit)
    cp = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    # mrcctl is linked to /usr/local/bin by setup.sh; a checkout that was not set up lacks it
    problems = [ln for ln in (cp.stdout + cp.stderr).splitlines()
                if ln.strip() and not ("is not executable" in ln and "mrcctl" in ln)]
    assert not problems, "\n".join(problems)


def _k8s_docs():
    yaml = pytest.importorskip("yaml")
    docs = []
    for f in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d is not None]
    return docs


def test_kubernetes_manifests_parse_and_are_complete():
    docs = _k8s_docs()
    for d in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(d), d
        assert d["metadata"].get("name")
    kinds = {d["kind"]: d for d in docs}
    assert {"DaemonSet", "ConfigMap"} <= set(kinds)
    ds = kinds["DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert spec["hostNetwork"] is True
    c = spec["containers"][0]
    assert c["securityContext"]["privileged"] is True
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in spec["volumes"]}
    assert set(mounts) <= set(vols)
    assert vols[next(n for n, p in mounts.items() if p == "/sys/fs/bpf")]["hostPath"]["path"] == "/sys/fs/bpf"
    assert vols[next(n for n, p in mounts.items() if p == "/run/mrc")]["hostPath"]["path"] == "/run/mrc"
    cm_name = vols[next(n for n, p in mounts.items() if p == "/etc/mrc")]["configMap"]["name"]
    assert cm_name == kinds["ConfigMap"]["metadata"]["name"]


def test_kubernetes_configmap_is_a_valid_mrc_config():
    from mrcctl.instance import config
    cm = next(d for d in _k8s_docs() if d["kind"] == "ConfigMap")
    for name, text in cm["data"].items():
        cfg = config.parse(text, source=name)
        assert cfg.metrics_listen and cfg.metrics_listen.startswith("127.0.0.1:")


def test_completion_script_is_current():
    shipped = (DEPLOY / "completion" / "mrcctl.bash").read_text()
    cp = subprocess.run([sys.executable, "-m", "mrcctl"], capture_output=True, text=True,
                        env={**os.environ, "_MRCCTL_COMPLETE": "bash_source"})
    # click names the function after the program name it is invoked as
    assert cp.stdout.strip() == shipped.strip(), "regenerate: _MRCCTL_COMPLETE=bash_source mrcctl > " \
                                                 "deploy/completion/mrcctl.bash"
    assert subprocess.run(["bash", "-n", str(DEPLOY / "completion" / "mrcctl.bash")]).returncode == 0
    cp = subprocess.run([sys.executable, "-m", "mrcctl"], capture_output=True, text=True,
                        env={**os.environ, "_MRCCTL_COMPLETE": "bash_complete", "COMP_WORDS": "mrcctl to",
                             "COMP_CWORD": "1"})
    assert "plain,top" in cp.stdout


def test_status_schema_is_a_valid_schema():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "docs" / "status.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)


def test_operator_guide_covers_every_config_key_and_command():
    guide = (ROOT / "docs" / "operator-guide.md").read_text()
    from mrcctl.cli import cli
    for name in cli.commands:
        assert f"mrcctl {name}" in guide, name
    src = (ROOT / "mrcctl" / "instance" / "config.py").read_text()
    # every key the validator accepts (the _check_keys sets) is documented
    for keys in re.findall(r"_check_keys\([^,]+,\s*\w+,\s*\{([^}]*)\}", src):
        for key in re.findall(r'"([a-z_]+)"', keys):
            forms = (f"`{key}`", f".{key}`", f".{key}.", f"[{key}]", f"[[{key}]]")
            assert any(f in guide for f in forms), key
    for trouble in ("MTU", "XDP", "BTF", "rp_filter", "nft", "ip netns exec"):
        assert trouble in guide, trouble


@pytest.mark.skipif(shutil.which("vagrant") is None, reason="vagrant not installed (ruby -c runs in test_packaging)")
def test_vagrantfile_validates():
    cp = subprocess.run(["vagrant", "validate"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
