"""Invalid configurations and command lines: one exact line on stderr, exit 2,
and nothing changed.

Every case runs the real `mrcctl` inside a throwaway network namespace that
has two planes toward a peer (plus a plane with no address and one with a
tiny MTU). "Nothing changed" is checked three ways: the namespace's links,
addresses, routes and plane sysctls are identical before and after; no
instance directory exists; and MRC_BPF_DIR points at an empty directory, so
a run that got as far as loading BPF would have failed with a different
message (the exact-message assertion proves no program was loaded).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mrcctl.lab.testbed import Testbed  # noqa: E402

PREFIX = "hcf"
NS = f"{PREFIX}-h0"

OVERLAY = """\
[overlay]
device = "mrc0"
address = "172.31.0.1/24"
"""
PLANES = """\
[[plane]]
device = "p0h1"

[[plane]]
device = "p1h1"
"""
PEER = """\
[[peer]]
name = "h1"
overlay = "172.31.0.2"
evs_per_plane = 4
[peer.underlay]
p0h1 = "10.200.0.2"
p1h1 = "10.201.0.2"
"""
BASE = OVERLAY + "\n" + PLANES + "\n" + PEER


def sub(old: str, new: str, text: str = BASE) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


PEER2 = PEER.replace('"h1"', '"h2"').replace("172.31.0.2", "172.31.0.3").replace(
    "10.200.0.2", "10.200.0.3").replace("10.201.0.2", "10.201.0.3")
SEVENTEEN = "".join(f'[[plane]]\ndevice = "q{i}"\n' for i in range(17))

# (id, config text, exact message after "mrcctl: error: <file>: ")
CONFIGS = [
    ("toml-syntax", BASE + "\nbroken = \n", "TOML syntax: Invalid value (at line 19, column 10)"),
    ("not-utf8", b"[overlay]\ndevice = \"\xff\"\n", "not UTF-8 text"),
    ("unknown-top-key", BASE + "\n[overlays]\nx = 1\n",
     "overlays: unknown key (did you mean 'overlay'?)"),
    ("no-overlay", PLANES + PEER, "overlay: missing table [overlay]"),
    ("overlay-not-table", 'overlay = "mrc0"\n' + PLANES + PEER, "overlay: must be a table, not 'mrc0'"),
    ("overlay-unknown-key", sub('device = "mrc0"', 'device = "mrc0"\nmut = 1400'),
     "overlay.mut: unknown key (did you mean 'mtu'?)"),
    ("overlay-no-address", sub('address = "172.31.0.1/24"\n', ""),
     'overlay.address: missing (e.g. "172.31.0.1/24", or ["172.31.0.1/24", "fd31::1/64"] for both families)'),
    ("overlay-address-no-prefix", sub("172.31.0.1/24", "172.31.0.1"),
     "overlay.address: '172.31.0.1' is not an IPv4 or IPv6 address with prefix length "
     '(e.g. "172.31.0.1/24", "fd31::1/64")'),
    ("overlay-address-ipv6-only", sub("172.31.0.1/24", "fd31::1/64"),
     "peer[0].overlay: 172.31.0.2 is IPv4 but overlay.address has no IPv4 address"),
    ("overlay-address-two-ipv4", sub('"172.31.0.1/24"', '["172.31.0.1/24", "172.31.1.1/24"]'),
     "overlay.address: two IPv4 addresses, at most one per family"),
    ("overlay-address-empty-list", sub('"172.31.0.1/24"', '[]'),
     "overlay.address: empty, give one address per family"),
    ("overlay-address-link-local", sub('"172.31.0.1/24"', '["172.31.0.1/24", "fe80::1/64"]'),
     "overlay.address: 'fe80::1/64' cannot be used as a host address"),
    ("overlay-prefix-host-bits", sub('address = "172.31.0.1/24"', 'address = "172.31.0.1/24"\nprefixes = ["10.244.1.1/24"]'),
     "overlay.prefixes: '10.244.1.1/24' is not a network prefix (host bits set)"),
    ("overlay-prefix-overlaps-peer", sub('address = "172.31.0.1/24"', 'address = "172.31.0.1/24"\nprefixes = ["172.31.0.0/30"]'),
     "peer[0].overlay: 172.31.0.2/32 overlaps 172.31.0.0/30 of this host (overlay.address / overlay.prefixes)"),
    ("peer-prefix-overlaps-peer", sub('overlay = "172.31.0.2"', 'overlay = "172.31.0.2"\nprefixes = ["10.244.0.0/16"]',
                                      BASE + "\n" + PEER2.replace('overlay = "172.31.0.3"',
                                                                  'overlay = "172.31.0.3"\nprefixes = ["10.244.3.0/24"]')),
     "peer[1].prefixes: 10.244.3.0/24 overlaps 10.244.0.0/16 of peer 'h1'"),
    ("peer-prefix-family", sub('overlay = "172.31.0.2"', 'overlay = "172.31.0.2"\nprefixes = ["fd00:3::/64"]'),
     "peer[0].prefixes: fd00:3::/64 is IPv6 but overlay.address has no IPv6 address (the peer could not "
     "reach this host from it)"),
    ("peer-prefix-not-list", sub('overlay = "172.31.0.2"', 'overlay = "172.31.0.2"\nprefixes = "10.244.3.0/24"'),
     "peer[0].prefixes: must be an array, not '10.244.3.0/24'"),
    ("overlay-address-multicast", sub("172.31.0.1/24", "224.0.0.1/24"),
     "overlay.address: '224.0.0.1/24' cannot be used as a host address"),
    ("overlay-address-int", sub('"172.31.0.1/24"', "17"),
     "overlay.address: must be a string or an array of strings, not 17"),
    ("overlay-device-bad-name", sub('device = "mrc0"', 'device = "mrc 0"'),
     "overlay.device: 'mrc 0' is not a valid interface name"),
    ("overlay-device-too-long", sub('device = "mrc0"', 'device = "mrc0123456789ab"'),
     "overlay.device: 'mrc0123456789ab' is longer than 14 characters"),
    ("rto-min-too-large", sub('device = "mrc0"', 'device = "mrc0"\nrto_min_ms = 5000'),
     "overlay.rto_min_ms: 5000 is out of range 0..1000"),
    ("rto-min-float", sub('device = "mrc0"', 'device = "mrc0"\nrto_min_ms = 2.5'),
     "overlay.rto_min_ms: must be an integer, not 2.5"),
    ("min-rtt-wlen-too-large", sub('device = "mrc0"', 'device = "mrc0"\ntcp_min_rtt_wlen = 100000'),
     "overlay.tcp_min_rtt_wlen: 100000 is out of range 0..86400"),
    ("min-rtt-wlen-word", sub('device = "mrc0"', 'device = "mrc0"\ntcp_min_rtt_wlen = "off"'),
     "overlay.tcp_min_rtt_wlen: 'off' is neither \"keep\" nor a number of seconds"),
    ("mtu-too-small", sub('device = "mrc0"', 'device = "mrc0"\nmtu = 500'),
     "overlay.mtu: 500 is out of range 576..65459"),
    ("mtu-string", sub('device = "mrc0"', 'device = "mrc0"\nmtu = "1400"'),
     "overlay.mtu: must be an integer, not '1400'"),
    ("udp-port-zero", sub('device = "mrc0"', 'device = "mrc0"\nudp_port = 0'),
     "overlay.udp_port: 0 is out of range 1..65535"),
    ("udp-port-too-big", sub('device = "mrc0"', 'device = "mrc0"\nudp_port = 70000'),
     "overlay.udp_port: 70000 is out of range 1..65535"),
    ("no-planes", OVERLAY + PEER, "plane: at least one [[plane]] is required"),
    ("planes-empty", "plane = []\n" + OVERLAY + PEER, "plane: at least one [[plane]] is required"),
    ("plane-not-array", 'plane = "p0h1"\n' + OVERLAY + PEER, "plane: must be an array, not 'p0h1'"),
    ("seventeen-planes", OVERLAY + SEVENTEEN + PEER, "plane: 17 planes, at most 16 are supported"),
    ("plane-no-device", sub('device = "p1h1"', "weight = 2"), "plane[1].device: missing"),
    ("plane-unknown-key", sub('device = "p1h1"', 'device = "p1h1"\nwieght = 2'),
     "plane[1].wieght: unknown key (did you mean 'weight'?)"),
    ("duplicate-plane", sub('device = "p1h1"', 'device = "p0h1"'), "plane[1].device: duplicate plane 'p0h1'"),
    ("plane-is-overlay", sub('device = "p1h1"', 'device = "mrc0"'),
     "plane[1].device: 'mrc0' is the overlay device"),
    ("plane-weight-negative", sub('device = "p1h1"', 'device = "p1h1"\nweight = -1'),
     "plane[1].weight: -1 is out of range 0..1000"),
    ("plane-weight-bool", sub('device = "p1h1"', 'device = "p1h1"\nweight = true'),
     "plane[1].weight: must be an integer, not True"),
    ("plane-weight-float", sub('device = "p1h1"', 'device = "p1h1"\nweight = 1.5'),
     "plane[1].weight: must be an integer, not 1.5"),
    ("plane-rx-hook-unknown", sub('device = "p1h1"', 'device = "p1h1"\nrx_hook = "skb"'),
     "plane[1].rx_hook: 'skb' is not one of auto, xdp, tc"),
    ("plane-rx-hook-not-string", sub('device = "p0h1"', 'device = "p0h1"\nrx_hook = 1'),
     "plane[0].rx_hook: must be a string, not 1"),
    ("all-weights-zero", sub('device = "p1h1"', 'device = "p1h1"\nweight = 0',
                             sub('device = "p0h1"', 'device = "p0h1"\nweight = 0')),
     "plane: every plane has weight 0, nothing could be sent"),
    ("plane-address-bad", sub('device = "p1h1"', 'device = "p1h1"\naddress = "10.201.0.300"'),
     "plane[1].address: '10.201.0.300' is not an IP address"),
    ("no-peers", OVERLAY + PLANES, "peer: at least one [[peer]] is required"),
    ("peer-no-name", sub('name = "h1"\n', ""), "peer[0].name: missing"),
    ("peer-bad-name", sub('name = "h1"', 'name = "h 1"'),
     "peer[0].name: 'h 1' is not a valid peer name (letters, digits, _ . -)"),
    ("peer-duplicate-name", BASE + "\n" + PEER2.replace('"h2"', '"h1"'), "peer[1].name: duplicate peer 'h1'"),
    ("peer-no-overlay", sub('overlay = "172.31.0.2"\n', ""), "peer[0].overlay: missing"),
    ("peer-overlay-ipv6", sub('overlay = "172.31.0.2"', 'overlay = "fd31::2"'),
     "peer[0].overlay: fd31::2 is IPv6 but overlay.address has no IPv6 address"),
    ("peer-overlay-is-own", sub('overlay = "172.31.0.2"', 'overlay = "172.31.0.1"'),
     "peer[0].overlay: 172.31.0.1 is this host's own overlay address"),
    ("peer-duplicate-overlay", BASE + "\n" + PEER2.replace("172.31.0.3", "172.31.0.2"),
     "peer[1].overlay: 172.31.0.2 is already used by another peer"),
    ("evs-zero", sub("evs_per_plane = 4", "evs_per_plane = 0"),
     "peer[0].evs_per_plane: 0 is out of range 1..256"),
    ("evs-too-many", sub("evs_per_plane = 4", "evs_per_plane = 257"),
     "peer[0].evs_per_plane: 257 is out of range 1..256"),
    ("too-many-paths", sub("evs_per_plane = 4", "evs_per_plane = 200"),
     "peer[0].evs_per_plane: 200 EVs x 2 planes = 400 paths, at most 256"),
    ("evs-string", sub("evs_per_plane = 4", 'evs_per_plane = "4"'),
     "peer[0].evs_per_plane: must be an integer, not '4'"),
    ("ev-base-low", sub("evs_per_plane = 4", "evs_per_plane = 4\nev_base = 80"),
     "peer[0].ev_base: 80 is out of range 1024..65535"),
    ("ev-base-overflow", sub("evs_per_plane = 4", "evs_per_plane = 4\nev_base = 65530"),
     "peer[0].ev_base: 65530 + 8 paths runs past port 65535"),
    ("ev-range-holds-udp-port", sub("evs_per_plane = 4", "evs_per_plane = 4\nev_base = 4790"),
     "peer[0].ev_base: EVs 4790..4797 include the MRC UDP port 4794"),
    ("spray-unknown", sub("evs_per_plane = 4", 'evs_per_plane = 4\nspray = "roundrobin"'),
     "peer[0].spray: 'roundrobin' is not one of weighted, flowlet, hash"),
    ("min-active-too-big", sub("evs_per_plane = 4", "evs_per_plane = 4\nmin_active = 9"),
     "peer[0].min_active: 9 is out of range 0..8"),
    ("no-underlay", PEER.split("[peer.underlay]")[0].join([OVERLAY + "\n" + PLANES + "\n", ""]),
     "peer[0].underlay: missing (plane device -> the peer's address on it)"),
    ("underlay-empty", OVERLAY + "\n" + PLANES + "\n" + PEER.split("p0h1 =")[0],
     "peer[0].underlay: empty, the peer needs an address on at least one plane"),
    ("underlay-unknown-plane", sub('p1h1 = "10.201.0.2"', 'p1h2 = "10.201.0.2"'),
     "peer[0].underlay.p1h2: no such plane in this config (did you mean 'p1h1'?)"),
    ("underlay-bad-address", sub("10.201.0.2", "10.201.0.256"),
     "peer[0].underlay.p1h1: '10.201.0.256' is not an IP address"),
    ("underlay-loopback", sub("10.201.0.2", "127.0.0.1"),
     "peer[0].underlay.p1h1: 127.0.0.1 cannot be a peer address"),
    ("underlay-in-overlay-subnet", sub("10.201.0.2", "172.31.0.9"),
     "peer[0].underlay.p1h1: 172.31.0.9 lies inside the overlay subnet 172.31.0.0/24"),
    ("underlay-family-vs-plane-address",
     sub('device = "p1h1"', 'device = "p1h1"\naddress = "10.201.0.1"', sub("10.201.0.2", "fd00:1::2")),
     "peer[0].underlay.p1h1: fd00:1::2 is IPv6 but plane 'p1h1' has an IPv4 address"),
    ("underlay-shared-by-two-peers", BASE + "\n" + PEER2.replace("10.201.0.3", "10.201.0.2"),
     "peer[1].underlay.p1h1: 10.201.0.2 is already peer 'h1''s address on plane 'p1h1'"),
    ("health-out-of-range", BASE + "\n[health]\ndead_after_ms = 0\n",
     "health.dead_after_ms: 0 is out of range 0.5..60000"),
    ("health-bad-type", BASE + "\n[health]\nliveness = \"yes\"\n",
     "health.liveness: must be true or false, not 'yes'"),
]

# Valid files whose problem only shows against the machine (loader.preflight).
RUNTIME = [
    ("plane-missing", sub('device = "p1h1"', 'device = "p9h1"', sub("p1h1 = ", "p9h1 = ")),
     "plane p9h1: no such interface in this network namespace"),
    ("plane-without-address", sub('device = "p1h1"', 'device = "bare0"', sub("p1h1 = ", "bare0 = ")),
     "plane bare0: has no IPv4 address for peer h1 (10.201.0.2); add one or set plane.address"),
    ("overlay-overlaps-plane-subnet", sub("172.31.0.1/24", "10.200.0.129/25"),
     "overlay.address: 10.200.0.129/25 overlaps the subnet 10.200.0.0/24 of plane p0h1"),
    ("mtu-cannot-fit", sub('device = "mrc0"', 'device = "mrc0"\nmtu = 1460'),
     "overlay.mtu: 1460 + 56 bytes of encapsulation exceeds the smallest plane MTU 1500"),
    ("plane-mtu-too-small", sub('device = "p1h1"', 'device = "tiny0"', sub("p1h1 = ", "tiny0 = ")),
     "overlay.mtu: plane MTU 600 leaves only 544 bytes for the overlay (at least 576 needed)"),
    ("overlay-device-foreign", sub('device = "mrc0"', 'device = "busy0"'),
     "overlay.device: busy0 already exists and is not managed by mrc"),
]

# (id, argv after `mrcctl`, exact message after "mrcctl: error: "); CFG is
# replaced by the path of a valid config.
ARGS = [
    ("no-config-option", ["up"], "Missing option '-c' / '--config'. (see `mrcctl up --help`)"),
    ("config-missing-file", ["up", "-c", "/nonexistent/mrc.toml"], "/nonexistent/mrc.toml: no such file"),
    ("config-is-directory", ["status", "-c", "/"],
     "Invalid value for '-c' / '--config': File '/' is a directory. (see `mrcctl status --help`)"),
    ("unknown-command", ["upp"], "No such command 'upp'. Did you mean 'up'? (see `mrcctl --help`)"),
    ("unknown-option", ["up", "-c", "CFG", "--force"], "No such option '--force'. (see `mrcctl up --help`)"),
    ("extra-argument", ["down", "-c", "CFG", "now"], "Got unexpected extra argument (now) (see `mrcctl down --help`)"),
    ("agent-duration-not-number", ["agent", "-c", "CFG", "--duration", "soon"],
     "Invalid value for '--duration': 'soon' is not a valid float. (see `mrcctl agent --help`)"),
    ("config-option-without-value", ["down", "-c"],
     "Option '-c' requires an argument. (see `mrcctl --help`)"),
]


@pytest.fixture(scope="module")
def netns(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    tb = Testbed(hosts=2, planes=2, prefix=PREFIX)
    tb.up()
    try:
        for cmd in (["ip", "link", "add", "bare0", "type", "veth", "peer", "name", "bare0p"],
                    ["ip", "link", "add", "tiny0", "mtu", "600", "type", "veth", "peer", "name", "tiny0p"],
                    ["ip", "addr", "add", "10.250.0.1/24", "dev", "tiny0"],
                    ["ip", "link", "add", "busy0", "type", "veth", "peer", "name", "busy0p"]):
            tb.exec(0, cmd)
        empty = tmp_path_factory.mktemp("no-bpf")
        yield tb, empty
    finally:
        tb.down()


def snapshot(tb: Testbed) -> dict:
    def j(*cmd):
        return json.loads(tb.exec(0, ["ip", "-j", *cmd]).stdout or "[]")
    links = j("-d", "link", "show")
    for link in links:
        link.pop("operstate", None)       # veth carrier settles by itself
    inode = os.stat(f"/run/netns/{NS}").st_ino
    inst = Path("/run/mrc/instances")
    return {"links": links, "addrs": j("addr", "show"), "routes": j("route", "show", "table", "all"),
            "rp_filter": {d: tb.exec(0, ["sysctl", "-n", f"net.ipv4.conf.{d}.rp_filter"]).stdout
                          for d in ("p0h1", "p1h1", "all")},
            "tcp_min_rtt_wlen": tb.exec(0, ["sysctl", "-n", "net.ipv4.tcp_min_rtt_wlen"]).stdout,
            "instances": sorted(p.name for p in inst.glob(f"ns{inode}-*")) if inst.exists() else []}


def run_mrcctl(tb: Testbed, empty: Path, argv: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, MRC_BPF_DIR=str(empty))
    env.pop("MRC_DEBUG", None)
    return subprocess.run(["ip", "netns", "exec", NS, sys.executable, "-m", "mrcctl", *argv],
                          capture_output=True, text=True, timeout=60, env=env, cwd=REPO)


def check_refused(tb, empty, argv, message):
    before = snapshot(tb)
    cp = run_mrcctl(tb, empty, argv)
    assert cp.stderr == f"mrcctl: error: {message}\n", cp.stderr
    assert cp.returncode == 2
    assert cp.stdout == ""
    assert snapshot(tb) == before


def test_table_is_big_enough():
    assert len(CONFIGS) + len(RUNTIME) + len(ARGS) >= 30
    ids = [c[0] for c in CONFIGS + RUNTIME + ARGS]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("name,text,message", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_invalid_config(netns, tmp_path, name, text, message):
    tb, empty = netns
    path = tmp_path / f"{name}.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    # `up` is the command that would change the system; `status`/`down` must
    # refuse the same file with the same words.
    check_refused(tb, empty, ["up", "-c", str(path)], f"{path}: {message}")
    if name in ("duplicate-plane", "evs-too-many", "unknown-top-key"):
        for cmd in ("down", "status"):
            check_refused(tb, empty, [cmd, "-c", str(path)], f"{path}: {message}")


@pytest.mark.parametrize("name,text,message", RUNTIME, ids=[c[0] for c in RUNTIME])
def test_invalid_for_this_machine(netns, tmp_path, name, text, message):
    tb, empty = netns
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    check_refused(tb, empty, ["up", "-c", str(path)], message)


@pytest.mark.parametrize("name,argv,message", ARGS, ids=[c[0] for c in ARGS])
def test_invalid_arguments(netns, tmp_path, name, argv, message):
    tb, empty = netns
    cfg = tmp_path / "ok.toml"
    cfg.write_text(BASE)
    check_refused(tb, empty, [str(cfg) if a == "CFG" else a for a in argv], message)


def test_base_config_is_valid(netns, tmp_path):
    """The cases above fail because of their one change, not because the
    base file is broken: the base file gets past validation and preflight
    (and then stops at the missing BPF objects, exit 1)."""
    tb, empty = netns
    cfg = tmp_path / "ok.toml"
    cfg.write_text(BASE)
    cp = run_mrcctl(tb, empty, ["up", "-c", str(cfg)])
    assert cp.returncode == 1
    assert cp.stderr == f"mrcctl: error: BPF object {empty}/tx.bpf.o is missing: build it with " \
                        f"`make -C {empty}`\n"
    assert snapshot(tb)["instances"] == []
