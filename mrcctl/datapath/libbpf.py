"""Thin ctypes layer over the system libbpf (libbpf.so.1, API of libbpf 1.1).

Only what mrc needs: open/load BPF objects with a pin root, maps by pin or by
object, BPF_PROG_TEST_RUN, ring buffers, pins and object info.

Conventions:
- libbpf >= 1.0 returns -errno from int functions and NULL (errno set) from
  pointer functions; every call is checked and a failure raises LibbpfError
  (an OSError) whose message names the operation, the strerror and, when
  libbpf said something about it, the tail of libbpf's own messages (for a
  failed load that includes the verifier log).
- libbpf's print output is captured into a ring of recent lines
  (recent_log()); nothing goes to stderr unless MRC_LIBBPF_DEBUG is set in
  the environment (then everything, debug level included, is echoed).
"""

from __future__ import annotations

import collections
import ctypes
import errno as _errno
import mmap
import os
import sys
import threading
from typing import Callable

__all__ = [
    "LibbpfError", "num_possible_cpus", "Map", "Program", "BpfObject",
    "RingBuffer", "obj_pin", "obj_get", "prog_info", "map_info",
    "recent_log", "PERCPU_MAP_TYPES", "prog_ids", "programs_using", "tc_query", "TC_INGRESS", "TC_EGRESS",
]

_lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
_libc = ctypes.CDLL(None, use_errno=True)

# enum bpf_map_type values used here
BPF_MAP_TYPE_HASH = 1
BPF_MAP_TYPE_ARRAY = 2
BPF_MAP_TYPE_PERCPU_HASH = 5
BPF_MAP_TYPE_PERCPU_ARRAY = 6
BPF_MAP_TYPE_LRU_PERCPU_HASH = 10
BPF_MAP_TYPE_LPM_TRIE = 11
BPF_MAP_TYPE_PERCPU_CGROUP_STORAGE = 21
BPF_MAP_TYPE_RINGBUF = 27
BPF_F_MMAPABLE = 1 << 10
PERCPU_MAP_TYPES = frozenset({
    BPF_MAP_TYPE_PERCPU_HASH, BPF_MAP_TYPE_PERCPU_ARRAY,
    BPF_MAP_TYPE_LRU_PERCPU_HASH, BPF_MAP_TYPE_PERCPU_CGROUP_STORAGE,
})

# map update flags
BPF_ANY = 0
BPF_NOEXIST = 1
BPF_EXIST = 2

BPF_OBJ_NAME_LEN = 16


BPF_F_TEST_XDP_LIVE_FRAMES = 1 << 1
ENOTSUPP = 524      # the kernel's own "operation not supported" (not in errno)


class LibbpfError(OSError):
    """A libbpf call failed. .errno is the errno; str() names the call."""

    def __init__(self, op: str, err: int, detail: str = ""):
        err = abs(err) if err else _errno.EIO
        msg = f"{op}: {os.strerror(err)}"
        if detail:
            msg += "\n" + detail
        super().__init__(err, msg)
        self.op = op

    def __str__(self) -> str:  # OSError's default prefixes "[Errno n]"
        return self.strerror


# ---------------------------------------------------------------------------
# libbpf's print callback -> ring of recent lines

_LOG_LINES = 2000
# (seq, level, line, thread): objects load in parallel threads (the callback
# runs in the loading thread), and a failure reports its own thread's lines
_log: collections.deque[tuple[int, int, str, int]] = collections.deque(maxlen=_LOG_LINES)
_log_seq = 0
_log_lock = threading.Lock()
_echo = bool(os.environ.get("MRC_LIBBPF_DEBUG"))
_LIBBPF_WARN, _LIBBPF_INFO, _LIBBPF_DEBUG = 0, 1, 2

_libc.vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]
_libc.vsnprintf.restype = ctypes.c_int

# int (*)(enum libbpf_print_level, const char *fmt, va_list). A va_list
# parameter arrives as a pointer on x86-64 (array type) and on aarch64
# (large struct passed by reference), so c_void_p forwards it to vsnprintf.
_PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


def _print_cb(level: int, fmt: bytes, args: int) -> int:
    global _log_seq
    if level >= _LIBBPF_DEBUG and not _echo:
        return 0
    # a failed load's verifier log comes as one message: keep its tail
    buf = ctypes.create_string_buffer(1 << 20)
    n = _libc.vsnprintf(buf, len(buf), fmt, args)
    if n < 0:
        return 0
    text = buf.value.decode("utf-8", "replace")
    if _echo:
        sys.stderr.write(text)
    tid = threading.get_ident()
    with _log_lock:
        for line in text.splitlines():
            _log_seq += 1
            _log.append((_log_seq, level, line, tid))
    return 0


_print_fn_ref = _PRINT_FN(_print_cb)  # keep a reference: libbpf holds the pointer
_lib.libbpf_set_print.argtypes = [_PRINT_FN]
_lib.libbpf_set_print.restype = ctypes.c_void_p
_lib.libbpf_set_print(_print_fn_ref)


def _log_mark() -> int:
    with _log_lock:
        return _log_seq


