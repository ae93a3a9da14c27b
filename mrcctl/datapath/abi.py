"""Python mirror of bpf/mrc.h: constants, enums and struct pack/unpack.

The one place Python declares the datapath's ABI. Path state names, spray
modes, drop/verdict reasons and event reasons are the enums below; config
validation, CLI choices, status JSON, rendering and metric labels derive
from them, so a new member needs no edit elsewhere in mrcctl.

tests/unit/test_wire.py compiles a C program against mrc.h and checks every
constant, struct size and field offset here against it, so a change to one
side without the other fails the unit tests.

Byte order: the MRC header is on the wire (big-endian). Map keys and values
are host-endian except addresses, which stay in network order ("=" formats
below; addresses are kept as raw bytes inside the struct and shown as
strings in the Python objects).
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import socket
import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import ClassVar, Iterable, Sequence

# ---------------------------------------------------------------------------
# constants (#define in mrc.h)

MRC_VERSION = 1
MRC_DEFAULT_UDP_PORT = 4794
MRC_DEFAULT_EV_BASE = 49152

MRC_DEFAULT_PEERS = 64      # per-peer map entries the objects are compiled with
MRC_PEERS_LIMIT = 16384     # most per-peer entries the loader sets
MRC_MAX_PATHS = 256         # per peer: planes x EVs; the largest path stride
MRC_PATH_SHIFT_MAX = 8      # log2(MRC_MAX_PATHS)
MRC_MAX_PLANES = 16
MRC_SLOTS = 1024
MRC_WIN_WORDS = 64          # receiver reorder window: 64 words of 64 PSNs
MRC_HIST_BUCKETS = 16       # per peer reorder-distance histogram (log2)

MRC_F_FEEDBACK = 0x01
MRC_F_HEDGE = 0x02
MRC_F_IPID = 0x04
MRC_F_AUTH = 0x08           # an MRC_AUTH_LEN-byte MAC follows the header (bpf/auth.h)
MRC_F_ECE = 0x10            # the echoed path brought a CE-marked packet lately (bpf/congest.h)
MRC_F_ELOSS = 0x20          # the echoed path lost wire packets lately (bpf/congest.h)
MRC_F_EHELD = 0x40          # the echoed receipt waited for its echo: no delay sample (bpf/feedback.h)
MRC_AUTH_LEN = 8
MRC_AUTH_MSG_LEN = 48       # what the MAC covers: MRC header + 20 bytes of struct mrc_auth_inner (inner IPv4)
MRC_AUTH_MSG_LEN6 = 72      # ... + all 44 bytes of it (inner IPv6)
MRC_ACL_RULES = 16          # allow_underlay rules per plane (bpf/acl.h)

MRC_HDR_LEN = 28
MRC_OVERHEAD_V4 = 20 + 8 + MRC_HDR_LEN
MRC_OVERHEAD_V6 = 40 + 8 + MRC_HDR_LEN

MRC_CFG_LIVENESS = 0x01
MRC_CFG_HEDGE = 0x02
MRC_CFG_HEDGE_ALL = 0x04
MRC_CFG_FB_FRAMES = 0x08
MRC_CFG_PAWS_GUARD = 0x10
MRC_DEDUP_WORDS = 512       # hedged-unit duplicate filter: 512 words of 32 PSNs
MRC_TX_FLOWS = 64           # sender: highest TCP sequence per inner flow, slots per peer
MRC_RX_FLOWS = 64           # receiver: newest TCP timestamp per inner flow, slots per peer
MRC_RX_UNITS = 4            # receiver: units per path whose packets are counted at once

MRC_PROBE_RING = 8            # outstanding probes per path whose nonces rx knows
MRC_PROBE_BATCH = 256         # probes per run of the probe generator (bpf/probe_gen.bpf.c)
MRC_PROBE_FRAME_MAX = 128     # room for one probe frame in struct mrc_probe_out
MRC_OWNER_LOCAL = 0xFFFFFFFF  # mrc_ovl_owner: a prefix served by this host
MRC_OWNER_NONE = 0xFFFFFFFE   # ovl_owner(): no entry (never stored)
MRC_OVL_FAMILY_BITS = 32      # mrc_ovl_key.prefixlen counts the family word first
MRC_OVL_PER_PEER = 16         # owner entries (overlay addresses + prefixes) per peer
MRC_EPOCH_SEEN = 0x10000      # mrc_rx_epoch: cur/prev hold epoch | this (0: none yet)


def slots_idx(peer: int, table: int) -> int:
    """Index into mrc_slots: peer * 2 + table."""
    return peer * 2 + (table & 1)


# ---------------------------------------------------------------------------
# enums

class _LabelEnum(IntEnum):
    @property
    def label(self) -> str:
        """Lower-case snake name, usable as a Prometheus label value."""
        return self.name.lower()


class MsgType(_LabelEnum):
    """enum mrc_type (low nibble of ver_type)."""
    DATA = 0
    PROBE = 1
    PROBE_REPLY = 2
    FEEDBACK = 3
    TRACE = 4


class PathState(_LabelEnum):
    """enum mrc_path_state."""
    GOOD = 0
    ASSUMED_BAD = 1
    DENIED = 2


class Reason(_LabelEnum):
    """enum mrc_reason: index into mrc_drops (MRC_R_MAX is not a member)."""
    RX_TRUNCATED = 0
    RX_BAD_VERSION = 1
    RX_UNKNOWN_PEER = 2
    RX_UNKNOWN_PATH = 3
    RX_BAD_TYPE = 4
    RX_FRAGMENT = 5
    RX_IP_OPTIONS = 6
    RX_BAD_INNER = 7
    RX_DUPLICATE = 8
    RX_DECAP_FAIL = 9
    TX_NO_PEER = 10
    TX_NO_PATH = 11
    TX_NOT_IPV4 = 12
    TX_ENCAP_FAIL = 13
    RX_PROBE_REPLIED = 14
    RX_PROBE_REPLY = 15
    RX_PASS_VLAN = 16
    RX_PASS_FRAGMENT = 17
    RX_INNER_SRC = 18
    RX_INNER_DST = 19
    RX_WRONG_PLANE = 20
    RX_BAD_NONCE = 21
    RX_ECN_NOT_ECT = 22
    RX_HEDGE_AHEAD = 23
    RX_PROBE_LIMITED = 24
    TX_VLAN = 25
    TX_NESTED_GSO = 26
    RX_NO_MAC = 27
    RX_BAD_MAC = 28
    RX_UNDERLAY_REFUSED = 29
    RX_PMTU = 30
    RX_PMTU_BAD = 31
    TX_TOO_BIG = 32
    TX_TOO_BIG_DROP = 33
    RX_FEEDBACK = 34
    RX_TRACE = 35

    @property
    def is_drop(self) -> bool:
        """False for the verdicts mrc.h marks "not a drop" (test_wire checks)."""
        return self not in (Reason.RX_PROBE_REPLIED, Reason.RX_PROBE_REPLY,
                            Reason.RX_PASS_VLAN, Reason.RX_PASS_FRAGMENT,
                            Reason.RX_HEDGE_AHEAD, Reason.RX_PMTU, Reason.RX_FEEDBACK,
                            Reason.RX_TRACE)


def reason_is_drop(label: str) -> bool:
    """Whether a verdict counter (a key of the snapshot's "drops") counts
    dropped packets. A label this mirror does not know, from a snapshot of
    another version, is judged by its name."""
    for r in Reason:
        if r.label == label:
            return r.is_drop
    return "probe" not in label


MRC_R_MAX = 36


class EvReason(_LabelEnum):
    """enum mrc_ev_reason: why a path changed state (struct mrc_event)."""
    DEAD = 1
    RECOVERED = 2
    LINK_DOWN = 3
    LINK_UP = 4
    DENIED = 5
    ALLOWED = 6
    MIN_ACTIVE = 7


class CtlOp(_LabelEnum):
    """enum mrc_ctl_op: what the agent asks the mrc_ctl program to do."""
    RETIRE = 1


class SprayMode(_LabelEnum):
    """enum mrc_spray."""
    WEIGHTED = 0
    FLOWLET = 1
    HASH = 2


def c_constants() -> dict[str, int]:
    """Every #define and enum value of mrc.h, by its C name (for tests)."""
    out = {
        "MRC_VERSION": MRC_VERSION,
        "MRC_DEFAULT_UDP_PORT": MRC_DEFAULT_UDP_PORT,
        "MRC_DEFAULT_EV_BASE": MRC_DEFAULT_EV_BASE,
        "MRC_DEFAULT_PEERS": MRC_DEFAULT_PEERS,
        "MRC_PEERS_LIMIT": MRC_PEERS_LIMIT,
        "MRC_MAX_PATHS": MRC_MAX_PATHS,
        "MRC_PATH_SHIFT_MAX": MRC_PATH_SHIFT_MAX,
        "MRC_MAX_PLANES": MRC_MAX_PLANES,
        "MRC_SLOTS": MRC_SLOTS,
        "MRC_WIN_WORDS": MRC_WIN_WORDS,
        "MRC_HIST_BUCKETS": MRC_HIST_BUCKETS,
        "MRC_F_FEEDBACK": MRC_F_FEEDBACK,
        "MRC_F_HEDGE": MRC_F_HEDGE,
        "MRC_F_IPID": MRC_F_IPID,
        "MRC_F_AUTH": MRC_F_AUTH,
        "MRC_F_ECE": MRC_F_ECE,
        "MRC_F_ELOSS": MRC_F_ELOSS,
        "MRC_F_EHELD": MRC_F_EHELD,
        "MRC_AUTH_LEN": MRC_AUTH_LEN,
        "MRC_AUTH_MSG_LEN": MRC_AUTH_MSG_LEN,
        "MRC_AUTH_MSG_LEN6": MRC_AUTH_MSG_LEN6,
        "MRC_OVL_FAMILY_BITS": MRC_OVL_FAMILY_BITS,
        "MRC_OVL_PER_PEER": MRC_OVL_PER_PEER,
        "MRC_ACL_RULES": MRC_ACL_RULES,
        "MRC_HDR_LEN": MRC_HDR_LEN,
        "MRC_OVERHEAD_V4": MRC_OVERHEAD_V4,
        "MRC_OVERHEAD_V6": MRC_OVERHEAD_V6,
        "MRC_CFG_LIVENESS": MRC_CFG_LIVENESS,
        "MRC_CFG_HEDGE": MRC_CFG_HEDGE,
        "MRC_CFG_HEDGE_ALL": MRC_CFG_HEDGE_ALL,
        "MRC_CFG_FB_FRAMES": MRC_CFG_FB_FRAMES,
        "MRC_CFG_PAWS_GUARD": MRC_CFG_PAWS_GUARD,
        "MRC_DEDUP_WORDS": MRC_DEDUP_WORDS,
        "MRC_TX_FLOWS": MRC_TX_FLOWS,
        "MRC_RX_FLOWS": MRC_RX_FLOWS,
        "MRC_RX_UNITS": MRC_RX_UNITS,
        "MRC_R_MAX": MRC_R_MAX,
        "MRC_OWNER_LOCAL": MRC_OWNER_LOCAL,
        "MRC_PROBE_RING": MRC_PROBE_RING,
        "MRC_PROBE_BATCH": MRC_PROBE_BATCH,
        "MRC_PROBE_FRAME_MAX": MRC_PROBE_FRAME_MAX,
        "MRC_OWNER_NONE": MRC_OWNER_NONE,
        "MRC_EPOCH_SEEN": MRC_EPOCH_SEEN,
    }
    out.update({f"MRC_T_{m.name}": int(m) for m in MsgType})
    out.update({f"MRC_PATH_{m.name}": int(m) for m in PathState})
    out.update({f"MRC_R_{m.name}": int(m) for m in Reason})
    out.update({f"MRC_SPRAY_{m.name}": int(m) for m in SprayMode})
    out.update({f"MRC_EV_{m.name}": int(m) for m in EvReason})
    out.update({f"MRC_CTL_{m.name}": int(m) for m in CtlOp})
    return out


# ---------------------------------------------------------------------------
# conversions

def mac_bytes(mac: str | bytes | None) -> bytes:
    if mac is None:
        return bytes(6)
    if isinstance(mac, (bytes, bytearray)):
        if len(mac) != 6:
            raise ValueError(f"MAC must be 6 bytes, got {len(mac)}")
        return bytes(mac)
    return _text_mac_bytes(mac)


@functools.lru_cache(maxsize=1 << 16)
def _text_mac_bytes(mac: str) -> bytes:
    b = bytes(int(x, 16) for x in mac.replace("-", ":").split(":"))
    if len(b) != 6:
        raise ValueError(f"bad MAC {mac!r}")
    return b


@functools.lru_cache(maxsize=1 << 16)
def mac_str(b: bytes) -> str:
    # cached: every path of a plane has the same source MAC, every path to
    # a peer on a plane the same destination; the agent holds an unpacked
    # entry per path (thousands of peers), which then share one string
    return ":".join(f"{x:02x}" for x in b)


def addr_bytes(addr, family: int | None = None) -> bytes:
    """An address as the 16-byte __be32[4] of mrc.h (IPv4 in [0])."""
    if addr is None or addr == "":
        return bytes(16)
    if isinstance(addr, (bytes, bytearray)):
        if len(addr) == 4:
            return bytes(addr) + bytes(12)
        if len(addr) == 16:
            return bytes(addr)
        raise ValueError(f"address must be 4 or 16 bytes, got {len(addr)}")
    if isinstance(addr, str):
        return _text_addr_bytes(addr, family)
    a = ipaddress.ip_address(addr)
    if family is not None and a.version != family:
        raise ValueError(f"{addr} is not IPv{family}")
    return a.packed.ljust(16, b"\0")


@functools.lru_cache(maxsize=1 << 16)
def _text_addr_bytes(addr: str, family: int | None) -> bytes:
    # cached: `up` packs every path's two addresses (262,144 at 4,096 peers
    # x 32 paths), and a path's addresses are one of a few per peer
    a = ipaddress.ip_address(addr)
    if family is not None and a.version != family:
        raise ValueError(f"{addr} is not IPv{family}")
    return a.packed.ljust(16, b"\0")


@functools.lru_cache(maxsize=1 << 16)
def addr_str(b: bytes, family: int) -> str:
    if family == 4:
        return socket.inet_ntop(socket.AF_INET, b[:4])
    if family == 6:
        return socket.inet_ntop(socket.AF_INET6, b[:16])
    return "" if not any(b) else b.hex()


def family_of(addr) -> int:
    return ipaddress.ip_address(addr).version


def ipv4_key(addr: str) -> bytes:
    """An IPv4 address in network order."""
    return socket.inet_aton(addr)


def u32(v: int) -> bytes:
    """A __u32 map key or value."""
    return struct.pack("=I", v)


def u64(v: int) -> bytes:
    return struct.pack("=Q", v)


def unpack_u32(b: bytes) -> int:
    return struct.unpack("=I", b[:4])[0]


def inet_csum(data: bytes) -> int:
    """RFC 1071 Internet checksum of data (the complemented one's-complement sum)."""
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def sum_percpu_u64(values: Iterable[bytes]) -> int:
    """Sum a per-CPU __u64 value (Map.lookup_percpu of mrc_drops)."""
    return sum(struct.unpack("=Q", v[:8])[0] for v in values)


# ---------------------------------------------------------------------------
# structs

class _Struct:
    """Base: LAYOUT is ((c_field_name, struct_format), ...) in C order with
    no implicit padding ("=" / "!" formats do not align, so the layout must
    spell out any padding the C compiler would add; test_wire checks).
    @_struct makes the dataclass fields from LAYOUT."""

    C_NAME: ClassVar[str]
    ORDER: ClassVar[str] = "="
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]]
    DEFAULTS: ClassVar[dict] = {}

    @classmethod
    def fmt(cls) -> str:
        return cls.ORDER + "".join(f for _n, f in cls.LAYOUT)

    @classmethod
    def _struct(cls) -> struct.Struct:
        # compiled once per class (the agent unpacks thousands a second);
        # looked up in the class's own dict, never a base class's
        st = cls.__dict__.get("_STRUCT")
        if st is None:
            st = struct.Struct(cls.fmt())
            setattr(cls, "_STRUCT", st)
        return st

    @classmethod
    def size(cls) -> int:
        return cls._struct().size

    @classmethod
    def offsets(cls) -> dict[str, int]:
        out, fmt = {}, cls.ORDER
        for name, f in cls.LAYOUT:
            out[name] = struct.calcsize(fmt)
            fmt += f
        return out

    def _to_raw(self) -> list:
        return [getattr(self, n) for n, _f in self.LAYOUT]

    @classmethod
    def _from_raw(cls, vals: Sequence):
        # positional: the dataclass's fields are LAYOUT's, in order (_struct),
        # and a struct unpacks one value per field here (classes with arrays
        # override this); a dict of keywords per unpack was a third of
        # `status --json`'s time at 1,024 peers
        return cls(*vals)

    def pack(self) -> bytes:
        return self._struct().pack(*self._to_raw())

    @classmethod
    def unpack(cls, b: bytes):
        st = cls._struct()
        if len(b) < st.size:
            raise ValueError(f"{cls.__name__}: need {st.size} bytes, got {len(b)}")
        return cls._from_raw(st.unpack_from(b))


