"""How the agent's probes leave: many frames per system call.

* xdp_features: what a device's driver can do with XDP frames, from the
  kernel's netdev generic-netlink family (kernel >= 6.3): one dump gives
  every device of the namespace with its xdp-features bits. The probe
  generator needs NETDEV_XDP_ACT_NDO_XMIT on a plane: a frame redirected
  to a device without it is dropped, and nothing tells the sender (a veth
  advertises it only while its peer has an XDP program or GRO on).
* send_frames: sendmmsg(2) on an AF_PACKET socket, the default sender.
* root_qdiscs: each device's root queue and shaper rate (adaptive weights).
* feature / set_feature: a device's ethtool features (`ethtool -k/-K`) by
  the SIOCETHTOOL ioctl: `up` turns UDP GSO off on virtual planes, and
  pyroute2's ethtool module cost it ~50 ms to import and ask with.
* rtnl, attrs, nested: one route-netlink request and its attributes, for
  the reads that must not wait for pyroute2's import or pay its parsing
  (topology.link_kind before `up` verifies, the agent's neighbour table).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import socket
import struct

NETLINK_GENERIC = 16
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME = 1, 2
NETDEV_CMD_DEV_GET = 1
NETDEV_A_DEV_IFINDEX, NETDEV_A_DEV_XDP_FEATURES = 1, 3
NETDEV_XDP_ACT_NDO_XMIT = 1 << 2
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
F_REQUEST, F_DUMP = 0x1, 0x300
F_ACK, F_REPLACE, F_CREATE = 0x4, 0x100, 0x400
_HDR = struct.Struct("=IHHII")
_GENL = struct.Struct("=BBH")
_ATTR = struct.Struct("=HH")


def attrs(buf: bytes, off: int, end: int) -> dict[int, bytes]:
    """type -> value of the netlink attributes in buf[off:end]."""
    out = {}
    while off + 4 <= end:
        ln, typ = _ATTR.unpack_from(buf, off)
        if ln < 4:
            break
        out[typ & 0x3FFF] = buf[off + 4:off + ln]
        off += (ln + 3) & ~3
    return out


def messages(buf: bytes):
    """(type, seq, payload start, end) of each netlink message in a buffer
    one recv() returned; stops at one whose length cannot be right."""
    off = 0
    while off + _HDR.size <= len(buf):
        ln, mtype, _fl, seq, _pid = _HDR.unpack_from(buf, off)
        if ln < _HDR.size:
            return
        yield mtype, seq, off + _HDR.size, off + ln
        off += (ln + 3) & ~3


def _exchange(s: socket.socket, typ: int, flags: int, body: bytes) -> list[tuple[bytes, int, int]]:
    """Send one netlink request; (buffer, payload start, end) of every
    answer (a dump's parts until NLMSG_DONE); OSError on an error answer."""
    s.send(_HDR.pack(_HDR.size + len(body), typ, flags, 1, 0) + body)
    out = []
    while True:
        buf = s.recv(1 << 16)
        off = 0
        while off + _HDR.size <= len(buf):
            ln, mtype, _fl, _seq, _pid = _HDR.unpack_from(buf, off)
            if ln < _HDR.size:
                return out
            if mtype == _NLMSG_DONE:
                return out
            if mtype == _NLMSG_ERROR:
                err = struct.unpack_from("=i", buf, off + _HDR.size)[0]
                if err:
                    raise OSError(-err, "netlink")
                return out
            out.append((buf, off + _HDR.size, off + ln))
            off += (ln + 3) & ~3
        if not flags & F_DUMP and out:
            return out


def nested(outer: dict[int, bytes], typ: int) -> dict[int, bytes]:
    """The attributes inside attribute `typ` ({} when it is absent)."""
    inner = outer.get(typ, b"")
    return attrs(inner, 0, len(inner))


def _request(s: socket.socket, typ: int, flags: int, cmd: int, nlas: bytes = b"") -> list[dict[int, bytes]]:
    """One generic-netlink request: the attributes of every answer."""
    return [attrs(buf, off + _GENL.size, end)
            for buf, off, end in _exchange(s, typ, flags, _GENL.pack(cmd, 1, 0) + nlas)]


def rtnl(typ: int, flags: int, body: bytes) -> list[tuple[bytes, int, int]]:
    """One route-netlink request on a socket of its own: (buffer, payload
    start, end) of every answer; OSError if the kernel refuses it."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as s:
        s.bind((0, 0))
        s.settimeout(2.0)
        return _exchange(s, typ, flags, body)


RTNL_BATCH = 256      # requests per send: their answers fit the socket's receive buffer


def rtnl_batch(typ: int, bodies: list[bytes], flags: int = 0) -> list[tuple[bytes, int, int] | int]:
    """Many single-answer route-netlink requests of one type on one socket,
    sent RTNL_BATCH to a send (the kernel answers each message of a send in
    turn, an error included): per request, (buffer, payload start, end) of
    its answer or the errno it failed with (ETIMEDOUT: no answer in 2 s).
    One request per system call through pyroute2 cost ~4 ms of CPU each:
    a thousand routed peers' next hops took the agent's whole core.
    `flags` beside NLM_F_REQUEST: with F_ACK (changes, which answer
    nothing else) a request that succeeded gives 0."""
    ack = bool(flags & F_ACK)
    out: list[tuple[bytes, int, int] | int] = [errno.ETIMEDOUT] * len(bodies)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as s:
        s.bind((0, 0))
        s.settimeout(2.0)
        for at in range(0, len(bodies), RTNL_BATCH):
            chunk = bodies[at:at + RTNL_BATCH]
            # seq numbers from 1: the answer's seq says which request it is for
            s.send(b"".join(_HDR.pack(_HDR.size + len(b), typ, F_REQUEST | flags, at + k + 1, 0) + b
                            for k, b in enumerate(chunk)))
            pending = len(chunk)
            while pending:
                try:
                    buf = s.recv(1 << 16)
                except (socket.timeout, BlockingIOError):
                    break
                for mtype, seq, start, end in messages(buf):
                    k = seq - 1
                    if at <= k < at + len(chunk) and out[k] == errno.ETIMEDOUT:
                        if mtype == _NLMSG_ERROR:
                            err = -struct.unpack_from("=i", buf, start)[0]
                            out[k] = err if err or ack else errno.EPROTO
                        else:
                            out[k] = (buf, start, end)
                        pending -= 1
    return out


def nla(typ: int, payload: bytes) -> bytes:
    """One netlink attribute, padded."""
    raw = _ATTR.pack(4 + len(payload), typ) + payload
    return raw + bytes(-len(raw) % 4)


def xdp_features() -> dict[int, int] | None:
    """ifindex -> NETDEV_XDP_ACT_* bits of every device in this network
    namespace, or None where the kernel has no netdev family."""
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC) as s:
            s.bind((0, 0))
            s.settimeout(2.0)
            fam = _request(s, GENL_ID_CTRL, F_REQUEST, CTRL_CMD_GETFAMILY,
                           nla(CTRL_ATTR_FAMILY_NAME, b"netdev\0"))
            if not fam or CTRL_ATTR_FAMILY_ID not in fam[0]:
                return None
            fid = struct.unpack_from("=H", fam[0][CTRL_ATTR_FAMILY_ID])[0]
            out = {}
            for a in _request(s, fid, F_REQUEST | F_DUMP, NETDEV_CMD_DEV_GET):
                if NETDEV_A_DEV_IFINDEX in a and NETDEV_A_DEV_XDP_FEATURES in a:
                    out[struct.unpack_from("=I", a[NETDEV_A_DEV_IFINDEX])[0]] = \
                        struct.unpack_from("=Q", a[NETDEV_A_DEV_XDP_FEATURES])[0]
            return out
    except OSError:
        return None


# ------------------------------------------------------------------ root qdiscs

_RTM_GETQDISC = 38
_TCMSG = struct.Struct("=BxxxiIII")
_TC_H_ROOT = 0xFFFFFFFF
_TCA_KIND, _TCA_OPTIONS, _TCA_STATS2 = 1, 2, 7
_TCA_STATS_QUEUE = 3
_TCA_TBF_PARMS, _TCA_TBF_RATE64 = 1, 4


def root_qdiscs() -> dict[int, tuple[int, int | None]]:
    """ifindex -> (backlog bytes, shaper rate in bytes/s or None) of each
    device's root qdisc in this namespace; the rate where the qdisc is a
    tbf. One RTM_GETQDISC dump parsed here (the adaptive weights read it
    every few intervals: through pyroute2 a dump cost 12 ms of CPU)."""
    out: dict[int, tuple[int, int | None]] = {}
    try:
        answers = rtnl(_RTM_GETQDISC, F_REQUEST | F_DUMP, _TCMSG.pack(0, 0, 0, 0, 0))
    except OSError:
        return out
    for buf, off, end in answers:
        _fam, ifindex, _handle, parent, _info = _TCMSG.unpack_from(buf, off)
        if parent != _TC_H_ROOT:
            continue
        a = attrs(buf, off + _TCMSG.size, end)
        queue = nested(a, _TCA_STATS2).get(_TCA_STATS_QUEUE, b"")
        backlog = struct.unpack_from("=I", queue, 4)[0] if len(queue) >= 8 else 0
        rate = None
        if a.get(_TCA_KIND, b"").rstrip(b"\0") == b"tbf":
            opts = nested(a, _TCA_OPTIONS)
            if len(opts.get(_TCA_TBF_RATE64, b"")) >= 8:
                rate = struct.unpack_from("=Q", opts[_TCA_TBF_RATE64])[0]
            elif len(opts.get(_TCA_TBF_PARMS, b"")) >= 12:
                rate = struct.unpack_from("=I", opts[_TCA_TBF_PARMS], 8)[0]   # tc_ratespec.rate
        out[ifindex] = (backlog, rate or None)
    return out


# ------------------------------------------------------------------ sendmmsg(2)

class _Iov(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _MsgHdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32), ("iov", ctypes.c_void_p),
                ("iovlen", ctypes.c_size_t), ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


class _MMsgHdr(ctypes.Structure):
    _fields_ = [("hdr", _MsgHdr), ("len", ctypes.c_uint)]


_libc = None


def send_frames(fd: int, frames: list[bytes]) -> list[int]:
    """Send each frame as one datagram on a connected or bound socket (an
    AF_PACKET socket bound to a device) by sendmmsg(2): one system call
    for many. Returns the indexes of the frames the kernel refused (queue
    full, device down); the others were sent, as one send() each would."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
    n = len(frames)
    if not n:
        return []
    blob = ctypes.create_string_buffer(b"".join(frames), sum(map(len, frames)))
    base = ctypes.addressof(blob)
    iovs = (_Iov * n)()
    msgs = (_MMsgHdr * n)()
    off = 0
    for i, f in enumerate(frames):
        iovs[i].base, iovs[i].len = base + off, len(f)
        off += len(f)
        msgs[i].hdr.iov = ctypes.addressof(iovs[i])
        msgs[i].hdr.iovlen = 1
    refused, at = [], 0
    while at < n:
        r = _libc.sendmmsg(fd, ctypes.byref(msgs, at * ctypes.sizeof(_MMsgHdr)), n - at, 0)
        if r <= 0:
            refused.append(at)     # this one failed: the next ones may go
            at += 1
        else:
            at += r
    return refused


# ------------------------------------------------------------------ ethtool features
# <linux/ethtool.h>, <linux/sockios.h>
SIOCETHTOOL = 0x8946
ETHTOOL_GSTRINGS, ETHTOOL_GSSET_INFO = 0x1B, 0x37
ETHTOOL_GFEATURES, ETHTOOL_SFEATURES = 0x3A, 0x3B
ETH_SS_FEATURES = 4
ETH_GSTRING_LEN = 32
_IFREQ = struct.Struct("16sP16x")       # ifr_name, ifr_data (struct ifreq: 40 bytes)


def _ethtool(s: socket.socket, dev: str, req: ctypes.Array) -> None:
    fcntl.ioctl(s, SIOCETHTOOL, _IFREQ.pack(dev.encode(), ctypes.addressof(req)))


def _feature_bit(s: socket.socket, dev: str, name: str) -> int | None:
    """The bit of feature `name` in the device's feature words (its index
    among the ETH_SS_FEATURES strings), None when the kernel has no such
    feature."""
    info = ctypes.create_string_buffer(struct.pack("=IIQI", ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_FEATURES, 0))
    _ethtool(s, dev, info)
    mask, count = struct.unpack_from("=QI", info, 8)
    if not mask & (1 << ETH_SS_FEATURES):
        return None
    strings = ctypes.create_string_buffer(struct.pack("=III", ETHTOOL_GSTRINGS, ETH_SS_FEATURES, count)
                                          + bytes(count * ETH_GSTRING_LEN))
    _ethtool(s, dev, strings)
    want = name.encode()
    for i in range(count):
        at = 12 + i * ETH_GSTRING_LEN
        if strings.raw[at:at + ETH_GSTRING_LEN].split(b"\0", 1)[0] == want:
            return i
    return None


def _feature_words(s: socket.socket, dev: str, bit: int) -> tuple[int, int, int]:
    """(available, requested, active) word holding `bit`, from ETHTOOL_GFEATURES."""
    n = bit // 32 + 1
    req = ctypes.create_string_buffer(struct.pack("=II", ETHTOOL_GFEATURES, n) + bytes(16 * n))
    _ethtool(s, dev, req)
    return struct.unpack_from("=III", req, 8 + 16 * (bit // 32))


def feature(dev: str, name: str) -> bool | None:
    """Whether ethtool feature `name` is on (`ethtool -k`); None when the
    device has no such feature or cannot change it (not in its
    hw_features: "[fixed]")."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        bit = _feature_bit(s, dev, name)
        if bit is None:
            return None
        available, _requested, active = _feature_words(s, dev, bit)
    m = 1 << (bit % 32)
    return bool(active & m) if available & m else None


def set_feature(dev: str, name: str, on: bool) -> None:
    """`ethtool -K dev name on|off`. OSError when the device has no such
    feature or the kernel refuses the change."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        bit = _feature_bit(s, dev, name)
        if bit is None:
            raise OSError(f"{dev}: no ethtool feature {name}")
        n, m = bit // 32 + 1, 1 << (bit % 32)
        blocks = bytearray(8 * n)         # ethtool_set_features_block: valid, requested
        struct.pack_into("=II", blocks, 8 * (bit // 32), m, m if on else 0)
        req = ctypes.create_string_buffer(struct.pack("=II", ETHTOOL_SFEATURES, n) + bytes(blocks))
        _ethtool(s, dev, req)
        if bool(_feature_words(s, dev, bit)[2] & m) != on:
            raise OSError(f"{dev}: the kernel kept {name} {'off' if on else 'on'}")
