"""The peers dir (issue #14.2): parsing, merging with [[peer]] tables,
stable indices and the change a new directory state is (no root)."""

from __future__ import annotations

import pytest

from mrcctl.instance import config as cfgmod
from mrcctl.instance import members

MAIN = """
[overlay]
address = "172.31.0.1/24"
[[plane]]
device = "p0"
[[plane]]
device = "p1"
{inline}
[peers]
dir = "peers.d"
"""
INLINE_H1 = """
[[peer]]
name = "h1"
overlay = "172.31.0.2"
[peer.underlay]
p0 = "10.200.0.2"
"""


def peer_file(ovl: str, ul: str, name: str | None = None, extra: str = "") -> str:
    head = f'name = "{name}"\n' if name else ""
    return f'{head}overlay = "{ovl}"\nevs_per_plane = 2\n{extra}\n[underlay]\np0 = "{ul}"\np1 = "{ul}1"\n'


@pytest.fixture
def site(tmp_path):
    (tmp_path / "peers.d").mkdir()
    main = tmp_path / "mrc.toml"
    main.write_text(MAIN.format(inline=INLINE_H1))
    return tmp_path


def load(site):
    return cfgmod.load(site / "mrc.toml")


def write(site, name: str, text: str):
    (site / "peers.d" / name).write_text(text)


def names(cfg):
    return [(p.name, p.index) for p in cfg.peers]


def test_files_are_peers_after_the_inline_ones(site):
    write(site, "h3.toml", peer_file("172.31.0.4", "10.200.0.4"))
    write(site, "h2.toml", peer_file("172.31.0.3", "10.200.0.3"))
    write(site, ".h4.toml.tmp", peer_file("172.31.0.5", "10.200.0.5"))     # a writer's temporary file
    write(site, "README", "not a peer")
    (site / "peers.d" / "..data").mkdir()                                 # a ConfigMap volume's insides
    cfg = load(site)
    assert names(cfg) == [("h1", 0), ("h2", 1), ("h3", 2)]
    h2 = cfg.peer("h2")
    assert h2.source == str(site / "peers.d" / "h2.toml") and cfg.peer("h1").source == "inline"
    assert [p.label for p in h2.paths] == ["p0/49152", "p0/49153", "p1/49154", "p1/49155"]
    assert str(h2.underlay["p1"]) == "10.200.0.31"


def test_this_hosts_own_file_is_skipped(site):
    """Every node may mount the same directory: its own file is not a peer."""
    write(site, "self.toml", peer_file("172.31.0.1", "10.200.0.1"))
    write(site, "h2.toml", peer_file("172.31.0.3", "10.200.0.3"))
    assert names(load(site)) == [("h1", 0), ("h2", 1)]


def test_no_inline_peers_and_an_empty_dir_are_fine(tmp_path):
    (tmp_path / "peers.d").mkdir()
    (tmp_path / "mrc.toml").write_text(MAIN.format(inline=""))
    assert cfgmod.load(tmp_path / "mrc.toml").peers == ()


def test_adding_and_removing_a_file_changes_the_digest(site):
    d0 = load(site).digest
    write(site, "h2.toml", peer_file("172.31.0.3", "10.200.0.3"))
    d1 = load(site).digest
    (site / "peers.d" / "h2.toml").unlink()
    assert d0 != d1 and load(site).digest == d0


