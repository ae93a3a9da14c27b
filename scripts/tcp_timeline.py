#!/usr/bin/env python3
"""A TCP trace of bench_failover.py --trace as a timeline from the fault.

    python3 scripts/tcp_timeline.py TRACE [--every-ms 1]

One line per congestion-state change into or out of recovery (3) or loss
(4, an RTO), per retransmission, and the sender's ACK state (snd_una and
data outstanding, relative to the first ACK; cwnd, ssthresh, srtt) at most
every --every-ms; `rx` counts the segments the receiver's TCP took in so
far, so a stall shows as rx standing still. Standard library only.
"""

from __future__ import annotations

import argparse
import re
import sys

LINE = re.compile(r" (\d+\.\d+): (\w+): (.*)")


def timeline(lines, every_ms: float, sender_prefix: str | None = None):
    t0 = base = sender = None
    state, rx, last = None, 0, -1e9
    for line in lines:
        m = LINE.search(line)
        if not m:
            continue
        t, kind, rest = float(m[1]), m[2], m[3]
        if kind == "tracing_mark_write" and "FAULT" in rest:
            t0 = t
            continue
        if t0 is None:
            continue
        ms = (t - t0) * 1000
        if kind == "tcp_probe":
            kv = dict(x.split("=", 1) for x in rest.split() if "=" in x)
            # the sender is the end whose probes carry ACKs: the first
            # tcp_probe is an ACK arriving at it or data arriving at the peer;
            # data segments are the ones with a payload
            if sender is None and int(kv.get("data_len", 0)) == 0:
                sender = kv["src"].rsplit(":", 1)[0]
            if sender is None or not kv["src"].startswith(sender + ":"):
                rx += 1
                continue
            una, nxt = int(kv["snd_una"], 16), int(kv["snd_nxt"], 16)
            base = una if base is None else base
            if ms - last >= every_ms:
                yield (f"{ms:8.2f} ACK una={(una - base) & 0xffffffff} out={(nxt - una) & 0xffffffff} "
                       f"cwnd={kv['snd_cwnd']} ssthresh={kv['ssthresh']} srtt={int(kv['srtt']) / 8:.0f}us rx={rx}")
                last = ms
        elif kind == "tcp_cong_state_set":
            new = re.search(r"cong_state=(\d)", rest)[1]
            if new != state and (new in "34" or (state or "0") in "34"):
                yield f"{ms:8.2f} STATE {state} -> {new} rx={rx}"
            state = new
        elif kind == "tcp_retransmit_skb":
            yield f"{ms:8.2f} RETX rx={rx}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--every-ms", type=float, default=1.0)
    a = ap.parse_args()
    with open(a.trace) as f:
        for out in timeline(f, a.every_ms):
            print(out)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:
        sys.exit(0)