def _log_since(mark: int, limit: int = 60) -> str:
    with _log_lock:
        tid = threading.get_ident()
        lines = [line for seq, _lvl, line, t in _log if seq > mark and t == tid]
    if len(lines) > limit:
        lines = ["..."] + lines[-limit:]
    return "\n".join(lines)


def recent_log(n: int = 100) -> list[str]:
    """The last n lines libbpf printed (warnings and info; debug too when
    MRC_LIBBPF_DEBUG is set)."""
    with _log_lock:
        return [line for _s, _l, line, _t in list(_log)[-n:]]


# ---------------------------------------------------------------------------
# prototypes

def _proto(name: str, restype, *argtypes):
    fn = getattr(_lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


_c_int, _c_u32, _vp, _cp = ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_char_p


class _ObjectOpenOpts(ctypes.Structure):
    # struct bpf_object_open_opts, libbpf 1.1
    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("object_name", _cp),
        ("relaxed_maps", ctypes.c_bool),
        ("pin_root_path", _cp),
        ("_attach_prog_fd_stub", ctypes.c_uint32),
        ("kconfig", _cp),
        ("btf_custom_path", _cp),
        ("kernel_log_buf", _vp),
        ("kernel_log_size", ctypes.c_size_t),
        ("kernel_log_level", ctypes.c_uint32),
    ]


class _BatchOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("elem_flags", ctypes.c_uint64), ("flags", ctypes.c_uint64)]


def _batch_opts(elem_flags: int = 0):
    return ctypes.byref(_BatchOpts(sz=ctypes.sizeof(_BatchOpts), elem_flags=elem_flags, flags=0))


class _TestRunOpts(ctypes.Structure):
    # struct bpf_test_run_opts, libbpf 1.1
    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("data_in", _vp),
        ("data_out", _vp),
        ("data_size_in", _c_u32),
        ("data_size_out", _c_u32),
        ("ctx_in", _vp),
        ("ctx_out", _vp),
        ("ctx_size_in", _c_u32),
        ("ctx_size_out", _c_u32),
        ("retval", _c_u32),
        ("repeat", _c_int),
        ("duration", _c_u32),
        ("flags", _c_u32),
        ("cpu", _c_u32),
        ("batch_size", _c_u32),
    ]


class _BpfMapInfo(ctypes.Structure):
    # struct bpf_map_info (uapi), leading fields
    _fields_ = [
        ("type", _c_u32), ("id", _c_u32), ("key_size", _c_u32),
        ("value_size", _c_u32), ("max_entries", _c_u32), ("map_flags", _c_u32),
        ("name", ctypes.c_char * BPF_OBJ_NAME_LEN),
        ("ifindex", _c_u32), ("btf_vmlinux_value_type_id", _c_u32),
        ("netns_dev", ctypes.c_uint64), ("netns_ino", ctypes.c_uint64),
        ("btf_id", _c_u32), ("btf_key_type_id", _c_u32),
        ("btf_value_type_id", _c_u32), ("_pad", _c_u32),
        ("map_extra", ctypes.c_uint64),
    ]


class _BpfProgInfo(ctypes.Structure):
    # struct bpf_prog_info (uapi), leading fields; pointer fields stay 0 so
    # the kernel fills only scalars
    _fields_ = [
        ("type", _c_u32), ("id", _c_u32), ("tag", ctypes.c_uint8 * 8),
        ("jited_prog_len", _c_u32), ("xlated_prog_len", _c_u32),
        ("jited_prog_insns", ctypes.c_uint64), ("xlated_prog_insns", ctypes.c_uint64),
        ("load_time", ctypes.c_uint64), ("created_by_uid", _c_u32),
        ("nr_map_ids", _c_u32), ("map_ids", ctypes.c_uint64),
        ("name", ctypes.c_char * BPF_OBJ_NAME_LEN),
        ("ifindex", _c_u32), ("gpl_compatible", _c_u32),
        ("netns_dev", ctypes.c_uint64), ("netns_ino", ctypes.c_uint64),
        ("nr_jited_ksyms", _c_u32), ("nr_jited_func_lens", _c_u32),
        ("jited_ksyms", ctypes.c_uint64), ("jited_func_lens", ctypes.c_uint64),
        ("btf_id", _c_u32), ("func_info_rec_size", _c_u32), ("func_info", ctypes.c_uint64),
        ("nr_func_info", _c_u32), ("nr_line_info", _c_u32), ("line_info", ctypes.c_uint64),
        ("jited_line_info", ctypes.c_uint64), ("nr_jited_line_info", _c_u32),
        ("line_info_rec_size", _c_u32), ("jited_line_info_rec_size", _c_u32),
        ("nr_prog_tags", _c_u32), ("prog_tags", ctypes.c_uint64),
        ("run_time_ns", ctypes.c_uint64), ("run_cnt", ctypes.c_uint64),
        ("recursion_misses", ctypes.c_uint64),
        # instructions the verifier processed (5.16+; 0 on older kernels)
        ("verified_insns", _c_u32),
        ("attach_btf_obj_id", _c_u32), ("attach_btf_id", _c_u32), ("_pad", _c_u32),
    ]


