"""The testbed's cross traffic: a paced UDP stream that costs its sender
little CPU, so that it keeps its rate on a machine the transfer under test
keeps busy. iperf3 sends one datagram per system call (27,000 a second at
300 Mbit/s) and, on 2 cores shared with mrc's datapath, sent about half of
what it was asked (docs/benchmarks/cross.md). Here each send carries up to
SEGS_MAX datagrams as one UDP GSO buffer (UDP_SEGMENT): the kernel cuts it
into datagrams on the way out, and the sender makes one call per half
millisecond or so. The far end counts what arrives with an nftables rule
and drops it there (fabric.Fabric.cross_traffic), so no receiving process
competes for the CPU either. Its command line is `python -m
mrcctl.cli.udpgen`."""

from __future__ import annotations

import socket
import time

UDP_SEGMENT = 103           # linux/udp.h: the GSO size of a send, per socket or per call
PAYLOAD = 1400              # bytes per datagram, iperf3's -l 1400 before
SEGS_MAX = 32               # datagrams per send at most (64 KiB is the kernel's limit)
SEND_EVERY_S = 0.0005       # the pacing step the send size aims at
CATCH_UP_S = 0.004          # at most this much sending time is made up after a stall


def segs_per_send(rate_bps: int, payload: int = PAYLOAD) -> int:
    """Datagrams per send for about one send per SEND_EVERY_S at rate_bps."""
    per_s = rate_bps / (8 * payload)
    return max(1, min(SEGS_MAX, round(per_s * SEND_EVERY_S)))


def udp_blast(dst: str, port: int, rate_bps: int, seconds: float, tos: int = 0,
              payload: int = PAYLOAD) -> dict:
    """Send to dst:port at rate_bps of UDP payload (what iperf3's -b means)
    for `seconds`. Returns what was sent, in iperf3's terms, and when the
    first send went (`started`, CLOCK_MONOTONIC, which every namespace
    shares)."""
    segs = segs_per_send(rate_bps, payload)
    buf = bytes(payload * segs)
    step = payload * segs * 8 / rate_bps
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        if tos:
            s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
        if segs > 1:
            s.setsockopt(socket.IPPROTO_UDP, UDP_SEGMENT, payload)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        s.connect((dst, port))
        t0 = time.monotonic()
        end, due, sends, errors = t0 + seconds, t0, 0, 0
        while True:
            now = time.monotonic()
            if now >= end:
                break
            if due > now:
                time.sleep(due - now)
                continue
            try:
                s.send(buf)
                sends += 1
            except OSError:        # a full socket buffer, a refusal: counted, not fatal
                errors += 1
            due = max(due + step, now - CATCH_UP_S)
        took = time.monotonic() - t0
    finally:
        s.close()
    sent = sends * segs
    return {"started": t0, "packets": sent, "bytes": sent * payload, "seconds": round(took, 4),
            "bits_per_second": sent * payload * 8 / took if took else 0.0,
            "segs_per_send": segs, "send_errors": errors}
