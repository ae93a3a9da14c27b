#!/usr/bin/env python3
"""The data a TCP stall waited on, from a log of bench_failover.py --seqlog.

    python3 scripts/tcp_holes.py SEQLOG.json

The receiver's cumulative point (the next byte it can deliver in order) is
rebuilt from every segment it took in; the longest time after the fault
that it stood still is the stall, and the byte it stood at is the hole.
Printed: the stall, every transmission of the hole (time after the fault,
EV, plane device, hedged or not, PSN), when the hole arrived, and how many
other units the sender resent during the stall - a sender that resends
later data but never the hole has lost track of it (docs/resilience.md,
"RTOs in the trials: lost units TCP forgets"). Standard library only.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys

MRC_F_HEDGE = 0x02


def _rel(seq: int, base: int) -> int:
    """seq relative to base, in (-2^31, 2^31]: sequence numbers wrap."""
    v = (seq - base) % 2**32
    return v - 2**32 if v > 2**31 else v


def progress(rx: list[list[int]], base: int) -> list[tuple[int, int]]:
    """(time, cumulative point) at every move of the receiver's in-order
    point: segments are (ts_ns, seq, len); the point starts at `base` (the
    first unit the sender logged) and moves over contiguous data, however
    it arrived."""
    segs = sorted((ts, _rel(seq, base), _rel(seq, base) + ln) for ts, seq, ln in rx)
    if not segs:
        return []
    # from the first unit logged: a stray older segment arriving late
    # would otherwise anchor the point below data that is never resent
    point = 0
    starts: list[int] = []          # sorted starts of data not yet passed
    ends: dict[int, int] = {}       # start -> furthest end seen from it
    out = []
    for ts, s, e in segs:
        if e <= point:
            continue
        if s not in ends:
            bisect.insort(starts, s)
        ends[s] = max(ends.get(s, s), e)
        moved = False
        while starts and starts[0] <= point:
            first = starts.pop(0)
            end = ends.pop(first)
            if end > point:
                point, moved = end, True
        if moved:
            out.append((ts, point))
    return out


def report(doc: dict) -> dict:
    """The longest stall after the fault and everything about its hole."""
    tx, rx, fault = doc["tx"], doc["rx"], doc["fault_ns"]
    if not tx or not rx:
        return {"error": "no records"}
    base = min(tx)[1]
    moves = progress(rx, base)
    stall = None
    for (t1, p1), (t2, _p2) in zip(moves, moves[1:]):
        if t2 > fault and (stall is None or t2 - max(t1, fault) > stall[0]):
            stall = (t2 - max(t1, fault), t1, p1)
    if stall is None:
        return {"error": "the receiver's point never moved after the fault"}
    length, since, hole = stall

    def ms(t: int) -> float:
        return round((t - fault) / 1e6, 2)

    def covers(seq: int, ln: int) -> bool:
        return _rel(seq, base) <= hole < _rel(seq, base) + ln

    end = since + length
    hole_tx = [r for r in tx if covers(r[1], r[2])]
    sends = [{"ms": ms(ts), "ev": ev, "ifindex": ifx, "hedged": bool(fl & MRC_F_HEDGE), "psn": psn,
              "unit": [_rel(seq, base), _rel(seq, base) + ln]}
             for ts, seq, ln, psn, ifx, ev, fl in hole_tx]
    arrivals = [ms(ts) for ts, seq, ln in rx if covers(seq, ln)]
    # units the sender resent while the hole stood: their range was sent before
    top, resent = -2**62, 0
    for ts, seq, ln, *_ in sorted(tx):
        s = _rel(seq, base)
        if s + ln <= top and since <= ts <= end and not covers(seq, ln):
            resent += 1
        top = max(top, s + ln)
    return {"stall_ms": round(length / 1e6, 2), "from_ms": ms(since), "hole": hole, "sends": sends,
            "arrivals": arrivals, "other_units_resent_in_stall": resent,
            "hole_resent_in_stall": sum(1 for r in hole_tx[1:] if since <= r[0] <= end)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", help="a seqlog-*.json of bench_failover.py --seqlog")
    a = ap.parse_args(argv)
    r = report(json.load(open(a.log)))
    if "error" in r:
        print(r["error"], file=sys.stderr)
        return 1
    print(f"stall: {r['stall_ms']} ms from {r['from_ms']} ms after the fault, the receiver waiting for "
          f"byte {r['hole']} (relative to the first unit logged)")
    for s in r["sends"]:
        print(f"  sent {s['ms']:8.2f} ms  ev {s['ev']}  plane ifindex {s['ifindex']}  "
              f"{'hedged' if s['hedged'] else 'single'}  psn {s['psn']}  unit {s['unit'][0]}..{s['unit'][1]}")
    for t in r["arrivals"]:
        print(f"  arrived {t:8.2f} ms")
    print(f"the hole resent during the stall: {r['hole_resent_in_stall']} time(s); other units resent during it: "
          f"{r['other_units_resent_in_stall']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
