"""bpf/mrc.h and mrcctl/datapath/abi.py agree: every constant, struct size, field
offset and field size, checked by compiling a C program against mrc.h."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import struct

import pytest

from unit_dp import BPF_DIR
from mrcctl.datapath import abi as wire, libbpf
from mrcctl.instance.slots import build_slot_table

MRC_H = BPF_DIR / "mrc.h"


def _c_program() -> str:
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "mrc.h"',
             "int main(void) {"]
    for s in wire.ALL_STRUCTS:
        c = f"struct {s.C_NAME}"
        lines.append(f'printf("size {s.C_NAME} %zu\\n", sizeof({c}));')
        for name, _fmt in s.LAYOUT:
            lines.append(f'printf("off {s.C_NAME}.{name} %zu\\n", offsetof({c}, {name}));')
            lines.append(f'printf("fsize {s.C_NAME}.{name} %zu\\n", sizeof((({c} *)0)->{name}));')
    for name in wire.c_constants():
        lines.append(f'printf("const {name} %lld\\n", (long long)({name}));')
    lines.append("return 0; }")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def c_facts(tmp_path_factory):
    gcc = shutil.which("gcc") or shutil.which("cc")
    if not gcc:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("wire")
    src = d / "facts.c"
    src.write_text(_c_program())
    exe = d / "facts"
    r = subprocess.run([gcc, "-Wall", "-Werror", f"-I{BPF_DIR}", str(src), "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"compiling against mrc.h failed:\n{r.stderr}"
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    facts: dict[str, int] = {}
    for line in out.splitlines():
        kind, key, val = line.split()
        facts[f"{kind} {key}"] = int(val)
    return facts


@pytest.mark.parametrize("s", wire.ALL_STRUCTS, ids=lambda s: s.C_NAME)
def test_struct_layout(c_facts, s):
    assert c_facts[f"size {s.C_NAME}"] == s.size()
    offs = s.offsets()
    for name, fmt in s.LAYOUT:
        assert c_facts[f"off {s.C_NAME}.{name}"] == offs[name], name
        assert c_facts[f"fsize {s.C_NAME}.{name}"] == struct.calcsize("=" + fmt), name


def test_constants(c_facts):
    for name, val in wire.c_constants().items():
        assert c_facts[f"const {name}"] == val, name
    # MRC_PATH_IDX (bpf/sizing.h) is peer << path_shift | path
    assert wire.DEFAULT_SIZING.path_idx(3, 5) == 3 * wire.MRC_MAX_PATHS + 5
    assert wire.Sizing.of(4096, 24).path_idx(4095, 23) == 4095 * 32 + 23


def test_every_mrc_h_constant_is_mirrored():
    text = MRC_H.read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    defines = set(re.findall(r"^#define\s+(MRC_\w+)\s+\S", text, flags=re.M))
    defines -= {"MRC_H"}
    defines = {d for d in defines if not re.search(rf"#define\s+{d}\(", text)}
    enums = set(re.findall(r"^\s*(MRC_\w+)\s*=", text, flags=re.M))
    assert defines | enums == set(wire.c_constants())


def test_every_mrc_h_struct_is_mirrored():
    text = MRC_H.read_text()
    structs = set(re.findall(r"^struct\s+(\w+)\s*\{", text, flags=re.M))
    assert structs == {s.C_NAME for s in wire.ALL_STRUCTS}


def test_reason_labels():
    labels = [r.label for r in wire.Reason]
    assert labels[0] == "rx_truncated"
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", lab) for lab in labels)
    assert len(wire.Reason) == wire.MRC_R_MAX
    assert wire.Reason.RX_TRUNCATED.is_drop and not wire.Reason.RX_PROBE_REPLY.is_drop


def _enum_members(text: str, enum: str) -> dict[str, str]:
    """MRC_* member -> its comment, of one enum in mrc.h."""
    body = re.search(rf"enum {enum} \{{(.*?)\}};", text, flags=re.S).group(1)
    return {m.group(1): m.group(2) or "" for m in
            re.finditer(r"^[ \t]*(MRC_\w+)[ \t]*=[ \t]*\d+,?[ \t]*(?:/\*(.*?)\*/)?", body, flags=re.M)}


def test_drop_split_is_mrc_h_s():
    """Reason.is_drop is false exactly for the verdicts mrc.h marks "not a drop"."""
    members = _enum_members(MRC_H.read_text(), "mrc_reason")
    not_drops = {name for name, comment in members.items() if "not a drop" in comment}
    assert not_drops == {f"MRC_R_{r.name}" for r in wire.Reason if not r.is_drop}
    assert wire.reason_is_drop("rx_unknown_peer") and not wire.reason_is_drop("rx_pass_vlan")


def test_names_come_from_the_mirror():
    """Path states, spray modes and reasons are the mirror's enums wherever
    mrcctl names them: a new member of an mrc.h enum needs the mirror (and
    the operator guide), no other edit."""
    from mrcctl.cli.path import spray
    from mrcctl.instance import config
    from mrcctl.observe import exporter

    modes = [m.label for m in wire.SprayMode]
    assert list(config.SPRAY_MODES) == modes
    choice = next(p for p in spray.params if p.name == "mode").type
    assert list(choice.choices) == modes
    assert all(m in spray.help for m in modes)
    assert list(exporter.STATES) == [s.name for s in wire.PathState]
    schema = json.loads((BPF_DIR.parent / "docs" / "status.schema.json").read_text())
    assert schema["$defs"]["state"]["enum"] == [s.name for s in wire.PathState] + ["UNKNOWN"]
    guide = (BPF_DIR.parent / "docs" / "operator-guide.md").read_text()
    assert all(f"`{m}`" in guide for m in modes)


def test_roundtrips():
    vals = [
        wire.MrcHdr(ver_type=0x12, flags=1, path_id=300, psn=2**32 - 1, tx_ts=5, segs=44,
                    seg_size=1448, seq0=123, fb_path=7, epoch=0xbeef, fb_ts=9),
        wire.Config(udp_port=4794, overlay_ifindex=5, dead_after_us=2000, flags=1),
        wire.Peer(n_paths=8, table=1, spray_mode=2, min_active=2, overlay="10.0.0.9",
                  ev_base=50000),
        wire.Slots.of([0, 1, 255, 3]),
        wire.Path(ifindex=9, ev=65535, family=6, plane=15, smac="02:aa:bb:cc:dd:ee",
                  dmac="02:11:22:33:44:55", saddr="2001:db8::1", daddr="2001:db8::2",
                  weight=3),
        wire.Path(ifindex=9, ev=1, family=4, saddr="192.0.2.1", daddr="192.0.2.2"),
        wire.PathLive(last_ack_ns=2**63, last_rx_ns=1, last_rx_ts=2, state=1, srtt_us=3,
                      rtt_us=4),
        wire.PeerSeq(psn=1, cursor=2, fb_cursor=3, rx_psn_max=4),
        wire.PathStats(*range(4)),
        wire.PathCnt(*range(7)),
        wire.RxKey(ifindex=3, family=6, addr="fe80::1"),
        wire.RxKey(ifindex=3, family=4, addr="192.0.2.7"),
        wire.RxPeer(peer=5, plane=2),
    ]
    for v in vals:
        b = v.pack()
        assert len(b) == type(v).size()
        assert type(v).unpack(b) == v


def test_mrc_hdr_encoding():
    b = wire.encode_mrc_hdr(wire.MsgType.PROBE, flags=wire.MRC_F_FEEDBACK, path_id=0x0102,
                            psn=0x03040506, tx_ts=0x0708090A, segs=2, seg_size=0x0B0C,
                            seq0=0x0D0E0F10, path_seq=0x11, fb_path=0x12, fb_ts=0x13141516)
    assert b == bytes.fromhex("1101" "0102" "03040506" "0708090a" "0002" "0b0c" "0d0e0f10"
                              "1112" "0000" "13141516")
    h = wire.decode_mrc_hdr(b)
    assert h.version == 1 and h.type == wire.MsgType.PROBE


def test_rx_key_ipv4_layout():
    b = wire.RxKey(ifindex=2, family=4, addr="192.0.2.1").pack()
    assert b[8:12] == bytes([192, 0, 2, 1]) and b[12:] == bytes(12)


def test_build_slot_table():
    t = build_slot_table([3, 1, 1, 1], 12)
    assert [t.count(i) for i in range(4)] == [6, 2, 2, 2]
    assert all(t[i] != t[i + 1] or t[i] == 0 for i in range(len(t) - 1))
    t = build_slot_table([3, 1, 1, 1])
    assert len(t) == wire.MRC_SLOTS
    for i, w in enumerate([3, 1, 1, 1]):
        assert abs(t.count(i) - wire.MRC_SLOTS * w / 6) <= 1
    assert build_slot_table([0, 5], 4) == [1, 1, 1, 1]
    with pytest.raises(ValueError):
        build_slot_table([0, 0])
    # interleaving: no path twice in a row when weights are equal
    t = build_slot_table([1] * 8, 64)
    assert t[:8] == list(range(8))


def test_percpu_sum():
    a = wire.PathStats(tx_packets=1, rx_bytes=10).pack()
    b = wire.PathStats(tx_packets=2, rx_packets=1).pack()
    s = wire.PathStats.sum([a, b])
    assert (s.tx_packets, s.rx_bytes, s.rx_packets) == (3, 10, 1)
    assert wire.sum_percpu_u64([wire.u64(3), wire.u64(4)]) == 7


# --- the maps in the compiled objects have the layouts wire.py packs ------

MAP_LAYOUT = {
    "mrc_cfg": (libbpf.BPF_MAP_TYPE_ARRAY, 4, wire.Config, 1),
    "mrc_peers": (libbpf.BPF_MAP_TYPE_ARRAY, 4, wire.Peer, wire.MRC_DEFAULT_PEERS),
    "mrc_slots": (libbpf.BPF_MAP_TYPE_ARRAY, 4, wire.Slots, wire.MRC_DEFAULT_PEERS * 2),
    "mrc_paths": (libbpf.BPF_MAP_TYPE_ARRAY, 4, wire.Path, wire.DEFAULT_SIZING.path_entries),
    "mrc_live": (libbpf.BPF_MAP_TYPE_ARRAY, 4, wire.PathLive, wire.DEFAULT_SIZING.path_entries),
    "mrc_peer_seq": (libbpf.BPF_MAP_TYPE_ARRAY, 4, wire.PeerSeq, wire.MRC_DEFAULT_PEERS),
    "mrc_path_stats": (libbpf.BPF_MAP_TYPE_PERCPU_ARRAY, 4, wire.PathStats,
                       wire.DEFAULT_SIZING.path_entries),
    "mrc_drops": (libbpf.BPF_MAP_TYPE_PERCPU_ARRAY, 4, 8, wire.MRC_R_MAX),
    "mrc_peer_ip": (libbpf.BPF_MAP_TYPE_LPM_TRIE, wire.OvlKey.size(), 4, wire.MRC_DEFAULT_PEERS * wire.MRC_OVL_PER_PEER),
    "mrc_rx_peers": (libbpf.BPF_MAP_TYPE_HASH, wire.RxKey.size(), wire.RxPeer,
                     wire.MRC_DEFAULT_PEERS * wire.MRC_MAX_PLANES),
    "mrc_events": (libbpf.BPF_MAP_TYPE_RINGBUF, 0, 0, 256 * 1024),
    "mrc_ovl_owner": (libbpf.BPF_MAP_TYPE_LPM_TRIE, wire.OvlKey.size(), 4,
                      (wire.MRC_DEFAULT_PEERS + 1) * wire.MRC_OVL_PER_PEER),
    "mrc_probe_nonce": (libbpf.BPF_MAP_TYPE_HASH, 4, wire.ProbeNonce, wire.DEFAULT_SIZING.path_entries),
    "mrc_probe_rl": (libbpf.BPF_MAP_TYPE_ARRAY, 4, 8, wire.MRC_DEFAULT_PEERS * wire.MRC_MAX_PLANES),
}


def test_map_layouts(dp):
    for name, (mtype, ksize, val, maxe) in MAP_LAYOUT.items():
        m = dp.maps[name]
        vsize = val if isinstance(val, int) else val.size()
        assert (m.map_type, m.key_size, m.value_size, m.max_entries) == (
            mtype, ksize, vsize, maxe), name


def test_the_loaders_sizes_are_the_compiled_ones_at_the_default(dp):
    """objects.map_entries (what the loader sizes maps to) agrees with the
    sizes bpf/*.h compile in, at the default sizing: the one formula."""
    from mrcctl.datapath.objects import map_entries
    want = map_entries(wire.DEFAULT_SIZING)
    assert set(want) <= set(dp.maps)
    for name, n in want.items():
        assert dp.maps[name].max_entries == n, name


def test_path_counters_are_the_two_structs_in_order():
    names = [f.name for f in dataclasses.fields(wire.PathCounters)]
    assert names == [n for n, _ in wire.PathStats.LAYOUT] + [n for n, _ in wire.PathCnt.LAYOUT]
    hot = [wire.PathStats(tx_packets=1, rx_bytes=7).pack(), wire.PathStats(tx_packets=2).pack()]
    c = wire.PathCounters.of(hot, wire.PathCnt(rx_ooo=5, rx_ce=9).pack())
    assert (c.tx_packets, c.rx_bytes, c.rx_ooo, c.rx_ce, c.rx_dup) == (3, 7, 5, 9, 0)
    assert wire.PathCounters.of([], None) == wire.PathCounters()