def _zero(fmt: str):
    count, code = fmt[:-1], fmt[-1]
    if code == "s":
        return bytes(int(count or 1))
    return [0] * int(count) if count else 0


def _struct(cls):
    """A struct mirror as a dataclass whose fields are LAYOUT's, in C order,
    zero unless DEFAULTS names another value: the layout is written once,
    where test_wire checks it against mrc.h."""
    defaults = cls.__dict__.get("DEFAULTS", {})
    cls.__annotations__ = {}
    for name, fmt in cls.LAYOUT:
        value = defaults.get(name, _zero(fmt))
        # the type itself, not its name: dataclasses parses string
        # annotations (ClassVar?) field by field, a third of the import
        cls.__annotations__[name] = type(value)
        if isinstance(value, list):
            value = field(default_factory=value.copy)
        setattr(cls, name, value)
    for name, value in cls.__dict__.get("EXTRA", {}).items():
        cls.__annotations__[name] = type(value)
        setattr(cls, name, value)
    # slots: the agent holds one per path (131,072 of them at 4,096 x 32);
    # a __dict__ each would be most of its memory
    return dataclass(cls, slots=True)


@_struct
class MrcHdr(_Struct):
    """struct mrc_hdr (on the wire, big-endian)."""
    C_NAME: ClassVar[str] = "mrc_hdr"
    ORDER: ClassVar[str] = "!"
    LAYOUT: ClassVar = (
        ("ver_type", "B"), ("flags", "B"), ("path_id", "H"), ("psn", "I"),
        ("tx_ts", "I"), ("segs", "H"), ("seg_size", "H"), ("seq0", "I"),
        ("path_seq", "B"), ("fb_path", "B"), ("epoch", "H"), ("fb_ts", "I"),
    )
    DEFAULTS = {"ver_type": MRC_VERSION << 4, "segs": 1}

    @property
    def version(self) -> int:
        return self.ver_type >> 4

    @property
    def type(self) -> int:
        return self.ver_type & 0x0F