class _TcHook(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("ifindex", _c_int), ("attach_point", _c_int),
                ("parent", _c_u32)]


class _TcOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("prog_fd", _c_int), ("flags", _c_u32),
                ("prog_id", _c_u32), ("handle", _c_u32), ("priority", _c_u32)]


_SAMPLE_FN = ctypes.CFUNCTYPE(_c_int, _vp, _vp, ctypes.c_size_t)

_libbpf_num_possible_cpus = _proto("libbpf_num_possible_cpus", _c_int)
_bpf_obj_get = _proto("bpf_obj_get", _c_int, _cp)
_bpf_obj_pin = _proto("bpf_obj_pin", _c_int, _c_int, _cp)
_bpf_map_get_fd_by_id = _proto("bpf_map_get_fd_by_id", _c_int, _c_u32)
_bpf_prog_get_fd_by_id = _proto("bpf_prog_get_fd_by_id", _c_int, _c_u32)
_bpf_map__reuse_fd = _proto("bpf_map__reuse_fd", _c_int, _vp, _c_int)
_bpf_prog_get_next_id = _proto("bpf_prog_get_next_id", _c_int, _c_u32, ctypes.POINTER(_c_u32))
_bpf_obj_get_info_by_fd = _proto("bpf_obj_get_info_by_fd", _c_int, _c_int, _vp,
                                 ctypes.POINTER(_c_u32))
_bpf_map_lookup_elem = _proto("bpf_map_lookup_elem", _c_int, _c_int, _vp, _vp)
# (fd, in_batch, out_batch, keys, values, count in/out, opts)
_bpf_map_lookup_batch = _proto("bpf_map_lookup_batch", _c_int, _c_int, _vp, _vp, _vp, _vp,
                               ctypes.POINTER(_c_u32), _vp)
# (fd, keys, values, count in/out, opts)
_bpf_map_update_batch = _proto("bpf_map_update_batch", _c_int, _c_int, _vp, _vp,
                               ctypes.POINTER(_c_u32), _vp)
_bpf_map_update_elem = _proto("bpf_map_update_elem", _c_int, _c_int, _vp, _vp, ctypes.c_uint64)
_bpf_map_delete_elem = _proto("bpf_map_delete_elem", _c_int, _c_int, _vp)
_bpf_map_get_next_key = _proto("bpf_map_get_next_key", _c_int, _c_int, _vp, _vp)
_bpf_prog_test_run_opts = _proto("bpf_prog_test_run_opts", _c_int, _c_int,
                                 ctypes.POINTER(_TestRunOpts))
_bpf_object__open_file = _proto("bpf_object__open_file", _vp, _cp,
                                ctypes.POINTER(_ObjectOpenOpts))
_bpf_object__load = _proto("bpf_object__load", _c_int, _vp)
_bpf_object__close = _proto("bpf_object__close", None, _vp)
_bpf_object__find_map_by_name = _proto("bpf_object__find_map_by_name", _vp, _vp, _cp)
_bpf_object__find_program_by_name = _proto("bpf_object__find_program_by_name", _vp, _vp, _cp)
_bpf_map__fd = _proto("bpf_map__fd", _c_int, _vp)
_bpf_map__type = _proto("bpf_map__type", _c_int, _vp)
_bpf_map__key_size = _proto("bpf_map__key_size", _c_u32, _vp)
_bpf_map__value_size = _proto("bpf_map__value_size", _c_u32, _vp)
_bpf_map__max_entries = _proto("bpf_map__max_entries", _c_u32, _vp)
_bpf_map__map_flags = _proto("bpf_map__map_flags", _c_u32, _vp)
_bpf_map__set_max_entries = _proto("bpf_map__set_max_entries", _c_int, _vp, _c_u32)
_bpf_map__set_initial_value = _proto("bpf_map__set_initial_value", _c_int, _vp, _vp, ctypes.c_size_t)
_bpf_program__fd = _proto("bpf_program__fd", _c_int, _vp)
_bpf_program__name = _proto("bpf_program__name", _cp, _vp)
_bpf_program__set_autoload = _proto("bpf_program__set_autoload", _c_int, _vp, ctypes.c_bool)
_ring_buffer__new = _proto("ring_buffer__new", _vp, _c_int, _SAMPLE_FN, _vp, _vp)
_ring_buffer__poll = _proto("ring_buffer__poll", _c_int, _vp, _c_int)
_ring_buffer__consume = _proto("ring_buffer__consume", _c_int, _vp)
_ring_buffer__free = _proto("ring_buffer__free", None, _vp)
_bpf_tc_query = _proto("bpf_tc_query", _c_int, ctypes.POINTER(_TcHook), ctypes.POINTER(_TcOpts))


def _check(op: str, ret: int, mark: int | None = None) -> int:
    """libbpf int convention: negative errno on failure."""
    if ret < 0:
        raise LibbpfError(op, -ret, _log_since(mark) if mark is not None else "")
    return ret


