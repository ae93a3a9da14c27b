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
    env = {e["name"]: e.get("value") for e in c["env"]}
    # the node's config: written by the init container into a volume both mount
    init = spec["initContainers"][0]
    ienv = {e["name"]: e.get("value") for e in init["env"]}
    imounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    node_vol = next(n for n, p in mounts.items() if env["MRC_CONFIG"].startswith(p + "/"))
    assert "emptyDir" in vols[node_vol] and ienv["MRC_CONFIG"] == env["MRC_CONFIG"]
    assert ienv["MRC_CONFIG"].startswith(imounts[node_vol] + "/")
    tmpl_vol = next(n for n, p in imounts.items() if ienv["MRC_TEMPLATE"].startswith(p + "/"))
    assert vols[tmpl_vol]["configMap"]["name"] == "mrc-config"
    # the peers dir the config names is the mrc-peers ConfigMap, in both containers
    from mrcctl.instance import config
    cms = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    peers_dir = config.parse(cms["mrc-config"]["data"]["mrc.toml"]).peers_dir
    for m in (mounts, imounts):
        vol = next(n for n, p in m.items() if p == peers_dir)
        assert vols[vol]["configMap"]["name"] == "mrc-peers"
    assert ienv["MRC_PEERS_DIR"] == peers_dir
    assert any(e["name"] == "NODE_NAME" and e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
               for e in init["env"])


def _k8s(kind: str, name: str) -> dict:
    return next(d for d in _k8s_docs() if d["kind"] == kind and d["metadata"]["name"] == name)


def test_kubernetes_every_node_gets_its_config_and_the_others_as_peers(tmp_path):
    """The init container's script, run for each node of the example: the
    node's config has its own overlay address and the other nodes as peers
    (its own file in the shared directory skipped)."""
    from mrcctl.instance import config
    peers = _k8s("ConfigMap", "mrc-peers")["data"]
    template = _k8s("ConfigMap", "mrc-config")["data"]["mrc.toml"]
    init = _k8s("DaemonSet", "mrc-agent")["spec"]["template"]["spec"]["initContainers"][0]
    script = init["args"][0]
    (tmp_path / "peers.d").mkdir()
    for key, text in peers.items():
        (tmp_path / "peers.d" / key).write_text(text)
    (tmp_path / "mrc.toml.in").write_text(template.replace(
        config.parse(template).peers_dir, str(tmp_path / "peers.d")))
    assert len(peers) >= 3
    for key, text in peers.items():
        node = key.removesuffix(".toml")
        out = tmp_path / f"{node}.toml"
        cp = subprocess.run(["sh", "-c", script], capture_output=True, text=True,
                            env={"PATH": os.environ["PATH"], "NODE_NAME": node,
                                 "MRC_TEMPLATE": str(tmp_path / "mrc.toml.in"),
                                 "MRC_PEERS_DIR": str(tmp_path / "peers.d"), "MRC_CONFIG": str(out)})
        assert cp.returncode == 0, cp.stderr
        cfg = config.load(out)
        own = config.tomllib.loads(text)["overlay"]
        assert str(cfg.overlay_address.ip) == own
        assert sorted(p.name for p in cfg.peers) == sorted(k.removesuffix(".toml") for k in peers if k != key)
        assert cfg.metrics_listen and cfg.metrics_listen.startswith("127.0.0.1:")
    cp = subprocess.run(["sh", "-c", script], capture_output=True, text=True,
                        env={"PATH": os.environ["PATH"], "NODE_NAME": "node-z",
                             "MRC_TEMPLATE": str(tmp_path / "mrc.toml.in"),
                             "MRC_PEERS_DIR": str(tmp_path / "peers.d"), "MRC_CONFIG": str(tmp_path / "z")})
    assert cp.returncode != 0 and "node-z.toml" in cp.stderr


def test_kubernetes_peers_script_writes_the_example():
    yaml = pytest.importorskip("yaml")
    peers = _k8s("ConfigMap", "mrc-peers")["data"]
    from mrcctl.instance import config
    lines = []
    for key, text in peers.items():
        t = config.tomllib.loads(text)
        lines.append(f"{key.removesuffix('.toml')} {t['overlay']} {t['underlay']['eth1']} {t['underlay']['eth2']}")
    cp = subprocess.run(["sh", str(DEPLOY / "kubernetes" / "mrc-peers.sh")], input="# nodes\n" + "\n".join(lines),
                        capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr
    assert yaml.safe_load(cp.stdout)["data"] == peers


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
