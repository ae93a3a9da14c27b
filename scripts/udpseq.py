#!/usr/bin/env python3
"""Sequence-numbered one-way UDP: a paced sender and a receiver that counts
what never arrived.

    udpseq.py recv BIND PORT SECONDS READY_FILE
    udpseq.py send DST PORT MBIT SECONDS SIZE

Each datagram starts with its 32-bit sequence number. The receiver prints
{"received", "top", "missing"} (missing: numbers below the highest seen
that never came), the sender {"sent", "pps", "send_failed"} (numbers its
socket refused, which never reached the network). Bounded by SECONDS (the
receiver also gives up after 2 s of silence). Standard library only: it runs
inside test namespaces with any python3.
"""

from __future__ import annotations

import json
import socket
import sys
import time

SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)   # linux/socket.h; Python names it on few builds


def recv(bind: str, port: int, secs: float, ready: str) -> dict:
    s = socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET, socket.SOCK_DGRAM)
    # a receiver that falls behind for milliseconds (a busy host) needs the
    # room, or its socket drops what the network delivered; net.core.rmem_max
    # caps SO_RCVBUF, root may exceed it
    try:
        s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
    except OSError:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    s.bind((bind, port))
    open(ready, "w").close()
    s.settimeout(2)
    seen = bytearray(1 << 22)
    n = top = 0
    end = time.monotonic() + secs
    try:
        while time.monotonic() < end:
            k = int.from_bytes(s.recv(65536)[:4], "big")
            if k < len(seen) and not seen[k]:
                seen[k] = 1
                n += 1
                top = max(top, k)
    except socket.timeout:
        pass
    return {"received": n, "top": top, "missing": sum(1 for k in range(top) if not seen[k])}


def send(dst: str, port: int, mbit: float, secs: float, size: int) -> dict:
    s = socket.socket(socket.AF_INET6 if ":" in dst else socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    s.connect((dst, port))
    pps = mbit * 1e6 / 8 / size
    pad = bytes(size - 4)
    k, failed, t0 = 0, 0, time.monotonic()
    while True:
        el = time.monotonic() - t0
        if el >= secs:
            break
        while k < el * pps:
            try:
                s.send(k.to_bytes(4, "big") + pad)
            except OSError:
                failed += 1   # never left this host: not the network's loss
            k += 1
        time.sleep(0.0002)
    return {"sent": k, "pps": pps, "send_failed": failed}


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[0] == "recv":
        out = recv(argv[1], int(argv[2]), float(argv[3]), argv[4])
    elif len(argv) == 6 and argv[0] == "send":
        out = send(argv[1], int(argv[2]), float(argv[3]), float(argv[4]), int(argv[5]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