def test_the_digest_on_disk_is_the_loaded_one_without_parsing(site):
    """What the agent's watcher compares before it parses thousands of files."""
    write(site, "h2.toml", peer_file("172.31.0.3", "10.200.0.3"))
    cfg = load(site)
    assert cfgmod.digest_on_disk(cfg) == cfg.digest
    write(site, "h3.toml", peer_file("172.31.0.4", "10.200.0.4"))
    assert cfgmod.digest_on_disk(cfg) == load(site).digest != cfg.digest
    (site / "peers.d" / "h3.toml").write_text(peer_file("172.31.0.4", "10.200.0.5"))     # edited
    assert cfgmod.digest_on_disk(cfg) == load(site).digest
    (site / "peers.d" / "h3.toml").unlink()
    (site / "mrc.toml").write_text(MAIN.format(inline=""))                            # the main file
    assert cfgmod.digest_on_disk(cfg) == load(site).digest != cfg.digest
    # with authentication the key files count too
    key = site / "k.key"
    key.write_text("00112233445566778899aabbccddeeff\n")
    (site / "mrc.toml").write_text(MAIN.format(inline=INLINE_H1) + f'[security]\nkey_file = "{key}"\n')
    cfg = load(site)
    assert cfgmod.digest_on_disk(cfg) == cfg.digest
    key.write_text("ffeeddccbbaa99887766554433221100\n")
    assert cfgmod.digest_on_disk(cfg) == load(site).digest != cfg.digest


@pytest.mark.parametrize("files, error", [
    ({"a.toml": peer_file("172.31.0.3", "10.200.0.3"), "b.toml": peer_file("172.31.0.3", "10.200.0.9")},
     r"b\.toml: overlay: 172\.31\.0\.3 is already used by peer 'a' \(in .*a\.toml\)"),
    ({"h1.toml": peer_file("172.31.0.9", "10.200.0.9")},
     r"h1\.toml: name: peer 'h1' is already defined in .*mrc\.toml \(\[\[peer\]\] 'h1'\)"),
    ({"x.toml": peer_file("172.31.0.2", "10.200.0.9")}, r"x\.toml: overlay: 172\.31\.0\.2 is already used by peer 'h1'"),
    ({"a.toml": peer_file("172.31.0.3", "10.200.0.2")},
     r"a\.toml: peer\.underlay\.p0: 10\.200\.0\.2 is already peer 'h1''s address on plane 'p0'"),
    ({"bad.toml": peer_file("172.31.0.300", "10.200.0.3")}, r"bad\.toml: peer\.overlay: '172\.31\.0\.300' is not an IP"),
    ({"bad.toml": peer_file("172.31.0.3", "10.200.0.3", extra="color = 1")},
     r"bad\.toml: peer\.color: unknown key"),
    ({"bad.toml": "overlay = \n"}, r"bad\.toml: TOML syntax"),
    ({"bad name.toml": peer_file("172.31.0.3", "10.200.0.3")}, r"not a valid peer name"),
])
def test_clear_errors(site, files, error):
    for name, text in files.items():
        write(site, name, text)
    with pytest.raises(cfgmod.ConfigError, match=error):
        load(site)


def test_a_lenient_load_leaves_a_bad_file_out(site):
    """What every command but `up` reads: one bad file stops none of them."""
    write(site, "h2.toml", peer_file("172.31.0.3", "10.200.0.3"))
    write(site, "h3.toml", peer_file("172.31.0.2", "10.200.0.4"))         # h1's overlay address
    with pytest.raises(cfgmod.ConfigError, match="h3.toml"):
        load(site)
    cfg = cfgmod.load(site / "mrc.toml", strict=False)
    assert names(cfg) == [("h1", 0), ("h2", 1)]
    assert len(cfg.peer_errors) == 1 and "h3.toml: overlay: 172.31.0.2 is already used" in cfg.peer_errors[0]


def test_missing_dir_is_an_error(site):
    (site / "peers.d").rmdir()
    with pytest.raises(cfgmod.ConfigError, match=r"peers\.dir: .*peers\.d: no such directory"):
        load(site)


def test_override_validates_a_change_before_it_is_written(site):
    write(site, "h2.toml", peer_file("172.31.0.3", "10.200.0.3"))
    cfg = cfgmod.load(site / "mrc.toml", {"h3.toml": peer_file("172.31.0.4", "10.200.0.4").encode(),
                                          "h2.toml": None})
    assert names(cfg) == [("h1", 0), ("h3", 1)]
    assert not (site / "peers.d" / "h3.toml").exists()