def encode_mrc_hdr(type: int = MsgType.DATA, *, version: int = MRC_VERSION,
                   flags: int = 0, path_id: int = 0, psn: int = 0, tx_ts: int = 0,
                   segs: int = 1, seg_size: int = 0, seq0: int = 0,
                   fb_path: int = 0, fb_ts: int = 0, epoch: int = 0, path_seq: int = 0) -> bytes:
    return MrcHdr(ver_type=((version & 0xF) << 4) | (int(type) & 0xF), flags=flags,
                  path_id=path_id, psn=psn & 0xFFFFFFFF, tx_ts=tx_ts & 0xFFFFFFFF,
                  segs=segs, seg_size=seg_size, seq0=seq0 & 0xFFFFFFFF,
                  path_seq=path_seq & 0xFF, fb_path=fb_path, epoch=epoch, fb_ts=fb_ts & 0xFFFFFFFF).pack()


def decode_mrc_hdr(b: bytes) -> MrcHdr:
    return MrcHdr.unpack(b)


@_struct
class Config(_Struct):
    """struct mrc_config (mrc_cfg[0])."""
    C_NAME: ClassVar[str] = "mrc_config"
    LAYOUT: ClassVar = (("udp_port", "I"), ("overlay_ifindex", "I"),
                        ("dead_after_us", "I"), ("flags", "I"),
                        ("hedge_after_us", "I"), ("recover_probes", "I"), ("epoch", "I"),
                        ("cong_hold_us", "I"))
    DEFAULTS = {"udp_port": MRC_DEFAULT_UDP_PORT}


