"""mrcctl.datapath.libbpf: the ctypes layer itself (pins, map ops, errors, ring buffer)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from unit_dp import BPF_DIR, XDP_PASS, need_root
from mrcctl.datapath import abi as wire, libbpf

RINGBUF_PROG = r"""
#include "maps.h"
/* test helper: XDP program that copies the first 8 bytes of each frame
 * into mrc_events (shared with the datapath by pin name) */
SEC("xdp")
int ev_out(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u64 v;

	if (data + 8 > data_end)
		return XDP_ABORTED;
	__builtin_memcpy(&v, data, 8);	/* helpers may not read packets */
	bpf_ringbuf_output(&mrc_events, &v, 8, 0);
	return XDP_PASS;
}
char _license[] SEC("license") = "GPL";
"""

BAD_PROG = r"""
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
SEC("xdp")
int bad(struct xdp_md *ctx)
{
	/* no bounds check: the verifier must refuse this */
	return *(unsigned char *)(long)ctx->data;
}
char _license[] SEC("license") = "GPL";
"""


def _compile(tmp_path, name: str, src: str) -> str:
    c = tmp_path / f"{name}.bpf.c"
    c.write_text(src)
    o = tmp_path / f"{name}.bpf.o"
    multiarch = subprocess.run(["gcc", "-dumpmachine"], capture_output=True,
                               text=True).stdout.strip()
    r = subprocess.run(["clang", "-O2", "-g", "-target", "bpf", "-mcpu=v3",
                        f"-I/usr/include/{multiarch}", f"-I{BPF_DIR}", "-c", str(c), "-o", str(o)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return str(o)


def test_num_possible_cpus():
    assert libbpf.num_possible_cpus() >= os.cpu_count() >= 1


def test_map_from_pin_and_ops(dp):
    libbpf.obj_pin(dp.maps["mrc_rx_peers"].fd, str(dp.pin_root / "mrc_rx_peers"))
    m = libbpf.Map.from_pin(str(dp.pin_root / "mrc_rx_peers"))

    def key(addr):
        return wire.RxKey(ifindex=1, family=4, addr=addr).pack()
    try:
        assert m.name == "mrc_rx_peers" and m.key_size == wire.RxKey.size() and m.value_size == 8
        assert m.id == dp.maps["mrc_rx_peers"].id
        m.update(key("10.99.0.2"), wire.RxPeer(peer=2).pack())
        assert m.lookup(key("10.99.0.2")) == wire.RxPeer(peer=2).pack()
        assert m.lookup(key("10.99.0.3")) is None
        m.update(key("10.99.0.3"), wire.RxPeer(peer=5).pack())
        assert {key("10.99.0.2"), key("10.99.0.3")} <= set(m.keys())
        with pytest.raises(libbpf.LibbpfError) as ei:
            m.update(key("10.99.0.3"), wire.RxPeer(peer=6).pack(), libbpf.BPF_NOEXIST)
        assert ei.value.errno == 17 and "bpf_map_update_elem(mrc_rx_peers)" in str(ei.value)
        assert m.delete(key("10.99.0.3")) is True
        assert m.delete(key("10.99.0.3")) is False
        with pytest.raises(ValueError):
            m.lookup(b"\0" * 3)
    finally:
        m.close()
    assert m.fd == -1


def test_percpu_map(dp):
    m = dp.maps["mrc_drops"]
    n = libbpf.num_possible_cpus()
    assert m.percpu
    key = wire.u32(int(wire.Reason.RX_BAD_TYPE))
    m.update(key, wire.u64(3))                        # one value: every CPU
    assert m.lookup_percpu(key) == [wire.u64(3)] * n
    assert len(m.lookup(key)) == 8 * n
    m.update(key, b"".join(wire.u64(i) for i in range(n)))
    assert wire.sum_percpu_u64(m.lookup_percpu(key)) == sum(range(n))
    # values of a per-CPU struct: rounded up to 8 bytes per CPU (a multiple already)
    st = dp.maps["mrc_path_stats"]
    assert wire.PathStats.size() % 8 == 0
    assert len(st.lookup(wire.u32(0))) == wire.PathStats.size() * n


def test_array_keys(dp):
    assert len(dp.maps["mrc_peers"].keys()) == wire.MRC_DEFAULT_PEERS


def test_program_pin_and_info(dp):
    path = str(dp.pin_root / "prog_rx")
    dp.rx.pin(path)
    p = libbpf.Program.from_pin(path)
    try:
        assert p.id == dp.rx.id and p.name == "mrc_rx"
        info = libbpf.prog_info(p.fd)
        assert info["type"] == 6  # BPF_PROG_TYPE_XDP
        assert info["name"] == "mrc_rx" and len(info["tag"]) == 16
        ret, out, dur = p.test_run(b"\xff" * 6 + b"\x02" * 6 + b"\x08\x06" + bytes(28))
        assert ret == XDP_PASS and len(out) == 42
    finally:
        p.close()
        os.unlink(path)
    assert libbpf.map_info(dp.maps["mrc_cfg"].fd)["name"] == "mrc_cfg"


# About twice what each program verifies in (2026-12-03: mrc_tx 60k, mrc_rx
# 28k, mrc_rx_tc 37k): a change that undoes one of the cuts at global
# functions (docs/developing-datapath.md, "The verifier's budget") fails
# here, with the count, long before the kernel's 1M refuses it. The count
# is also time on the way to the first packet at `up`.
VERIFIER_BUDGET = {"mrc_tx": 120_000, "mrc_rx": 60_000, "mrc_rx_tc": 75_000}


def test_programs_verify_well_inside_the_kernel_limit(dp):
    for prog in (dp.tx, dp.rx, dp.rx_tc):
        n = libbpf.prog_info(prog.fd)["verified_insns"]
        assert 0 < n <= VERIFIER_BUDGET[prog.name], (prog.name, n)


def test_obj_get_missing_raises():
    need_root()     # unprivileged bpf() says EPERM first
    with pytest.raises(libbpf.LibbpfError) as ei:
        libbpf.obj_get("/run/mrc-test/definitely-not-there")
    assert ei.value.errno == 2 and "bpf_obj_get" in str(ei.value)


def test_load_failure_quotes_verifier(bpf_objects, tmp_path):
    o = _compile(tmp_path, "bad", BAD_PROG)
    obj = libbpf.BpfObject.open(o)
    try:
        with pytest.raises(libbpf.LibbpfError) as ei:
            obj.load()
        msg = str(ei.value)
        assert "bpf_object__load" in msg
        assert "invalid access to packet" in msg or "R" in msg and "invalid" in msg, msg
    finally:
        obj.close()


def test_open_missing_file():
    with pytest.raises(libbpf.LibbpfError) as ei:
        libbpf.BpfObject.open("/nonexistent/x.bpf.o")
    assert ei.value.errno == 2


def test_test_run_grows_output_buffer(dp):
    frame = b"\xff" * 6 + b"\x02" * 6 + b"\x08\x06" + bytes(28)
    ret, out, _ = dp.rx.test_run(frame, out_size=8)
    assert ret == XDP_PASS and out == frame


def test_ring_buffer(dp, tmp_path):
    o = _compile(tmp_path, "ev", RINGBUF_PROG)
    obj = libbpf.BpfObject.open(o)
    try:
        obj.reuse_map("mrc_events", dp.maps["mrc_events"].fd)
        obj.load()
        assert obj.map("mrc_events").id == dp.maps["mrc_events"].id  # shared by reuse_fd
        prog = obj.program("ev_out")
        got = []
        with libbpf.RingBuffer(dp.maps["mrc_events"], got.append) as rb:
            assert rb.poll(0) == 0
            for i in range(3):
                prog.test_run(bytes([i]) * 8 + bytes(60))
            assert rb.poll(100) == 3
            assert got == [bytes([i]) * 8 for i in range(3)]

            def boom(_data):
                raise RuntimeError("callback failed")
            rb._callback = boom
            prog.test_run(b"\x09" * 68)
            with pytest.raises(RuntimeError):
                rb.consume()
    finally:
        obj.close()


def test_recent_log_is_captured(bpf_objects, tmp_path):
    o = _compile(tmp_path, "bad2", BAD_PROG)
    obj = libbpf.BpfObject.open(o)
    try:
        with pytest.raises(libbpf.LibbpfError):
            obj.load()
    finally:
        obj.close()
    assert any("bad" in line for line in libbpf.recent_log(200))


def test_map_and_program_from_id(dp):
    with libbpf.Map.from_id(dp.maps["mrc_live"].id) as m:
        assert m.name == "mrc_live" and m.fd != dp.maps["mrc_live"].fd
    with libbpf.Program.from_id(dp.rx.id) as p:
        assert p.name == "mrc_rx"
    with pytest.raises(libbpf.LibbpfError):
        libbpf.Map.from_id(0x7FFFFFF0)


def test_attach_detach(dp, veth):
    """The product's attach path (pyroute2) on a throwaway veth: native XDP
    and the tc egress filter, their ids read back, then removed."""
    from mrcctl.instance.topology import Netlink
    from mrcctl.datapath.libbpf import TC_INGRESS, tc_query
    with Netlink() as nl:
        dev = nl.ipr.link("get", index=veth)[0].get("ifname")
        try:
            nl.attach_xdp(dev, dp.rx.fd)
            assert nl.xdp_prog_id(dev) == dp.rx.id
            nl.detach_xdp(dev)
            assert nl.xdp_prog_id(dev) == 0

            nl.attach_tc_egress(dev, dp.tx.fd, "mrc_tx")
            assert nl.tc_egress_prog_id(dev) == dp.tx.id
            assert tc_query(veth, TC_INGRESS) == 0
            nl.attach_tc_egress(dev, dp.tx.fd, "mrc_tx")      # replace is fine
            assert nl.tc_egress_prog_id(dev) == dp.tx.id
        finally:
            nl.detach_tc(dev)
        assert nl.tc_egress_prog_id(dev) == 0
        nl.detach_tc(dev)                                    # idempotent



def test_reload_reuses_maps_unless_their_layout_changed(bpf_objects):
    """An upgrade in place keeps the running maps (states, PSNs, counters)
    whose layout the new objects still declare, and replaces one whose
    layout changed instead of failing to load (libbpf would adopt the old
    sizes and the verifier refuse the programs)."""
    from mrcctl.datapath.objects import load_objects
    with load_objects() as first:
        # stand-in for a map of an older release: same name, another layout
        old_seq = libbpf.Map.from_id(first.maps["mrc_peers"].id)
        old_seq.name = "mrc_peer_seq"
        reuse = {"mrc_cfg": libbpf.Map.from_id(first.maps["mrc_cfg"].id), "mrc_peer_seq": old_seq}
        old_ids = {n: m.id for n, m in reuse.items()}
        with load_objects(reuse) as second:
            assert second.maps["mrc_cfg"].id == old_ids["mrc_cfg"]
            assert second.maps["mrc_peer_seq"].id != old_ids["mrc_peer_seq"]
            assert second.maps["mrc_peer_seq"].value_size == wire.PeerSeq.size()


def test_lookup_range_reads_a_slice_in_one_call(dp):
    m = dp.maps["mrc_live"]
    n = m.max_entries
    for i in (0, 5, 6, 7, n - 2, n - 1):
        m.update(wire.u32(i), bytes([i & 0xFF]) * m.value_size)
    got = m.lookup_range(5, 3)
    assert [v[0] for v in got] == [5, 6, 7] and all(len(v) == m.value_size for v in got)
    assert [v[0] for v in m.lookup_range(0, 1)] == [0]
    tail = m.lookup_range(n - 2, 10)                 # clipped at the map's end
    assert [v[0] for v in tail] == [(n - 2) & 0xFF, (n - 1) & 0xFF]
    assert m.lookup_range(n, 4) == []
    with pytest.raises(ValueError):
        dp.maps["mrc_path_stats"].lookup_range(0, 1)  # per-CPU: not a plain array


@pytest.mark.parametrize("name", ["mrc_rx_peers", "mrc_peer_ip", "mrc_live"])
def test_items_reads_every_entry_of_a_hash_an_lpm_trie_and_an_array(dp, name):
    """items() by batch lookup, against the entries written one at a time:
    a hash (its resume token a bucket number), an LPM trie (a key) and an
    array, with more entries than one hash bucket holds."""
    m = dp.maps[name]
    want = {} if name == "mrc_live" else {k: m.lookup(k) for k in m.keys()}
    for i in range(min(3000, m.max_entries - len(want))):
        if name == "mrc_peer_ip":
            key = wire.OvlKey.of(f"10.{i // 250}.{i % 250}.0/24").pack()
        elif name == "mrc_rx_peers":
            key = i.to_bytes(4, "little") + bytes(m.key_size - 4)
        else:
            key = wire.u32(i)
        want[key] = (i * 7919).to_bytes(4, "little").ljust(m.value_size, b"\x01")
    for k, v in want.items():
        m.update(k, v)
    got = dict(m.items())
    if name == "mrc_live":              # an array holds every index, the rest zero
        assert len(got) == m.max_entries and all(got[k] == v for k, v in want.items())
    else:
        assert got == want
    assert got == dict((k, m.lookup(k)) for k in m.keys())     # one at a time: the same


def test_only_the_programs_asked_for_are_loaded(bpf_objects):
    """`up` loads the receive program of the hook its planes use, not both
    (each verifies >100k instructions): the other is never loaded, and the
    ones loaded share one set of maps."""
    from mrcctl.datapath.objects import RX_PROG, RX_TC_PROG, TX_PROG, load_objects
    for hook, other in ((RX_PROG, RX_TC_PROG), (RX_TC_PROG, RX_PROG)):
        with load_objects(programs={TX_PROG, hook}) as dp:
            assert set(dp.prog_ids) == {TX_PROG, hook}
            assert dp.progs[hook].name == hook and getattr(dp, "rx" if other == RX_PROG else "rx_tc") is None
            for m in ("mrc_cfg", "mrc_paths", "mrc_drops"):
                assert libbpf.programs_using(dp.maps[m].id) == sorted([TX_PROG, hook]), m
    with load_objects() as dp:
        assert libbpf.programs_using(dp.maps["mrc_cfg"].id) == sorted([TX_PROG, RX_PROG, RX_TC_PROG])


def test_a_failed_load_names_its_object_and_leaves_no_program(bpf_objects, tmp_path, monkeypatch):
    """A receive object the verifier refuses: the error names it, and the
    transmit program verified beside it is gone with the maps."""
    from mrcctl.datapath import objects
    from mrcctl.datapath.objects import load_objects
    bad = Path(_compile(tmp_path, "rx", BAD_RX))
    tx = objects.object_paths()[0]
    monkeypatch.setattr(objects, "object_paths", lambda: (tx, bad))
    before = _held_bpf_fds()
    with pytest.raises(Exception) as ei:
        load_objects(programs={objects.TX_PROG, objects.RX_PROG})
    assert "rx.bpf.o" in str(ei.value)
    # nothing of the load stays open in this process: no program, no map
    assert _held_bpf_fds() == before


def _held_bpf_fds() -> set[tuple[str, int]]:
    """("prog_id" | "map_id", id) of every BPF fd this process holds."""
    out = set()
    for fd in os.listdir("/proc/self/fdinfo"):
        try:
            text = open(f"/proc/self/fdinfo/{fd}").read()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, val = line.partition(":")
            if key in ("prog_id", "map_id"):
                out.add((key, int(val)))
    return out


# an rx object whose mrc_rx reads past the packet: the verifier refuses it
BAD_RX = r"""
#include "maps.h"
SEC("xdp")
int mrc_rx(struct xdp_md *ctx)
{
	return *(__u8 *)(long)ctx->data;
}
SEC("tc")
int mrc_rx_tc(struct __sk_buff *skb)
{
	return 0;
}
char _license[] SEC("license") = "GPL";
"""