def test_peer_toml_reads_back():
    text = cfgmod.peer_toml({"overlay": "172.31.0.3", "evs_per_plane": 2, "spray": "flowlet",
                             "underlay": {"p0": "10.200.0.3", "p1": "10.200.0.31"}})
    import tomllib
    assert tomllib.loads(text) == {"overlay": "172.31.0.3", "evs_per_plane": 2, "spray": "flowlet",
                                   "underlay": {"p0": "10.200.0.3", "p1": "10.200.0.31"}}


# ------------------------------------------------------------------ indices

def running(cfg) -> dict:
    """The instance record after `cfg` was applied."""
    state: dict = {}
    members.note(state, cfg)
    return state


def test_indices_stay_with_their_peers(site):
    write(site, "b.toml", peer_file("172.31.0.3", "10.200.0.3", name="h2"))
    write(site, "c.toml", peer_file("172.31.0.4", "10.200.0.4", name="h3"))
    state = running(members.bind(load(site), {}))
    assert names(members.bind(load(site), state)) == [("h1", 0), ("h2", 1), ("h3", 2)]
    # reordered (h3's file now sorts first) and renamed (name kept by its key)
    (site / "peers.d" / "c.toml").rename(site / "peers.d" / "a.toml")
    (site / "peers.d" / "b.toml").rename(site / "peers.d" / "z.toml")
    cfg = members.bind(load(site), state)
    assert names(cfg) == [("h1", 0), ("h3", 2), ("h2", 1)]
    assert not members.diff(state, cfg), "moving files is no change"
    # h2 leaves: its index is retired, and a newcomer does not get it
    (site / "peers.d" / "z.toml").unlink()
    cfg = members.bind(load(site), state)
    ch = members.diff(state, cfg)
    assert ch.removed == [("172.31.0.3", 1, "h2")] and not ch.added
    state = running_after(state, cfg)
    assert state["members"]["retired"] == [1]
    write(site, "d.toml", peer_file("172.31.0.5", "10.200.0.5", name="h4"))
    cfg = members.bind(load(site), state)
    assert cfg.peer("h4").index == 3
    ch = members.diff(state, cfg)
    assert [p.name for p in ch.added] == ["h4"] and not ch.removed


def running_after(state: dict, cfg) -> dict:
    members.note(state, cfg)
    return state


def test_a_renamed_file_without_a_name_key_is_another_peer(site):
    write(site, "h2.toml", peer_file("172.31.0.3", "10.200.0.3"))
    state = running(members.bind(load(site), {}))
    (site / "peers.d" / "h2.toml").rename(site / "peers.d" / "node-b.toml")
    cfg = members.bind(load(site), state)
    ch = members.diff(state, cfg)
    # the same address keeps its index, but with a new name it starts afresh
    assert ch.removed == [("172.31.0.3", 1, "h2")] and [(p.name, p.index) for p in ch.added] == [("node-b", 1)]


def test_an_edited_file_is_removed_and_added(site):
    write(site, "h2.toml", peer_file("172.31.0.3", "10.200.0.3"))
    state = running(members.bind(load(site), {}))
    write(site, "h2.toml", peer_file("172.31.0.3", "10.200.0.3", extra='spray = "flowlet"'))
    ch = members.diff(state, members.bind(load(site), state))
    assert [n for _o, _i, n in ch.removed] == ["h2"] and [p.name for p in ch.added] == ["h2"]


def test_retired_indices_are_used_last_oldest_first(site):
    cfg = load(site)
    held = {"172.31.0.2": 5}
    out = cfgmod.assign_indices(cfg, held, retired=[0, 1])
    assert out.peer("h1").index == 5
    write(site, "h2.toml", peer_file("172.31.0.3", "10.200.0.3"))
    out = cfgmod.assign_indices(load(site), {"172.31.0.2": 0}, retired=[1, 2])
    assert names(out) == [("h1", 0), ("h2", 3)]
    every = {f"10.0.{i // 250}.{i % 250}": i for i in range(cfgmod.wire.MRC_PEERS_LIMIT) if i not in (0, 7, 9)}
    every["172.31.0.2"] = 0
    out = cfgmod.assign_indices(load(site), every, retired=[9, 7])
    assert out.peer("h2").index == 9      # none free: the one retired longest ago