@_struct
class Peer(_Struct):
    """struct mrc_peer. overlay is a dotted IPv4 string."""
    C_NAME: ClassVar[str] = "mrc_peer"
    LAYOUT: ClassVar = (("n_paths", "I"), ("table", "I"), ("spray_mode", "I"),
                        ("min_active", "I"), ("overlay", "4s"), ("ev_base", "I"),
                        ("flowlet_gap_us", "I"), ("epoch", "I"))
    DEFAULTS = {"spray_mode": SprayMode.WEIGHTED,
                "min_active": 1,
                "overlay": "0.0.0.0",
                "ev_base": MRC_DEFAULT_EV_BASE}

    def _to_raw(self):
        v = _Struct._to_raw(self)   # (no zero-argument super(): slots make a new class)
        v[4] = socket.inet_aton(self.overlay or "0.0.0.0")
        return v

    @classmethod
    def _from_raw(cls, vals):
        vals = list(vals)
        vals[4] = socket.inet_ntoa(vals[4])
        return _Struct._from_raw.__func__(cls, vals)


@_struct
class Slots(_Struct):
    """struct mrc_slots: n slots in use, slot[i] = path index."""
    C_NAME: ClassVar[str] = "mrc_slots"
    LAYOUT: ClassVar = (("n", "I"), ("slot", f"{MRC_SLOTS}s"))
    DEFAULTS = {"slot": []}

    @classmethod
    def of(cls, table: Sequence[int]) -> "Slots":
        return cls(n=len(table), slot=list(table))

    def _to_raw(self):
        if not 0 <= self.n <= MRC_SLOTS or len(self.slot) > MRC_SLOTS:
            raise ValueError("slot table longer than MRC_SLOTS")
        return [self.n, bytes(self.slot).ljust(MRC_SLOTS, b"\0")]

    @classmethod
    def _from_raw(cls, vals):
        n = vals[0]
        return cls(n=n, slot=list(vals[1][:min(n, MRC_SLOTS)]))


@_struct
class Path(_Struct):
    """struct mrc_path. MACs as "aa:bb:.." strings, addresses as strings
    (IPv4 or IPv6 per family); bytes are accepted too."""
    C_NAME: ClassVar[str] = "mrc_path"
    LAYOUT: ClassVar = (
        ("ifindex", "I"), ("ev", "H"), ("family", "B"), ("plane", "B"),
        ("smac", "6s"), ("dmac", "6s"), ("saddr", "16s"), ("daddr", "16s"),
        ("weight", "I"),
    )
    DEFAULTS = {"family": 4,
                "smac": "00:00:00:00:00:00",
                "dmac": "00:00:00:00:00:00",
                "saddr": "",
                "daddr": "",
                "weight": 1}
    # Not part of the value: the path's mrc_admin entry, which has its own
    # writer (the operator). Datapath.path() fills it; pack() leaves it out.
    EXTRA = {"admin": PathState.GOOD}

    def _to_raw(self):
        v = _Struct._to_raw(self)   # (no zero-argument super(): slots make a new class)
        v[4], v[5] = mac_bytes(self.smac), mac_bytes(self.dmac)
        v[6], v[7] = addr_bytes(self.saddr, self.family), addr_bytes(self.daddr, self.family)
        return v

    @classmethod
    def _from_raw(cls, vals):
        vals = list(vals)
        vals[4], vals[5] = mac_str(vals[4]), mac_str(vals[5])
        vals[6], vals[7] = addr_str(vals[6], vals[2]), addr_str(vals[7], vals[2])
        return _Struct._from_raw.__func__(cls, vals)