def _check_ptr(op: str, ptr, mark: int | None = None):
    """libbpf pointer convention: NULL with errno set on failure."""
    if not ptr:
        err = ctypes.get_errno() or _errno.ENOENT
        raise LibbpfError(op, err, _log_since(mark) if mark is not None else "")
    return ptr


def _round8(n: int) -> int:
    return (n + 7) & ~7


# ---------------------------------------------------------------------------

_ncpus: int | None = None


def num_possible_cpus() -> int:
    global _ncpus
    if _ncpus is None:
        _ncpus = _check("libbpf_num_possible_cpus", _libbpf_num_possible_cpus())
    return _ncpus


def obj_pin(fd: int, path: str) -> None:
    _check(f"bpf_obj_pin({path})", _bpf_obj_pin(fd, os.fsencode(path)))


def obj_get(path: str) -> int:
    """Open a pinned BPF object; the caller owns (and closes) the fd."""
    return _check(f"bpf_obj_get({path})", _bpf_obj_get(os.fsencode(path)))


def _info(fd: int, info: ctypes.Structure, what: str) -> None:
    n = _c_u32(ctypes.sizeof(info))
    _check(f"bpf_obj_get_info_by_fd({what} fd {fd})",
           _bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(n)))


def map_info(fd: int) -> dict:
    info = _BpfMapInfo()
    _info(fd, info, "map")
    return {
        "id": info.id, "type": info.type, "name": info.name.decode(),
        "key_size": info.key_size, "value_size": info.value_size,
        "max_entries": info.max_entries, "map_flags": info.map_flags,
        "btf_id": info.btf_id,
    }


def prog_ids() -> list[int]:
    """Ids of every BPF program loaded in the kernel."""
    out, cur, nxt = [], 0, _c_u32(0)
    while _bpf_prog_get_next_id(cur, ctypes.byref(nxt)) == 0:
        cur = nxt.value
        out.append(cur)
    return out


def programs_using(map_id: int) -> list[str]:
    """Names of the loaded programs that use map `map_id` (what a loader
    really loaded, bpftool-free)."""
    out = []
    for pid in prog_ids():
        try:
            fd = _check(f"bpf_prog_get_fd_by_id({pid})", _bpf_prog_get_fd_by_id(pid))
        except OSError:
            continue        # gone meanwhile
        try:
            info = prog_info(fd, map_ids=True)
        finally:
            os.close(fd)
        if map_id in info["map_ids"]:
            out.append(info["name"])
    return sorted(out)


def prog_info(fd: int, map_ids: bool = False) -> dict:
    info = _BpfProgInfo()
    _info(fd, info, "prog")
    out = {
        "id": info.id, "type": info.type, "name": info.name.decode(),
        "tag": bytes(info.tag).hex(), "load_time": info.load_time,
        "nr_map_ids": info.nr_map_ids, "verified_insns": info.verified_insns,
    }
    if map_ids:
        ids = (_c_u32 * max(info.nr_map_ids, 1))()
        again = _BpfProgInfo(nr_map_ids=info.nr_map_ids, map_ids=ctypes.addressof(ids))
        _info(fd, again, "prog")
        out["map_ids"] = list(ids[:again.nr_map_ids])
    return out


# ---------------------------------------------------------------------------
# querying tc (the product attaches with pyroute2, which cannot decode
# TCA_BPF_ID; bpf_tc_query reads it)

TC_INGRESS = 1 << 0
TC_EGRESS = 1 << 1


def tc_query(ifindex: int, where: int = TC_EGRESS, handle: int = 1, priority: int = 1) -> int:
    """Id of the program in that filter slot, 0 if none."""
    hook = _TcHook(sz=ctypes.sizeof(_TcHook), ifindex=ifindex, attach_point=where)
    opts = _TcOpts(sz=ctypes.sizeof(_TcOpts), handle=handle, priority=priority)
    ret = _bpf_tc_query(ctypes.byref(hook), ctypes.byref(opts))
    if ret in (-_errno.ENOENT, -_errno.EINVAL):
        return 0
    _check(f"bpf_tc_query(ifindex {ifindex})", ret)
    return opts.prog_id


def _adopt(cls, fd: int):
    """Wrap a fd we own in cls; close it if wrapping fails."""
    try:
        return cls(fd, owned=True)
    except BaseException:
        os.close(fd)
        raise