def test_retired_indices_come_before_never_used_ones_beyond_the_room(site):
    """A cluster that replaces nodes must not creep to ever higher indices
    (and maps sized for them): past the room the maps have for this many
    peers, a retired index is taken before a never-used one."""
    write(site, "h2.toml", peer_file("172.31.0.3", "10.200.0.3"))
    cfg = load(site)
    room = cfg.room()
    held = {"172.31.0.2": 0}
    out = cfgmod.assign_indices(cfg, held, retired=list(range(1, room + 100)))
    assert out.peer("h2").index == 1          # the oldest retired, not room + 100
    out = cfgmod.assign_indices(cfg, held, retired=list(range(5, room)))
    assert out.peer("h2").index == 1          # a never-used one within the room first
    assert cfg.sizing().peers == room


def test_a_peer_leaving_in_the_same_change_does_not_pass_its_index_on(site):
    write(site, "h2.toml", peer_file("172.31.0.3", "10.200.0.3"))
    state = running(members.bind(load(site), {}))
    (site / "peers.d" / "h2.toml").unlink()
    write(site, "h5.toml", peer_file("172.31.0.6", "10.200.0.6"))
    cfg = members.bind(load(site), state)
    assert cfg.peer("h5").index == 2
    ch = members.diff(state, cfg)
    assert ch.removed == [("172.31.0.3", 1, "h2")] and [(p.name, p.index) for p in ch.added] == [("h5", 2)]


# ------------------------------------------------------------------ mrcctl peer, its refusals

def mrcctl(*args):
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-m", "mrcctl", *args], capture_output=True, text=True, cwd=root,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root),
                               "MRC_RUN_DIR": "/nonexistent/mrc-test"})


@pytest.mark.parametrize("args, error", [
    (["add", "--name", "h2", "--overlay", "172.31.0.2", "--underlay", "p0=10.200.0.9"],
     r"peer h2: overlay: 172\.31\.0\.2 is already used by peer 'h1' \(in .*mrc\.toml"),
    (["add", "--name", "h1", "--overlay", "172.31.0.9", "--underlay", "p0=10.200.0.9"],
     r"peer 'h1' already exists \(in .*mrc\.toml \(\[\[peer\]\] tables\)\)"),
    (["add", "--name", "h2", "--overlay", "172.31.0.x", "--underlay", "p0=10.200.0.9"],
     r"peer h2: overlay: '172\.31\.0\.x' is not an IP address"),
    (["add", "--name", "h2", "--overlay", "172.31.0.3", "--underlay", "p7=10.200.0.9"],
     r"peer h2: underlay\.p7: no such plane in this config"),
    (["add", "--name", "h2", "--overlay", "172.31.0.3", "--underlay", "p0=10.200.0.2"],
     r"10\.200\.0\.2 is already peer 'h1''s address on plane 'p0'"),
    (["add", "--name", "h2", "--overlay", "172.31.0.3"], r"the peer needs --underlay"),
    (["add", "--name", "h 2", "--overlay", "172.31.0.3", "--underlay", "p0=10.200.0.3"], r"not a valid peer name"),
    (["remove", "nobody"], r"no peer 'nobody' \(peers: h1\)"),
    (["remove", "h1"], r"peer 'h1' is a \[\[peer\]\] table of .*: remove it there and run `mrcctl up`"),
])
def test_peer_command_refusals(site, args, error):
    import re
    cp = mrcctl("peer", args[0], "-c", str(site / "mrc.toml"), *args[1:])
    assert cp.returncode == 2 and re.search(error, cp.stderr), cp.stderr
    assert "Traceback" not in cp.stderr
    assert list((site / "peers.d").iterdir()) == [], "nothing may be written"