@_struct
class PathLive(_Struct):
    """struct mrc_path_live (datapath-written liveness)."""
    C_NAME: ClassVar[str] = "mrc_path_live"
    # two cache lines: mrc_rx's (receipts, evidence), then mrc_tx's and
    # the rare writers' (mrc.h)
    LAYOUT: ClassVar = (("last_ack_ns", "Q"), ("last_rx_ns", "Q"), ("ev_rx_ns", "Q"), ("ev_ack_ns", "Q"),
                        ("last_rx_ts", "I"), ("last_rx_unit", "I"), ("srtt_us", "I"), ("rtt_us", "I"),
                        ("ev_cov_us", "I"), ("ev_rtt_us", "I"), ("ev_cov_max_us", "I"), ("probe_seq", "I"),
                        ("unacked_ns", "Q"), ("strike_ns", "Q"), ("fb_echo_ns", "Q"), ("bad_ns", "Q"),
                        ("good_ns", "Q"), ("fb_frame_ns", "Q"),
                        ("state", "I"), ("fb_echoed", "I"), ("flaps", "I"), ("probe_ok", "I"))
    DEFAULTS = {"state": PathState.GOOD}


def effective_state(admin: int, state: int) -> int:
    """A path's state as the datapath sprays by it: the operator's DENIED
    (mrc_admin) overrides the judgement in mrc_live (its `state`)."""
    return PathState.DENIED if admin == PathState.DENIED else state


def path_usable(path: Path, live: PathLive) -> bool:
    """May the datapath spray on this path? The control plane's copy of
    path_usable() in bpf/path.h: every Python caller asks this (or
    usable_fields, with the fields read from raw map values)."""
    return usable_fields(path.ifindex, path.family, path.admin, live.state)


def usable_fields(ifindex: int, family: int, admin: int, state: int) -> bool:
    """path_usable() on the four fields it reads."""
    return ifindex != 0 and family in (4, 6) and \
        (PathState.DENIED if admin == PathState.DENIED else state) == PathState.GOOD


@_struct
class PeerSeq(_Struct):
    """struct mrc_peer_seq."""
    C_NAME: ClassVar[str] = "mrc_peer_seq"
    # mrc_tx's cache line, then mrc_rx's (mrc.h)
    LAYOUT: ClassVar = (("psn", "Q"), ("cursor", "Q"), ("fb_cursor", "Q"), ("tx_pad", "40s"),
                        ("rx_psn_max", "Q"), ("ack_max_ns", "Q"), ("ack_max_path", "I"), ("rsvd", "I"),
                        ("fb_rl_tat", "Q"), ("cov_peak_us", "I"), ("cov_prev_us", "I"),
                        ("cov_win_ns", "Q"), ("rx_pad", "16s"))


class _Counters(_Struct):
    """Base for per-CPU counter structs: every field a __u64 or an array of
    them ("<n>Q", kept as a list); sum() adds the CPUs up."""

    def _to_raw(self) -> list:
        out = []
        for n, f in self.LAYOUT:
            v = getattr(self, n)
            if f == "Q":
                out.append(v)
            else:
                k = int(f[:-1])
                out.extend((list(v) + [0] * k)[:k])
        return out

    @classmethod
    def _from_raw(cls, vals: Sequence):
        kw, i = {}, 0
        for n, f in cls.LAYOUT:
            if f == "Q":
                kw[n] = vals[i]
                i += 1
            else:
                k = int(f[:-1])
                kw[n] = list(vals[i:i + k])
                i += k
        return cls(**kw)

    def __add__(self, other):
        kw = {}
        for n, f in self.LAYOUT:
            a, b = getattr(self, n), getattr(other, n)
            kw[n] = a + b if f == "Q" else [x + y for x, y in zip(a, b)]
        return type(self)(**kw)

    @classmethod
    def sum(cls, values: Iterable[bytes]):
        """Add up Map.lookup_percpu() results into one value."""
        tot = cls()
        for v in values:
            tot = tot + cls.unpack(v)
        return tot


@_struct
class PathStats(_Counters):
    """struct mrc_path_stats: the hot per-path counters (per CPU;
    PathStats.sum() adds CPUs up)."""
    C_NAME: ClassVar[str] = "mrc_path_stats"
    LAYOUT: ClassVar = tuple((n, "Q") for n in (
        "tx_packets", "tx_bytes", "rx_packets", "rx_bytes"))


@_struct
class PathCnt(_Counters):
    """struct mrc_path_cnt: the rare-event per-path counters (one shared copy)."""
    C_NAME: ClassVar[str] = "mrc_path_cnt"
    LAYOUT: ClassVar = tuple((n, "Q") for n in (
        "rx_ooo", "rx_dup", "probes_rx", "rx_late", "tx_steered", "rx_ce",
        "tx_hedged", "rx_lost_units", "rx_lost_segs"))


@dataclass
class PathCounters:
    """Every counter of one path: mrc_path_stats summed over the CPUs and
    mrc_path_cnt, as one value (what status, the exporter and tests read)."""
    tx_packets: int = 0
    tx_bytes: int = 0
    rx_packets: int = 0
    rx_bytes: int = 0
    rx_ooo: int = 0
    rx_dup: int = 0
    probes_rx: int = 0
    rx_late: int = 0
    tx_steered: int = 0
    rx_ce: int = 0
    tx_hedged: int = 0
    rx_lost_units: int = 0
    rx_lost_segs: int = 0

    @classmethod
    def of(cls, percpu: Iterable[bytes], cnt: bytes | None) -> "PathCounters":
        # plain tuples, not the structs' dataclasses: status reads this for
        # every path (131,072 at 4,096 peers x 32)
        hot_st, cold_st = _PATH_STATS_ST, _PATH_CNT_ST
        hot = [sum(col) for col in zip(*(hot_st.unpack_from(v) for v in percpu))] or [0] * len(PathStats.LAYOUT)
        cold = cold_st.unpack_from(cnt) if cnt else (0,) * len(PathCnt.LAYOUT)
        return cls(*hot, *cold)


