"""mrcctl's imports point one way: datapath <- instance <- observe <- agent,
lab <- cli. Read from the source (every import statement, function-level
ones included), so a lazy import cannot slip past.

Nothing outside mrcctl.cli imports cli, agent or lab; a subpackage imports
only its own modules and those of lower layers; no module imports itself
back through others.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Lower number = lower layer. A module may import its own subpackage and any
# lower layer. agent and lab share a layer and so may not import each other.
LAYERS = {
    "mrcctl": 0, "mrcctl.errors": 0, "mrcctl.privileges": 0,
    "mrcctl.datapath": 1,
    "mrcctl.instance": 2,
    "mrcctl.observe": 3,
    "mrcctl.agent": 4, "mrcctl.lab": 4,
    "mrcctl.cli": 5,
    "mrcctl.__main__": 6,
}


def modules(root: Path, package: str = "mrcctl") -> dict[str, Path]:
    """Dotted name -> file of every module under root/package."""
    out = {}
    for f in sorted((root / package).rglob("*.py")):
        parts = list(f.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that module `name` imports, anywhere in it."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    out = set()

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
            # `from pkg import mod` imports the module pkg.mod when there is one
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            m = resolve(t)
            if m is not None and m != name:
                out.add(m)
    return out


def layer_of(module: str) -> str:
    best = ""
    for unit in LAYERS:
        if (module == unit or module.startswith(unit + ".")) and len(unit) > len(best):
            best = unit
    return best


def violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in sorted(graph.items()):
        a = layer_of(src)
        for dst in sorted(targets):
            b = layer_of(dst)
            if b != a and LAYERS[b] >= LAYERS[a]:
                bad.append(f"{src} imports {dst}: {b} is not below {a}")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle, each reported once (by its smallest module)."""
    found, seen = [], set()

    def walk(start: str, node: str, trail: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                key = frozenset(trail)
                if key not in seen:
                    seen.add(key)
                    found.append(trail + [start])
            elif nxt not in trail and nxt > start:
                walk(start, nxt, trail + [nxt])

    for m in sorted(graph):
        walk(m, m, [m])
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    mods = modules(root)
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def test_every_module_has_a_layer():
    assert [m for m in modules(ROOT) if not layer_of(m)] == []


def test_imports_point_one_way():
    assert violations(import_graph(ROOT)) == []


def test_no_import_cycles():
    graph = import_graph(ROOT)
    assert cycles(graph) == []
    # and none between subpackages either
    packages: dict[str, set[str]] = {}
    for src, targets in graph.items():
        packages.setdefault(layer_of(src), set()).update(layer_of(t) for t in targets if layer_of(t) != layer_of(src))
    assert cycles(packages) == []


def test_the_checks_see_a_wrong_import_and_a_cycle(tmp_path):
    """The rules catch what they are for: instance importing the agent
    lazily, and two modules importing each other."""
    pkg = tmp_path / "mrcctl"
    for d in ("instance", "agent", "datapath"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "instance" / "up.py").write_text("def f():\n    from ..agent import loop\n")
    (pkg / "agent" / "loop.py").write_text("from ..instance import up\n")
    (pkg / "datapath" / "a.py").write_text("from . import b\n")
    (pkg / "datapath" / "b.py").write_text("import mrcctl.datapath.a\n")
    graph = import_graph(tmp_path)
    assert violations(graph) == ["mrcctl.instance.up imports mrcctl.agent.loop: mrcctl.agent is not below "
                                 "mrcctl.instance"]
    assert sorted(map(sorted, cycles(graph))) == [
        ["mrcctl.agent.loop", "mrcctl.agent.loop", "mrcctl.instance.up"],
        ["mrcctl.datapath.a", "mrcctl.datapath.a", "mrcctl.datapath.b"]]
