#!/usr/bin/env python3
"""Bounded TCP transfers with sha256 at both ends, and a timestamping receiver.

    xfer.py recv --bind 172.31.0.2 --port 5001 [--timeline out.json --bucket-ms 10]
    xfer.py send --to 172.31.0.2 --port 5001 --bytes 64M [--seed 1]

Each side prints one JSON line: bytes, sha256, seconds (and the receiver's
goodput timeline when asked). Every socket has a timeout and the receiver
accepts exactly one connection, so nothing here can run forever.
Standard library only: it runs inside test namespaces with any python3.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import signal
import socket
import sys
import time

CHUNK = 256 * 1024
SO_MAX_PACING_RATE = 47


def parse_size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KMG" else s) * mult)


def family_of(addr: str) -> int:
    """IPv6 for an address with a colon (an IPv6 overlay), else IPv4."""
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def payload(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


def recv(bind: str, port: int, timeout: float, timeline: str | None, bucket_ms: float,
         ready_file: str | None = None) -> dict:
    srv = socket.socket(family_of(bind), socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((bind, port))
    srv.listen(1)
    srv.settimeout(timeout)
    if ready_file:
        open(ready_file, "w").close()
    print(json.dumps({"listening": f"{bind}:{port}"}), flush=True)
    conn, peer = srv.accept()
    conn.settimeout(timeout)
    h = hashlib.sha256()
    total = 0
    buckets: dict[int, int] = {}
    t0 = time.monotonic()
    reset = False
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while True:
        try:
            n = conn.recv_into(buf)
        except ConnectionResetError:
            reset = True
            break
        if not n:
            break
        h.update(view[:n])
        total += n
        if timeline:
            b = int((time.monotonic() - t0) * 1000 / bucket_ms)
            buckets[b] = buckets.get(b, 0) + n
    secs = time.monotonic() - t0
    conn.close()
    srv.close()
    out = {"role": "recv", "bytes": total, "sha256": h.hexdigest(), "seconds": round(secs, 4),
           "reset": reset, "peer": peer[0], "t0": t0}
    if timeline:
        last = max(buckets) if buckets else 0
        series = [buckets.get(i, 0) for i in range(last + 1)]
        with open(timeline, "w") as f:
            json.dump({"bucket_ms": bucket_ms, "bytes": series}, f)
        out["timeline"] = timeline
    return out


def send(to: str, port: int, nbytes: int, seed: int, timeout: float, connect_wait: float,
         max_rate: int = 0, repeat: int = 1, seconds: float = 0) -> dict:
    data = payload(seed, nbytes)
    deadline = time.monotonic() + connect_wait
    while True:
        s = socket.socket(family_of(to), socket.SOCK_STREAM)
        s.settimeout(timeout)
        if max_rate:
            # TCP's own pacing (no fq needed): a sender below the path
            # capacity sees no congestion loss, so retransmissions measure
            # only what the network did (failover benchmark and tests)
            s.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, max_rate)
        try:
            s.connect((to, port))
            break
        except (ConnectionRefusedError, socket.timeout, OSError):
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    t0 = time.monotonic()
    view = memoryview(data)
    # repeat: streams longer than one buffer can be built (random.randbytes
    # stops at 256 MiB) without holding them in memory; seconds: stop after
    # that long instead, at a chunk boundary
    stop = t0 + seconds if seconds else None
    # SIGUSR1 ends the stream early, as the time limit would (a caller
    # that streams "until done": bench_scale's churn)
    asked = []
    signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))
    total = 0
    for _ in range(repeat if not stop else 1 << 30):
        for off in range(0, nbytes, CHUNK):
            if asked or (stop and time.monotonic() >= stop):
                break
            s.sendall(view[off:off + CHUNK])
            total += min(CHUNK, nbytes - off)
        else:
            if not asked:
                continue
        break
    s.shutdown(socket.SHUT_WR)
    # Wait for the receiver to close so "seconds" covers delivery, not buffering.
    s.recv(1)
    secs = time.monotonic() - t0
    s.close()
    # hashed afterwards so that hashing takes no CPU from the transfer
    h = hashlib.sha256()
    for _ in range(total // nbytes):
        h.update(data)
    h.update(view[:total % nbytes])
    return {"role": "send", "bytes": total, "sha256": h.hexdigest(),
            "seconds": round(secs, 4), "gbps": round(total * 8 / secs / 1e9, 3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("recv")
    r.add_argument("--bind", default="0.0.0.0")
    r.add_argument("--port", type=int, default=5001)
    r.add_argument("--timeout", type=float, default=60)
    r.add_argument("--timeline")
    r.add_argument("--bucket-ms", type=float, default=10)
    r.add_argument("--ready-file")
    s = sub.add_parser("send")
    s.add_argument("--to", required=True)
    s.add_argument("--port", type=int, default=5001)
    s.add_argument("--bytes", default="64M")
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--timeout", type=float, default=60)
    s.add_argument("--connect-wait", type=float, default=10)
    s.add_argument("--repeat", type=int, default=1, help="send the payload this many times")
    s.add_argument("--seconds", type=float, default=0,
                   help="send the payload over and over for this long instead (bounded by --timeout)")
    s.add_argument("--max-rate", type=parse_size, default=0, metavar="BYTES_PER_S",
                   help="pace the connection (SO_MAX_PACING_RATE), e.g. 25M")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "recv":
            out = recv(a.bind, a.port, a.timeout, a.timeline, a.bucket_ms, a.ready_file)
        else:
            out = send(a.to, a.port, parse_size(a.bytes), a.seed, a.timeout, a.connect_wait, a.max_rate, a.repeat, a.seconds)
    except (OSError, socket.timeout) as e:
        print(json.dumps({"role": a.cmd, "error": f"{type(e).__name__}: {e}"}), flush=True)
        return 1
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