_PATH_STATS_ST, _PATH_CNT_ST = struct.Struct(PathStats.fmt()), struct.Struct(PathCnt.fmt())


@_struct
class RxWin(_Counters):
    """struct mrc_rx_win: the receiver's per-peer reorder window (shared)."""
    C_NAME: ClassVar[str] = "mrc_rx_win"
    LAYOUT: ClassVar = (("max", "Q"), ("started", "Q"), ("advancing", "Q"), ("bits", f"{MRC_WIN_WORDS}Q"))


@_struct
class Reorder(_Counters):
    """struct mrc_reorder: per-peer reorder/loss counters (per CPU)."""
    C_NAME: ClassVar[str] = "mrc_reorder"
    LAYOUT: ClassVar = tuple((n, "Q") for n in (
        "rx_packets", "ooo", "dup", "lost", "late", "resync", "unmarked")) + (
        ("hist", f"{MRC_HIST_BUCKETS}Q"),)


@_struct
class PathDelay(_Struct):
    """struct mrc_path_delay: RTT of our path from fresh feedback echoes."""
    C_NAME: ClassVar[str] = "mrc_path_delay"
    LAYOUT: ClassVar = (("samples", "I"), ("last_fb_ts", "I"), ("rtt_us", "I"),
                        ("ewma_us", "I"), ("last_ns", "Q"), ("held", "I"), ("held_pad", "I"))


@_struct
class PathMtu(_Struct):
    """struct mrc_path_mtu: the MTU an ICMP too-big reported for a path
    (bpf/pmtu.h), in force for MRC_PMTU_AGE_S after s."""
    C_NAME: ClassVar[str] = "mrc_path_mtu"
    LAYOUT: ClassVar = (("mtu", "H"), ("icmps", "H"), ("s", "I"))


MRC_PMTU_AGE_S = 600


@_struct
class PathCong(_Struct):
    """struct mrc_path_cong: the per-EV congestion signals, CE marks and
    loss (bpf/congest.h), the receiver's and the sender's side of one path."""
    C_NAME: ClassVar[str] = "mrc_path_cong"
    LAYOUT: ClassVar = (("rx_ce_ns", "Q"), ("ce_ns", "Q"), ("ce_echoes", "Q"), ("hold_shift", "I"),
                        ("fb_ts", "I"), ("rx_loss_ns", "Q"), ("loss_echoes", "Q"), ("rx_seq", "I"),
                        ("rx_hole", "I"), ("rx_units", f"{8 * MRC_RX_UNITS}s"))


@_struct
class FlowletKey(_Struct):
    """struct mrc_flowlet_key."""
    C_NAME: ClassVar[str] = "mrc_flowlet_key"
    LAYOUT: ClassVar = (("peer", "I"), ("hash", "I"))


@_struct
class Flowlet(_Struct):
    """struct mrc_flowlet."""
    C_NAME: ClassVar[str] = "mrc_flowlet"
    LAYOUT: ClassVar = (("last_ns", "Q"), ("slot", "I"), ("moves", "I"))


def hist_label(b: int, n: int) -> str:
    """Range of reorder distances (PSNs) in log2 bucket b of n."""
    lo = 1 << b
    return f"{lo}+" if b == n - 1 else (str(lo) if lo == 1 else f"{lo}-{2 * lo - 1}")


@_struct
class RxKey(_Struct):
    """struct mrc_rx_key: (plane ifindex, family, source address)."""
    C_NAME: ClassVar[str] = "mrc_rx_key"
    LAYOUT: ClassVar = (("ifindex", "I"), ("family", "I"), ("addr", "16s"))
    DEFAULTS = {"family": 4, "addr": ""}

    def _to_raw(self):
        return [self.ifindex, self.family, addr_bytes(self.addr, self.family)]

    @classmethod
    def _from_raw(cls, vals):
        return cls(ifindex=vals[0], family=vals[1], addr=addr_str(vals[2], vals[1]))


@_struct
class OvlKey(_Struct):
    """struct mrc_ovl_key: an overlay prefix of either family, the key of
    mrc_ovl_owner (value: a peer index or MRC_OWNER_LOCAL). prefixlen counts
    the family word: MRC_OVL_FAMILY_BITS + the prefix's own length."""
    C_NAME: ClassVar[str] = "mrc_ovl_key"
    LAYOUT: ClassVar = (("prefixlen", "I"), ("family", "I"), ("addr", "16s"))
    DEFAULTS = {"prefixlen": MRC_OVL_FAMILY_BITS + 32, "family": 4, "addr": ""}

    def _to_raw(self):
        return [self.prefixlen, self.family, addr_bytes(self.addr, self.family)]

    @classmethod
    def _from_raw(cls, vals):
        return cls(prefixlen=vals[0], family=vals[1], addr=addr_str(vals[2], vals[1]))

    @classmethod
    def of(cls, network) -> "OvlKey":
        """The key of an IPv4 or IPv6 network or address (an address is a
        /32 or /128)."""
        net = ipaddress.ip_network(network, strict=False)
        return cls(prefixlen=MRC_OVL_FAMILY_BITS + net.prefixlen, family=net.version,
                   addr=str(net.network_address))

    @property
    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        return ipaddress.ip_network(f"{self.addr}/{self.prefixlen - MRC_OVL_FAMILY_BITS}")


@_struct
class ProbeNonce(_Struct):
    """struct mrc_probe_nonce: the outstanding probes of one path, slot
    seq % MRC_PROBE_RING holding (nonce, seq); nonce 0 = unused."""
    C_NAME: ClassVar[str] = "mrc_probe_nonce"
    LAYOUT: ClassVar = (("nonce", f"{MRC_PROBE_RING}Q"), ("seq", f"{MRC_PROBE_RING}I"))
    DEFAULTS = {"nonce": [0] * MRC_PROBE_RING, "seq": [0] * MRC_PROBE_RING}

    def _to_raw(self):
        return [*(list(self.nonce) + [0] * MRC_PROBE_RING)[:MRC_PROBE_RING],
                *(list(self.seq) + [0] * MRC_PROBE_RING)[:MRC_PROBE_RING]]

    @classmethod
    def _from_raw(cls, vals):
        return cls(nonce=list(vals[:MRC_PROBE_RING]), seq=list(vals[MRC_PROBE_RING:]))

    def add(self, seq: int, nonce: int) -> None:
        """Record probe `seq` sent with `nonce` (replacing the slot's old one)."""
        i = seq % MRC_PROBE_RING
        self.nonce[i], self.seq[i] = nonce, seq & 0xFFFFFFFF