def test_peer_command_needs_a_peers_dir(tmp_path):
    (tmp_path / "mrc.toml").write_text(MAIN.format(inline=INLINE_H1).replace('[peers]\ndir = "peers.d"\n', ""))
    cp = mrcctl("peer", "add", "-c", str(tmp_path / "mrc.toml"), "--name", "h2", "--overlay", "172.31.0.3",
                "--underlay", "p0=10.200.0.3")
    assert cp.returncode == 2 and "no [peers] dir" in cp.stderr, cp.stderr


# ---------------------------------------------------------------- LoadCache
# The agent's peers watcher loads the config again after every change: with
# a LoadCache only what changed is parsed, and the result must be what a
# load without one gives, errors included.

def test_a_cached_load_equals_a_fresh_one_after_every_kind_of_change(site):
    cache = cfgmod.LoadCache()
    write(site, "h2.toml", peer_file("172.31.0.3", "10.200.0.3"))
    write(site, "h3.toml", peer_file("172.31.0.4", "10.200.0.4"))
    assert cfgmod.load(site / "mrc.toml", cache=cache) == load(site)
    first = cache.files["h3.toml"][1]
    steps = [
        lambda: write(site, "h4.toml", peer_file("172.31.0.5", "10.200.0.5")),      # added
        lambda: (site / "peers.d" / "h2.toml").unlink(),                            # removed
        lambda: write(site, "h3.toml", peer_file("172.31.0.4", "10.200.0.14")),     # changed
        lambda: (site / "mrc.toml").write_text(MAIN.format(inline=INLINE_H1.replace(".0.2", ".0.9"))),
    ]
    for n, step in enumerate(steps):
        step()
        assert cfgmod.load(site / "mrc.toml", cache=cache) == load(site)
        # an unchanged file is not parsed again, until the config file changes
        assert (cache.files["h3.toml"][1] is first) == (n < 2)
    assert set(cache.files) == {"h3.toml", "h4.toml"}


def test_a_cached_peer_that_now_conflicts_is_refused_as_a_fresh_load_refuses_it(site):
    cache = cfgmod.LoadCache()
    write(site, "h3.toml", peer_file("172.31.0.4", "10.200.0.4"))
    cfgmod.load(site / "mrc.toml", cache=cache)
    # a file sorted before h3's takes its overlay address, then its name,
    # then its underlay address: h3's unchanged file is the one refused
    for text in (peer_file("172.31.0.4", "10.200.0.7"), peer_file("172.31.0.7", "10.200.0.7", name="h3"),
                 peer_file("172.31.0.7", "10.200.0.4")):
        write(site, "a.toml", text)
        with pytest.raises(cfgmod.ConfigError) as fresh:
            load(site)
        with pytest.raises(cfgmod.ConfigError) as cached:
            cfgmod.load(site / "mrc.toml", cache=cache)
        assert str(cached.value) == str(fresh.value)
        assert cfgmod.load(site / "mrc.toml", strict=False, cache=cache) == \
            cfgmod.load(site / "mrc.toml", strict=False)


def test_an_overlapping_prefix_is_found_among_thousands_of_peers(site):
    files = {f"n{k:04}.toml": peer_file(f"172.31.{k // 250 + 1}.{k % 250 + 1}", f"10.210.{k // 25}.{k % 25 + 1}",
                                        extra=f'prefixes = ["10.{k // 250 + 100}.{k % 250}.0/24"]').encode()
             for k in range(1000)}
    base = cfgmod.parse(MAIN.format(inline=""), source=str(site / "mrc.toml"))
    assert len(cfgmod.merge_peer_files(base, str(site / "peers.d"), files).peers) == 1000
    files["n9999.toml"] = peer_file("172.31.9.9", "10.220.0.1", extra='prefixes = ["10.103.0.0/16"]').encode()
    with pytest.raises(cfgmod.ConfigError, match=r"peer\[750\]\.prefixes: 10\.103\.0\.0/24 overlaps "
                                                 r"10\.103\.0\.0/16 of peer 'n9999'$"):
        cfgmod.merge_peer_files(base, str(site / "peers.d"), files)
