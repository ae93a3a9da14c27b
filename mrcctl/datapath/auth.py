"""SipHash-2-4 and the MRC MAC (bpf/auth.h) in Python: the agent signs its
probes with it, and the tests hold the BPF implementation to it (and both
to the SipHash paper's vectors, tests/unit/test_bpf_helpers.py).

Speed is no concern here: the agent signs one 48-byte message per probe.
"""

from __future__ import annotations

import struct

from . import abi as wire

_M = (1 << 64) - 1


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _M


def _round(v0: int, v1: int, v2: int, v3: int) -> tuple[int, int, int, int]:
    v0 = (v0 + v1) & _M
    v1 = _rotl(v1, 13) ^ v0
    v0 = _rotl(v0, 32)
    v2 = (v2 + v3) & _M
    v3 = _rotl(v3, 16) ^ v2
    v0 = (v0 + v3) & _M
    v3 = _rotl(v3, 21) ^ v0
    v2 = (v2 + v1) & _M
    v1 = _rotl(v1, 17) ^ v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def siphash24(key: bytes, msg: bytes) -> int:
    """SipHash-2-4 of msg under a 16-byte key, as a 64-bit integer (its
    little-endian bytes are the reference implementation's output)."""
    if len(key) != 16:
        raise ValueError("SipHash keys are 16 bytes")
    k0, k1 = struct.unpack("<QQ", key)
    v0, v1 = 0x736F6D6570736575 ^ k0, 0x646F72616E646F6D ^ k1
    v2, v3 = 0x6C7967656E657261 ^ k0, 0x7465646279746573 ^ k1
    whole = len(msg) - len(msg) % 8
    for off in range(0, whole, 8):
        m = int.from_bytes(msg[off:off + 8], "little")
        v3 ^= m
        v0, v1, v2, v3 = _round(*_round(v0, v1, v2, v3))
        v0 ^= m
    last = ((len(msg) & 0xFF) << 56) | int.from_bytes(msg[whole:], "little")
    v3 ^= last
    v0, v1, v2, v3 = _round(*_round(v0, v1, v2, v3))
    v0 ^= last
    v2 ^= 0xFF
    for _ in range(4):
        v0, v1, v2, v3 = _round(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


def mac(key: bytes, mrc_hdr: bytes, inner: bytes | None = None) -> bytes:
    """The MAC behind an MRC header (which must carry MRC_F_AUTH): over the
    header and the inner block of the inner IPv4 or IPv6 packet `inner`
    (None for PROBE / PROBE_REPLY: zeros)."""
    block = (wire.AuthInner.of_inner(inner) if inner is not None else wire.AuthInner()).block()
    msg = bytes(mrc_hdr[:wire.MRC_HDR_LEN]) + block
    assert len(msg) in (wire.MRC_AUTH_MSG_LEN, wire.MRC_AUTH_MSG_LEN6)
    return siphash24(key, msg).to_bytes(8, "little")