def probe_nonce_fields(nonce: int) -> dict:
    """The PROBE header fields that carry a 64-bit nonce (echoed by the
    peer's turn-around): seq0 (high half) and fb_ts (low half)."""
    return {"seq0": (nonce >> 32) & 0xFFFFFFFF, "fb_ts": nonce & 0xFFFFFFFF}


@_struct
class RxPeer(_Struct):
    """struct mrc_rx_peer."""
    C_NAME: ClassVar[str] = "mrc_rx_peer"
    LAYOUT: ClassVar = (("peer", "I"), ("plane", "I"))


@_struct
class Event(_Struct):
    """struct mrc_event: one record of the mrc_events ring buffer."""
    C_NAME: ClassVar[str] = "mrc_event"
    LAYOUT: ClassVar = (("ts_ns", "Q"), ("peer", "I"), ("path", "H"), ("old_state", "B"),
                        ("new_state", "B"), ("reason", "I"), ("age_us", "I"))


@_struct
class HealthStats(_Counters):
    """struct mrc_hstats (per CPU; HealthStats.sum() adds CPUs up)."""
    C_NAME: ClassVar[str] = "mrc_hstats"
    LAYOUT: ClassVar = tuple((n, "Q") for n in (
        "hedged", "hedge_no_path", "dedup_drops", "dead", "recovered", "min_active_held",
        "fallback", "events_lost", "retx_steered", "rx_gso_units", "rx_gso_segs", "ecn_avoided",
        "fb_frames", "fb_limited", "paws_lifted"))


@_struct
class Dedup(_Struct):
    """struct mrc_dedup: tag << 32 | 32 PSN bits per word."""
    C_NAME: ClassVar[str] = "mrc_dedup"
    LAYOUT: ClassVar = (("w", f"{MRC_DEDUP_WORDS * 8}s"),)

    def words(self) -> list[int]:
        return list(struct.unpack(f"={MRC_DEDUP_WORDS}Q", self.w))


@_struct
class TxFlows(_Struct):
    """struct mrc_tx_flows: flow hash << 32 | end of the highest sequence sent."""
    C_NAME: ClassVar[str] = "mrc_tx_flows"
    LAYOUT: ClassVar = (("hi", f"{MRC_TX_FLOWS * 8}s"),)


@_struct
class RxFlows(_Struct):
    """struct mrc_rx_flows: flow hash << 32 | newest TCP timestamp delivered."""
    C_NAME: ClassVar[str] = "mrc_rx_flows"
    LAYOUT: ClassVar = (("ts", f"{MRC_RX_FLOWS * 8}s"),)


@_struct
class AuthInner(_Struct):
    """struct mrc_auth_inner: the inner headers a MAC covers (network order);
    an IPv4 block is its first 20 bytes (MRC_AUTH_MSG_LEN), an IPv6 one all
    44 (MRC_AUTH_MSG_LEN6)."""
    C_NAME: ClassVar[str] = "mrc_auth_inner"
    ORDER: ClassVar[str] = "!"
    LAYOUT: ClassVar = (("saddr", "4s"), ("daddr", "4s"), ("proto", "B"), ("v6", "B"), ("rsvd", "2s"),
                        ("sport", "H"), ("dport", "H"), ("rsvd2", "I"), ("saddr6", "12s"),
                        ("daddr6", "12s"))

    @classmethod
    def of_inner(cls, ip: bytes) -> "AuthInner":
        """As bpf/auth.h auth_inner() reads an inner IPv4 or IPv6 packet."""
        if len(ip) >= 40 and ip[0] >> 4 == 6:
            ai = cls(saddr=ip[20:24], daddr=ip[36:40], proto=ip[6], v6=6, saddr6=ip[8:20],
                     daddr6=ip[24:36])
            if ip[6] in (6, 17) and len(ip) >= 44:
                ai.sport, ai.dport = struct.unpack("!HH", ip[40:44])
            return ai
        if len(ip) < 20 or ip[0] >> 4 != 4 or ip[0] & 15 < 5:
            return cls()
        ai = cls(saddr=ip[12:16], daddr=ip[16:20], proto=ip[9])
        ihl = (ip[0] & 15) * 4
        frag = struct.unpack("!H", ip[6:8])[0] & 0x1FFF
        if ip[9] in (6, 17) and not frag and len(ip) >= ihl + 4:
            ai.sport, ai.dport = struct.unpack("!HH", ip[ihl:ihl + 4])
        return ai

    def block(self) -> bytes:
        """The bytes the MAC covers: 20 for IPv4 (or none), 44 for IPv6."""
        b = self.pack()
        return b if self.v6 else b[:MRC_AUTH_MSG_LEN - MRC_HDR_LEN]


@_struct
class AuthKey(_Struct):
    """struct mrc_auth_key (mrc_auth[peer])."""
    C_NAME: ClassVar[str] = "mrc_auth_key"
    LAYOUT: ClassVar = (("k0", "Q"), ("k1", "Q"), ("on", "I"), ("rsvd", "I"))

    @classmethod
    def of(cls, key: bytes | None) -> "AuthKey":
        if key is None:
            return cls()
        if len(key) != 16:
            raise ValueError("an auth key is 16 bytes")
        return cls(k0=int.from_bytes(key[:8], "little"), k1=int.from_bytes(key[8:], "little"), on=1)

    @property
    def key(self) -> bytes | None:
        return self.k0.to_bytes(8, "little") + self.k1.to_bytes(8, "little") if self.on else None