class _Closing:
    """A handle that close() releases, also as a context manager."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Fd(_Closing):
    """A BPF object held by fd; closing releases it if we own the fd."""

    fd: int
    _owned: bool

    @classmethod
    def from_pin(cls, path: str):
        return _adopt(cls, obj_get(path))

    def close(self) -> None:
        if self._owned and self.fd >= 0:
            os.close(self.fd)
        self.fd = -1


class Map(_Fd):
    """A BPF map by fd. Keys and values are raw bytes (see mrcctl.datapath.abi)."""

    def __init__(self, fd: int, owned: bool, name: str | None = None):
        info = map_info(fd)
        self.fd = fd
        self._owned = owned
        self.name = name or info["name"]
        self.id = info["id"]
        self.key_size = info["key_size"]
        self.value_size = info["value_size"]
        self.max_entries = info["max_entries"]
        self.map_type = info["type"]
        self.map_flags = info["map_flags"]
        self._mapped: mmap.mmap | None = None

    @classmethod
    def from_id(cls, map_id: int) -> "Map":
        return _adopt(cls, _check(f"bpf_map_get_fd_by_id({map_id})", _bpf_map_get_fd_by_id(map_id)))

    @property
    def definition(self) -> tuple[int, int, int, int, int]:
        """(type, key_size, value_size, max_entries, map_flags), as in
        BpfObject.map_def. The flags are part of a layout: mrc_live's values
        line up with cache lines only in an mmapable array (bpf/path.h)."""
        return (self.map_type, self.key_size, self.value_size, self.max_entries, self.map_flags)

    @property
    def percpu(self) -> bool:
        return self.map_type in PERCPU_MAP_TYPES

    def mapped(self) -> mmap.mmap:
        """An mmapable array (BPF_F_MMAPABLE) in this process's memory, read
        only: its values one after another, each rounded up to 8 bytes, read
        with no system call. For a task that looks at a field of every entry
        many times a second; take a memoryview of it for as long as the read
        lasts (close() cannot unmap what a view still holds)."""
        if self._mapped is None:
            if self.map_type != BPF_MAP_TYPE_ARRAY or not self.map_flags & BPF_F_MMAPABLE:
                raise ValueError(f"map {self.name}: not an mmapable array")
            self._mapped = mmap.mmap(self.fd, _round8(self.value_size) * self.max_entries,
                                     mmap.MAP_SHARED, mmap.PROT_READ)
        return self._mapped

    def close(self) -> None:
        if self._mapped is not None:
            try:
                self._mapped.close()
            except BufferError:     # a view still open: unmapped when it goes
                pass
            self._mapped = None
        super().close()

    def _key(self, key: bytes):
        if len(key) != self.key_size:
            raise ValueError(f"map {self.name}: key is {len(key)} bytes, want {self.key_size}")
        return ctypes.create_string_buffer(bytes(key), self.key_size)

    def _full_value_size(self) -> int:
        if self.percpu:
            return _round8(self.value_size) * num_possible_cpus()
        return self.value_size

    def lookup(self, key: bytes) -> bytes | None:
        """The value, or None if absent. Per-CPU maps: all CPUs' values
        concatenated, each padded to a multiple of 8 bytes."""
        k = self._key(key)
        v = ctypes.create_string_buffer(self._full_value_size())
        ret = _bpf_map_lookup_elem(self.fd, k, v)
        if ret == -_errno.ENOENT:
            return None
        _check(f"bpf_map_lookup_elem({self.name})", ret)
        return v.raw

    def lookup_range(self, first: int, count: int) -> list[bytes]:
        """Array maps: the values at indexes first..first+count-1 (fewer at
        the map's end), in one BPF_MAP_LOOKUP_BATCH call. The agent reads a
        peer's paths this way: one system call, not one per path."""
        if self.key_size != 4 or self.percpu:
            raise ValueError(f"map {self.name}: lookup_range wants a plain array map")
        return self.read_range(first, count)

    def read_range(self, first: int, count: int) -> list[bytes]:
        """Any array map (per-CPU ones too, every CPU's value as lookup()
        returns them): the values at first..first+count-1 in one call."""
        return self.split(self.read_raw(first, count))

    def split(self, raw: bytes) -> list[bytes]:
        """read_raw's buffer as read_range's values."""
        vs = self._full_value_size()
        return [raw[i:i + vs] for i in range(0, len(raw), vs)]

    @property
    def entry_size(self) -> int:
        """Bytes of one value in read_raw's buffer (per-CPU maps: every CPU's)."""
        return self._full_value_size()

    def read_raw(self, first: int, count: int) -> bytes:
        """read_range's values as one buffer, value after value (fewer at
        the map's end): what a caller that scans one field of thousands of
        entries slices (raw[offset::value_size]) instead of a list."""
        count = max(0, min(count, self.max_entries - first))
        if count == 0:
            return b""
        # the batch resumes after in_batch's key: the one before `first`
        start = ctypes.c_uint32(first - 1) if first else None
        out_batch = ctypes.c_uint32(0)
        vs = self._full_value_size()
        keys = ctypes.create_string_buffer(4 * count)
        vals = ctypes.create_string_buffer(vs * count)
        n = _c_u32(count)
        ret = _bpf_map_lookup_batch(self.fd, ctypes.byref(start) if start is not None else None,
                                    ctypes.byref(out_batch), keys, vals, ctypes.byref(n), None)
        if ret < 0 and ret != -_errno.ENOENT:    # ENOENT: the map's end, n holds what was read
            _check(f"bpf_map_lookup_batch({self.name})", ret)
        return ctypes.string_at(vals, n.value * vs)

    def update_batch(self, keys: list[bytes], values: list[bytes], flags: int = BPF_ANY) -> None:
        """Many updates in one BPF_MAP_UPDATE_BATCH call (values as
        update() takes them; per-CPU maps: one value for every CPU, or all
        CPUs' values). What `up` writes thousands of entries with."""
        if len(keys) != len(values):
            raise ValueError("update_batch: as many keys as values")
        if not keys:
            return
        want = self._full_value_size()
        if self.percpu:
            step = _round8(self.value_size)
            values = [v.ljust(step, b"\0") * num_possible_cpus() if len(v) == self.value_size else v
                      for v in values]
        for k, v in zip(keys, values):
            if len(k) != self.key_size or len(v) != want:
                raise ValueError(f"map {self.name}: batch entry of {len(k)}/{len(v)} bytes, "
                                 f"want {self.key_size}/{want}")
        kb = ctypes.create_string_buffer(b"".join(keys), self.key_size * len(keys))
        vb = ctypes.create_string_buffer(b"".join(values), want * len(values))
        # the kernel caps one call at what it can copy; chunk like libbpf users do
        done = 0
        while done < len(keys):
            n = _c_u32(len(keys) - done)
            ret = _bpf_map_update_batch(self.fd, ctypes.byref(kb, done * self.key_size),
                                        ctypes.byref(vb, done * want), ctypes.byref(n),
                                        _batch_opts(flags))
            if ret < 0:
                _check(f"bpf_map_update_batch({self.name})", ret)
            if n.value == 0:
                raise LibbpfError(f"bpf_map_update_batch({self.name})", _errno.EIO)
            done += n.value

    def lookup_percpu(self, key: bytes) -> list[bytes]:
        """Per-CPU maps: one value_size-byte value per possible CPU
        (empty list if the key is absent)."""
        if not self.percpu:
            raise ValueError(f"map {self.name} is not per-CPU")
        raw = self.lookup(key)
        if raw is None:
            return []
        step = _round8(self.value_size)
        return [raw[i * step:i * step + self.value_size] for i in range(num_possible_cpus())]

    def update(self, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
        """Per-CPU maps take either all CPUs' values (as lookup returns them)
        or one value_size value, which is written to every CPU."""
        k = self._key(key)
        value = bytes(value)
        if self.percpu and len(value) == self.value_size:
            step = _round8(self.value_size)
            value = value.ljust(step, b"\0") * num_possible_cpus()
        want = self._full_value_size()
        if len(value) != want:
            raise ValueError(f"map {self.name}: value is {len(value)} bytes, want {want}")
        v = ctypes.create_string_buffer(value, want)
        _check(f"bpf_map_update_elem({self.name})", _bpf_map_update_elem(self.fd, k, v, flags))

    def delete(self, key: bytes) -> bool:
        """True if deleted, False if absent (array maps: EINVAL is raised)."""
        ret = _bpf_map_delete_elem(self.fd, self._key(key))
        if ret == -_errno.ENOENT:
            return False
        _check(f"bpf_map_delete_elem({self.name})", ret)
        return True

    def keys(self) -> list[bytes]:
        out: list[bytes] = []
        cur = None
        nxt = ctypes.create_string_buffer(self.key_size)
        while True:
            ret = _bpf_map_get_next_key(self.fd, cur, nxt)
            if ret == -_errno.ENOENT:
                return out
            _check(f"bpf_map_get_next_key({self.name})", ret)
            out.append(nxt.raw)
            cur = ctypes.create_string_buffer(nxt.raw, self.key_size)
            if len(out) > self.max_entries:  # a hash map changing under us
                return out

    def items(self) -> list[tuple[bytes, bytes]]:
        """Every (key, value), by BPF_MAP_LOOKUP_BATCH (a few system calls
        for the whole map: one get-next-key and one lookup per entry were
        50,000 calls, 0.2 s, to remove one of 4,096 peers); one entry at a
        time where the map type has no batch lookup."""
        if not self.percpu:
            got = self._items_batch()
            if got is not None:
                return got
        out = []
        for k in self.keys():
            v = self.lookup(k)
            if v is not None:
                out.append((k, v))
        return out

    def _items_batch(self) -> list[tuple[bytes, bytes]] | None:
        ks, vs, cap = self.key_size, self.value_size, max(1, self.max_entries)
        # the resume token: a key for most maps, a bucket number for hashes
        tok_in, tok_out = ctypes.create_string_buffer(max(ks, 8)), ctypes.create_string_buffer(max(ks, 8))
        keys, vals = ctypes.create_string_buffer(ks * cap), ctypes.create_string_buffer(vs * cap)
        out: list[tuple[bytes, bytes]] = []
        first = True
        while True:
            n = _c_u32(cap)
            ret = _bpf_map_lookup_batch(self.fd, None if first else tok_in, tok_out, keys, vals,
                                        ctypes.byref(n), None)
            if ret < 0 and ret != -_errno.ENOENT:
                if first and ret in (-_errno.EINVAL, -_errno.EOPNOTSUPP, -ENOTSUPP):
                    return None
                _check(f"bpf_map_lookup_batch({self.name})", ret)
            rk, rv = ctypes.string_at(keys, n.value * ks), ctypes.string_at(vals, n.value * vs)
            out += [(rk[i * ks:(i + 1) * ks], rv[i * vs:(i + 1) * vs]) for i in range(n.value)]
            if ret == -_errno.ENOENT or n.value == 0:
                return out
            ctypes.memmove(tok_in, tok_out, len(tok_out))
            first = False

    def __repr__(self) -> str:
        return (f"Map({self.name!r}, type={self.map_type}, key={self.key_size}, "
                f"value={self.value_size}, max={self.max_entries}, fd={self.fd})")


class Program(_Fd):
    def __init__(self, fd: int, owned: bool, name: str | None = None):
        self.fd = fd
        self._owned = owned
        info = prog_info(fd)
        self.name = name or info["name"]
        self.id = info["id"]
        self.prog_type = info["type"]

    @classmethod
    def from_id(cls, prog_id: int) -> "Program":
        return _adopt(cls, _check(f"bpf_prog_get_fd_by_id({prog_id})", _bpf_prog_get_fd_by_id(prog_id)))

    def pin(self, path: str) -> None:
        obj_pin(self.fd, path)

    def test_run(self, data: bytes, repeat: int = 1, out_size: int | None = None,
                 ctx_in: bytes | None = None) -> tuple[int, bytes, int]:
        """BPF_PROG_TEST_RUN: (retval, data_out, duration_ns per run).

        The default output buffer leaves 4 KiB of room for growth. If it is
        too small the kernel says ENOSPC and the size it needs, and the run
        is repeated with a bigger buffer -- note that the program then ran
        twice (map side effects happen twice). `repeat` > 1 feeds each run
        the packet the previous run modified (kernel behaviour)."""
        data = bytes(data)
        size = out_size if out_size is not None else len(data) + 4096
        din = ctypes.create_string_buffer(data, len(data))
        cin = ctypes.create_string_buffer(bytes(ctx_in), len(ctx_in)) if ctx_in else None
        for _attempt in range(3):
            dout = ctypes.create_string_buffer(size)
            opts = _TestRunOpts(sz=ctypes.sizeof(_TestRunOpts))
            opts.data_in = ctypes.cast(din, _vp)
            opts.data_size_in = len(data)
            opts.data_out = ctypes.cast(dout, _vp)
            opts.data_size_out = size
            opts.repeat = repeat
            if cin is not None:
                opts.ctx_in = ctypes.cast(cin, _vp)
                opts.ctx_size_in = len(ctx_in)
            ret = _bpf_prog_test_run_opts(self.fd, ctypes.byref(opts))
            if ret == -_errno.ENOSPC and opts.data_size_out > size:
                size = opts.data_size_out
                continue
            _check(f"bpf_prog_test_run_opts({self.name})", ret)
            return opts.retval, dout.raw[:opts.data_size_out], opts.duration
        raise LibbpfError(f"bpf_prog_test_run_opts({self.name})", _errno.ENOSPC)

    def run_live(self, data: bytes, repeat: int, batch_size: int = 0) -> None:
        """BPF_PROG_TEST_RUN with BPF_F_TEST_XDP_LIVE_FRAMES (XDP programs,
        kernel >= 5.18): the program runs `repeat` times, each on a frame
        of a page pool filled from `data` (and recycled with what earlier
        runs wrote into it), and every frame it redirects is transmitted
        (XDP_TX out of the loopback, XDP_REDIRECT out of the target's
        ndo_xdp_xmit); nothing comes back but an error. What
        xdp-trafficgen sends with; mrc's probe generator too."""
        data = bytes(data)
        din = ctypes.create_string_buffer(data, len(data))
        opts = _TestRunOpts(sz=ctypes.sizeof(_TestRunOpts))
        opts.data_in = ctypes.cast(din, _vp)
        opts.data_size_in = len(data)
        opts.repeat = repeat
        opts.flags = BPF_F_TEST_XDP_LIVE_FRAMES
        opts.batch_size = batch_size
        _check(f"bpf_prog_test_run_opts({self.name}, live frames)", _bpf_prog_test_run_opts(self.fd, ctypes.byref(opts)))

    def __repr__(self) -> str:
        return f"Program({self.name!r}, id={self.id}, fd={self.fd})"


class BpfObject(_Closing):
    """A libbpf bpf_object. Maps with LIBBPF_PIN_BY_NAME are pinned under
    pin_root (created by the first load, reused by later ones)."""

    def __init__(self, ptr, path: str):
        self._obj = ptr
        self.path = path
        self.loaded = False

    @classmethod
    def open(cls, path: str, pin_root: str | None = None) -> "BpfObject":
        # keep the encoded strings alive until open returns (libbpf copies)
        name = os.path.basename(path).split(".")[0].encode()
        root = os.fsencode(pin_root) if pin_root else None
        opts = _ObjectOpenOpts(sz=ctypes.sizeof(_ObjectOpenOpts))
        opts.object_name = name
        opts.relaxed_maps = False
        opts.pin_root_path = root
        mark = _log_mark()
        ctypes.set_errno(0)
        ptr = _bpf_object__open_file(os.fsencode(path), ctypes.byref(opts))
        _check_ptr(f"bpf_object__open_file({path})", ptr, mark)
        return cls(ptr, path)

    def load(self) -> None:
        if not self._obj:
            raise LibbpfError("bpf_object__load", _errno.EBADF)
        mark = _log_mark()
        _check(f"bpf_object__load({self.path})", _bpf_object__load(self._obj), mark)
        self.loaded = True

    def reuse_map(self, name: str, fd: int) -> None:
        """Before load: make this object's map `name` the existing map `fd`."""
        ptr = _bpf_object__find_map_by_name(self._obj, name.encode())
        if not ptr:
            raise LibbpfError(f"map {name} in {self.path}", _errno.ENOENT)
        _check(f"bpf_map__reuse_fd({name})", _bpf_map__reuse_fd(ptr, fd))

    def set_max_entries(self, name: str, n: int) -> None:
        """Before load: size map `name` (what the loader does from the config)."""
        ptr = _bpf_object__find_map_by_name(self._obj, name.encode())
        if not ptr:
            raise LibbpfError(f"map {name} in {self.path}", _errno.ENOENT)
        _check(f"bpf_map__set_max_entries({name}, {n})", _bpf_map__set_max_entries(ptr, n))

    def set_section(self, section: str, data: bytes) -> bool:
        """Before load: the initial contents of a global-data section (e.g.
        ".rodata.sizing"); False if the object has no such section."""
        ptr = _bpf_object__find_map_by_name(self._obj, section.encode())
        if not ptr:
            return False
        buf = ctypes.create_string_buffer(data, len(data))
        _check(f"bpf_map__set_initial_value({section})",
               _bpf_map__set_initial_value(ptr, buf, len(data)))
        return True

    def has_program(self, name: str) -> bool:
        return bool(_bpf_object__find_program_by_name(self._obj, name.encode()))

    def set_autoload(self, name: str, on: bool) -> None:
        """Before load: whether program `name` is loaded (verified) at all."""
        ptr = _bpf_object__find_program_by_name(self._obj, name.encode())
        if not ptr:
            raise LibbpfError(f"program {name} in {self.path}", _errno.ENOENT)
        _check(f"bpf_program__set_autoload({name})", _bpf_program__set_autoload(ptr, on))

    def map_def(self, name: str) -> tuple[int, int, int, int, int] | None:
        """(type, key_size, value_size, max_entries, map_flags) this object
        declares for map `name` (before load), or None if it has no such map."""
        ptr = _bpf_object__find_map_by_name(self._obj, name.encode())
        if not ptr:
            return None
        return (_bpf_map__type(ptr), _bpf_map__key_size(ptr), _bpf_map__value_size(ptr),
                _bpf_map__max_entries(ptr), _bpf_map__map_flags(ptr))

    def map(self, name: str) -> Map:
        ptr = _bpf_object__find_map_by_name(self._obj, name.encode())
        if not ptr:
            raise LibbpfError(f"map {name} in {self.path}", _errno.ENOENT)
        fd = _check(f"bpf_map__fd({name})", _bpf_map__fd(ptr))
        return Map(fd, owned=False, name=name)

    def program(self, name: str) -> Program:
        ptr = _bpf_object__find_program_by_name(self._obj, name.encode())
        if not ptr:
            raise LibbpfError(f"program {name} in {self.path}", _errno.ENOENT)
        fd = _check(f"bpf_program__fd({name})", _bpf_program__fd(ptr))
        return Program(fd, owned=False, name=_bpf_program__name(ptr).decode())

    def close(self) -> None:
        if self._obj:
            _bpf_object__close(self._obj)
            self._obj = None


    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class RingBuffer(_Closing):
    """libbpf ring_buffer over one BPF_MAP_TYPE_RINGBUF map.

    callback(data: bytes) is called for each record from poll()/consume();
    returning a negative int stops the batch (libbpf semantics). An
    exception in the callback stops the batch and is re-raised from
    poll()/consume()."""

    def __init__(self, map_or_fd: "Map | int", callback: Callable[[bytes], int | None]):
        fd = map_or_fd.fd if isinstance(map_or_fd, Map) else int(map_or_fd)
        self._callback = callback
        self._exc: BaseException | None = None

        def _sample(_ctx, data, size):
            try:
                r = self._callback(ctypes.string_at(data, size))
                return int(r) if r else 0
            except BaseException as e:  # noqa: BLE001 - re-raised in poll
                self._exc = e
                return -_errno.ECANCELED

        self._cb = _SAMPLE_FN(_sample)  # keep a reference for libbpf
        ctypes.set_errno(0)
        self._rb = _check_ptr("ring_buffer__new", _ring_buffer__new(fd, self._cb, None, None))

    def _reraise(self, ret: int, op: str) -> int:
        if self._exc is not None:
            e, self._exc = self._exc, None
            raise e
        if ret == -_errno.EINTR:
            return 0
        return _check(op, ret)

    def poll(self, timeout_ms: int) -> int:
        """Wait up to timeout_ms for records; returns how many were consumed."""
        return self._reraise(_ring_buffer__poll(self._rb, int(timeout_ms)), "ring_buffer__poll")

    def consume(self) -> int:
        return self._reraise(_ring_buffer__consume(self._rb), "ring_buffer__consume")

    def close(self) -> None:
        if self._rb:
            _ring_buffer__free(self._rb)
            self._rb = None

