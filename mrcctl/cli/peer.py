"""mrcctl peer add|remove|list: membership of a running instance, through
its [peers] dir (instance/members.py)."""

from __future__ import annotations

import os
import time
import tomllib
from pathlib import Path

import click

from ..errors import InputError, MrcError
from ..instance import config as cfgmod
from .common import CONFIG_OPT, load_config, need_privileges

# how long `peer add/remove` waits for a running agent to apply the file
# (0.1-0.2 s at 4,096 peers; a change that arrives while the agent applies
# another, or a loaded machine, waits longer)
AGENT_WAIT_S = 30.0


@click.group()
def peer():
    """Peers of a running instance: `peer add|remove|list -c FILE`.

    Peers added here are files in the config's [peers] dir (one per peer),
    which the agent watches; the change is applied to the running instance
    at once and touches no other peer.
    """


def _peers_dir(cfg: cfgmod.Config, config_path: str) -> Path:
    if cfg.peers_dir is None:
        raise InputError(f"{config_path}: no [peers] dir, so peers can only be changed in its [[peer]] "
                         "tables and `mrcctl up` (see docs/operator-guide.md, [peers])")
    return cfgmod.peers_dir_path(cfg)


def _fields(file, name, overlay, underlay, evs_per_plane, ev_base, spray, min_active, flowlet_gap_us,
            key_file) -> dict:
    fields: dict = {}
    if file is not None:
        try:
            fields = tomllib.loads(Path(file).read_text())
        except OSError as e:
            raise InputError(f"{file}: cannot read: {e.strerror}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise InputError(f"{file}: TOML syntax: {e}") from None
        fields.setdefault("name", Path(file).stem)
    opts = {"name": name, "overlay": overlay, "evs_per_plane": evs_per_plane, "ev_base": ev_base,
            "spray": spray, "min_active": min_active, "flowlet_gap_us": flowlet_gap_us, "key_file": key_file}
    fields.update({k: v for k, v in opts.items() if v is not None})
    if underlay:
        und = {}
        for item in underlay:
            dev, sep, addr = item.partition("=")
            if not sep or not dev or not addr:
                raise InputError(f"--underlay {item!r}: must be PLANE=ADDRESS (e.g. p0=10.200.0.3)")
            und[dev] = addr
        fields["underlay"] = und
    if "name" not in fields:
        raise InputError("the peer needs a name: --name NAME (or a name key in --file)")
    if not isinstance(fields["name"], str) or not cfgmod.PEER_NAME_RE.match(fields["name"]):
        raise InputError(f"name: {fields['name']!r} is not a valid peer name (letters, digits, _ . -)")
    for k in ("overlay", "underlay"):
        if k not in fields:
            raise InputError(f"the peer needs --{k}" + (" PLANE=ADDRESS" if k == "underlay" else " ADDRESS"))
    return fields


def _write(path: Path, text: str | None) -> None:
    """Atomic: the agent never reads half a file (the temporary name starts
    with a dot, which the peers dir ignores)."""
    if text is None:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _apply(cfg: cfgmod.Config, path: Path, old_text: str | None, new_text: str | None, done) -> str:
    """Write the file and have the change applied: by the agent when one
    runs (it owns the maps it would otherwise race), else here. On failure
    the file goes back to what it was. Returns how it went, for the output
    line."""
    from ..instance import members, supervisor
    from ..instance.state import Instance
    inst = Instance(cfg.overlay_device)
    state = inst.read()
    gen = members.record_of(state).get("generation", 0)
    _write(path, new_text)
    if not state.get("prog_ids"):
        return "written; the instance is not up (`mrcctl up` applies it)"
    t0 = time.monotonic()
    try:
        if supervisor.alive(state.get("agent_pid")):
            while True:
                rec = members.record_of(inst.read())
                if done(rec):
                    return f"applied by the agent in {rec.get('last_apply_ms', 0):.1f} ms " \
                           f"({(time.monotonic() - t0) * 1000:.0f} ms until seen here)"
                if rec.get("error") and rec.get("generation", 0) > gen:
                    raise MrcError(f"the agent could not apply it: {rec['error']}")
                if time.monotonic() - t0 > AGENT_WAIT_S:
                    raise MrcError(f"the agent has not applied it within {AGENT_WAIT_S:g} s "
                                   f"(see {inst.run_dir / 'agent.log'})")
                time.sleep(0.005)
        change, took = members.apply(cfg)
        return f"applied in {took * 1000:.1f} ms"
    except BaseException:
        _write(path, old_text)
        raise


@peer.command("add")
@CONFIG_OPT
@click.option("--file", "file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="A peer file (the keys of a [[peer]] table); options given too override its keys.")
@click.option("--name", default=None, help="Peer name (also the file name in the peers dir).")
@click.option("--overlay", default=None, metavar="ADDRESS", help="The peer's overlay address.")
@click.option("--underlay", multiple=True, metavar="PLANE=ADDRESS",
              help="The peer's address on a plane; once per plane.")
@click.option("--evs-per-plane", type=int, default=None)
@click.option("--ev-base", type=int, default=None)
@click.option("--spray", default=None, type=click.Choice(cfgmod.SPRAY_MODES))
@click.option("--min-active", type=int, default=None)
@click.option("--flowlet-gap-us", type=int, default=None)
@click.option("--key-file", default=None, type=click.Path(dir_okay=False))
def peer_add(config_path, file, name, overlay, underlay, evs_per_plane, ev_base, spray, min_active,
             flowlet_gap_us, key_file):
    """Add a peer: write PEERS_DIR/NAME.toml and apply it to the running
    instance (no other peer's state or traffic is touched)."""
    cfg = load_config(config_path)
    d = _peers_dir(cfg, config_path)
    fields = _fields(file, name, overlay, underlay, evs_per_plane, ev_base, spray, min_active,
                     flowlet_gap_us, key_file)
    name = fields["name"]
    fname = f"{name}{cfgmod.PEER_FILE_SUFFIX}"
    for p in cfg.peers:
        if p.name == name:
            where = p.source if p.source != "inline" else f"{config_path} ([[peer]] tables)"
            raise InputError(f"peer {name!r} already exists (in {where}); `mrcctl peer remove` it first")
    fields.pop("name")           # the file name says it
    text = cfgmod.peer_toml(fields)
    new = load_config(config_path, {fname: text.encode()})
    mine = str(d / fname)
    for err in new.peer_errors:
        if err.startswith(mine + ":"):
            raise InputError(err.replace(mine + ": peer.", f"peer {name}: ").replace(mine, f"peer {name}"))
    need_privileges()
    if not d.is_dir():
        raise InputError(f"peers.dir: {d}: no such directory")
    path = d / fname
    p = next(q for q in new.peers if q.name == name)
    from ..instance.members import peer_digest
    dig = peer_digest(p)
    how = _apply(new, path, None, text, lambda rec: rec["peers"].get(str(p.overlay), {}).get("digest") == dig)
    # the index it runs at, from the instance's record (loading the config
    # again for it took a second at 1,024 peers)
    from ..instance import members
    from ..instance.state import Instance
    rec = members.record_of(Instance(new.overlay_device).read())["peers"].get(str(p.overlay), {})
    click.echo(f"peer {name} added: index {rec.get('index', p.index)}, {len(p.paths)} paths, {path}; {how}")


@peer.command("remove")
@CONFIG_OPT
@click.argument("name")
def peer_remove(config_path, name):
    """Remove a peer added through the peers dir: delete its file and take it
    out of the running instance (its index is retired, its state cleared)."""
    cfg = load_config(config_path)
    _peers_dir(cfg, config_path)
    p = next((q for q in cfg.peers if q.name == name), None)
    if p is None:
        raise InputError(f"no peer {name!r} (peers: {', '.join(q.name for q in cfg.peers) or 'none'})")
    if p.source == "inline":
        raise InputError(f"peer {name!r} is a [[peer]] table of {config_path}: remove it there and run "
                         "`mrcctl up`")
    need_privileges()
    path = Path(p.source)
    new = load_config(config_path, {path.name: None})
    old_text = path.read_text()
    how = _apply(new, path, old_text, None, lambda rec: str(p.overlay) not in rec["peers"])
    click.echo(f"peer {name} removed (was index {p.index}); {how}")


@peer.command("list")
@CONFIG_OPT
def peer_list(config_path):
    """Configured peers: index, name, overlay address, source, state
    (up: running as configured; pending: not applied yet; removing:
    running but no longer configured) and usable paths."""
    from ..instance import members
    from ..instance.state import Instance
    cfg = load_config(config_path)
    state = Instance(cfg.overlay_device).read()
    rec = members.record_of(state)
    usable = {}
    if state.get("prog_ids"):
        try:
            from ..datapath.maps import Datapath
            with Datapath(Instance(cfg.overlay_device)) as dp:
                for p in cfg.peers:
                    usable[p.name] = sum(dp.usable_paths(p.index, len(p.paths)))
        except (MrcError, OSError):
            pass
    rows = [("INDEX", "NAME", "OVERLAY", "SOURCE", "STATE", "PATHS")]
    for p in sorted(cfg.peers, key=lambda q: q.index):
        e = rec["peers"].get(str(p.overlay))
        st = "up" if e and e["index"] == p.index and e["digest"] == members.peer_digest(p) else "pending"
        if not state.get("prog_ids"):
            st = "down"
        paths = f"{usable[p.name]}/{len(p.paths)}" if p.name in usable else f"-/{len(p.paths)}"
        rows.append((str(p.index), p.name, str(p.overlay), p.source, st, paths))
    configured = {str(p.overlay) for p in cfg.peers}
    for ov, e in rec["peers"].items():
        if ov not in configured and state.get("prog_ids"):
            rows.append((str(e["index"]), e["name"], ov, e.get("source", "?"), "removing", "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    for err in cfg.peer_errors:
        click.echo(f"left out: {err}")
    if rec.get("error"):
        click.echo(f"last change not applied: {rec['error']}")