@_struct
class AclRule(_Struct):
    """struct mrc_acl_rule: family (0 any), proto (0 any), destination port
    range (0-0 any), source prefix as masked address and mask (16 bytes each,
    network order, IPv4 in the first 4)."""
    C_NAME: ClassVar[str] = "mrc_acl_rule"
    LAYOUT: ClassVar = (("family", "B"), ("proto", "B"), ("port_lo", "H"), ("port_hi", "H"),
                        ("rsvd", "H"), ("addr", "16s"), ("mask", "16s"))


@_struct
class Acl(_Struct):
    """struct mrc_acl (mrc_acl[plane ifindex]): n rules in use."""
    C_NAME: ClassVar[str] = "mrc_acl"
    LAYOUT: ClassVar = (("n", "I"), ("rsvd", "I"),
                        ("rule", f"{MRC_ACL_RULES * AclRule.size()}s"))

    @classmethod
    def of(cls, rules: list[AclRule]) -> "Acl":
        if len(rules) > MRC_ACL_RULES:
            raise ValueError(f"at most {MRC_ACL_RULES} rules")
        raw = b"".join(r.pack() for r in rules)
        return cls(n=len(rules), rule=raw + bytes(MRC_ACL_RULES * AclRule.size() - len(raw)))

    def rules(self) -> list[AclRule]:
        n, sz = min(self.n, MRC_ACL_RULES), AclRule.size()
        return [AclRule.unpack(self.rule[i * sz:(i + 1) * sz]) for i in range(n)]


ALL_STRUCTS: tuple[type[_Struct], ...] = (
    MrcHdr, Config, Peer, Slots, Path, PathLive, PeerSeq, PathStats, PathCnt, RxKey, RxPeer,
    RxWin, Reorder, FlowletKey, Flowlet, PathDelay, OvlKey, ProbeNonce)
# path health (bpf/judge.h, bpf/evidence.h)
ALL_STRUCTS += (Event, HealthStats, Dedup, TxFlows, RxFlows)
# issue #13.9 / #13.10: bpf/auth.h, bpf/acl.h
ALL_STRUCTS += (AuthInner, AuthKey, AclRule, Acl)
# bpf/congest.h
ALL_STRUCTS += (PathCong,)


@_struct
class RxEpoch(_Struct):
    """struct mrc_rx_epoch: the peer's current and previous epoch, each
    | MRC_EPOCH_SEEN (0: none)."""
    C_NAME: ClassVar[str] = "mrc_rx_epoch"
    LAYOUT: ClassVar = (("cur", "I"), ("prev", "I"))


@_struct
class CtlReq(_Struct):
    """struct mrc_ctl_req: the frame the agent runs mrc_ctl on."""
    C_NAME: ClassVar[str] = "mrc_ctl_req"
    LAYOUT: ClassVar = (("op", "I"), ("peer", "I"), ("path", "I"), ("rsvd", "I"))


@_struct
class ProbeOut(_Struct):
    """struct mrc_probe_out: one probe of a generator run."""
    C_NAME: ClassVar[str] = "mrc_probe_out"
    LAYOUT: ClassVar = (("ifindex", "I"), ("len", "H"), ("mrc_off", "H"), ("peer", "I"), ("seq", "I"),
                        ("nonce", "Q"), ("frame", f"{MRC_PROBE_FRAME_MAX}s"))


@_struct
class ProbeRun(_Struct):
    """struct mrc_probe_run: the tail of a generator run's input frame."""
    C_NAME: ClassVar[str] = "mrc_probe_run"
    LAYOUT: ClassVar = (("gen", "I"), ("n", "I"))


ALL_STRUCTS += (RxEpoch, CtlReq, ProbeOut, ProbeRun)


# path MTU (bpf/pmtu.h)
ALL_STRUCTS += (PathMtu,)


def replace(obj, **changes):
    """dataclasses.replace, re-exported for callers building map values."""
    return dataclasses.replace(obj, **changes)


@_struct
class Sizing(_Struct):
    """struct mrc_sizing: how many entries the per-peer maps have (`peers`)
    and each peer's stretch of the per-path maps (`1 << path_shift`, the
    stride). The loader writes it into every object's .rodata.sizing and
    sizes the maps to match (objects.load_objects); a running datapath's
    sizing follows from its maps' sizes (of_maps), so its readers never
    need the config that made it."""
    C_NAME: ClassVar[str] = "mrc_sizing"
    LAYOUT: ClassVar = (("peers", "I"), ("path_shift", "I"))
    DEFAULTS: ClassVar = {"peers": MRC_DEFAULT_PEERS, "path_shift": MRC_PATH_SHIFT_MAX}

    def __post_init__(self):
        if not (1 <= self.peers <= MRC_PEERS_LIMIT and 0 <= self.path_shift <= MRC_PATH_SHIFT_MAX):
            raise ValueError(f"sizing {self.peers} peers / path shift {self.path_shift} out of range")

    @classmethod
    def of(cls, peers: int, paths: int) -> "Sizing":
        """Room for `peers` peers of up to `paths` paths each (the stride:
        the next power of two)."""
        return cls(peers=peers, path_shift=max(0, paths - 1).bit_length())

    @classmethod
    def of_maps(cls, peer_entries: int, path_entries: int) -> "Sizing":
        """The sizing of maps this big (mrc_peers, mrc_paths)."""
        return cls(peers=peer_entries, path_shift=(path_entries // peer_entries).bit_length() - 1)

    @property
    def stride(self) -> int:
        return 1 << self.path_shift

    @property
    def path_entries(self) -> int:
        return self.peers << self.path_shift

    def path_idx(self, peer: int, path: int) -> int:
        """MRC_PATH_IDX(peer, path): index into the per-path maps (mrc_paths,
        mrc_live, mrc_path_stats, ...)."""
        if not (0 <= peer < self.peers and 0 <= path < self.stride):
            raise ValueError(f"peer {peer} / path {path} out of range "
                             f"({self.peers} peers x {self.stride} paths)")
        return peer << self.path_shift | path

    def path_key(self, peer: int, path: int) -> bytes:
        """The map key of (peer, path) in the per-path maps."""
        return u32(self.path_idx(peer, path))


# what an object loaded as compiled has (helper tests; load_objects() given no sizing)
DEFAULT_SIZING = Sizing()
ALL_STRUCTS += (Sizing,)
