"""The demo's TCP stream: a time-bounded stream with sha256 at both ends
(scripts/xfer.py sends a fixed size from memory, which does not suit a
fixed duration). Its command line is `python -m mrcctl.cli.stream`."""

from __future__ import annotations

import hashlib
import json
import random
import socket
import time

PORT = 5201
POOL = 4 << 20
CHUNK = 64 << 10


def _pool(seed: int) -> bytes:
    return random.Random(seed).randbytes(POOL + CHUNK)


def stream_send(to: str, port: int, seconds: float, seed: int = 1, timeout: float = 30.0) -> dict:
    pool = memoryview(_pool(seed))
    deadline = time.monotonic() + 10
    while True:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect((to, port))
            break
        except OSError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    h = hashlib.sha256()
    total = 0
    i = 0
    t0 = time.monotonic()
    end = t0 + seconds
    while time.monotonic() < end:
        # successive chunks start at scattered offsets so no two are alike
        off = (i * 40503 * 64) % POOL
        chunk = pool[off:off + CHUNK]
        s.sendall(chunk)
        h.update(chunk)
        total += CHUNK
        i += 1
    s.shutdown(socket.SHUT_WR)
    s.recv(1)   # the receiver closes once it has everything
    secs = time.monotonic() - t0
    s.close()
    return {"role": "send", "bytes": total, "sha256": h.hexdigest(), "seconds": round(secs, 3)}


def stream_recv(bind: str, port: int, timeout: float) -> dict:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((bind, port))
    srv.listen(1)
    srv.settimeout(timeout)
    print(json.dumps({"listening": f"{bind}:{port}"}), flush=True)
    conn, _ = srv.accept()
    conn.settimeout(timeout)
    h = hashlib.sha256()
    total = 0
    buf = bytearray(1 << 18)
    view = memoryview(buf)
    t0 = time.monotonic()
    while True:
        n = conn.recv_into(buf)
        if not n:
            break
        h.update(view[:n])
        total += n
    secs = time.monotonic() - t0
    conn.close()
    srv.close()
    return {"role": "recv", "bytes": total, "sha256": h.hexdigest(), "seconds": round(secs, 3)}
