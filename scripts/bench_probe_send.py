#!/usr/bin/env python3
"""What sending a probe costs the agent, per sender and with or without auth.

    sudo python3 scripts/bench_probe_send.py [--probes 2000] [--rounds 20] [--paths 64]

Loads the datapath (no instance), makes a veth pair (pbsA/pbsB, XDP pass on
pbsB so that pbsA transmits redirected frames) and runs the agent's own
round (mrcctl/agent/health.py Prober._send_all: nonces into mrc_probe_nonce
in one batch, then the frames) with --probes probes per round over --paths
paths, for each sender ("packet": sendmmsg on AF_PACKET; "xdp": the probe
generator; "single": one map update and one send() per probe, as before
the batched round) with and without a MAC. Prints the agent's CPU time per probe
(user + system of this process, so the kernel's share of a sendmmsg or a
test run counts) and how many arrived at pbsB. Creates a device and sends
frames: on a shared machine, under the traffic lock.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import scripts  # noqa: E402,F401  (under the venv's interpreter: scripts/__init__.py)
from mrcctl.agent.health import ProbeGen, ProbePath, Prober, probe_frame, sign_probe  # noqa: E402
from mrcctl.datapath import abi as wire  # noqa: E402
from mrcctl.datapath.objects import load_objects  # noqa: E402

A, B = "pbsA", "pbsB"
KEY = bytes(range(16))
PEER = 1


class _Dp:
    def __init__(self, maps):
        self.maps = maps

    def map(self, name):
        return self.maps[name]


def one_by_one(pr: Prober, pps: list) -> None:
    """The agent's send before the batched round (main at 5a2a837): per
    probe a nonce, one map update and one send()."""
    nonce_m = pr.agent.dp.map("mrc_probe_nonce")
    for pp in pps:
        pp.seq = (pp.seq + 1) & 0xFFFFFFFF
        if pp.frame is None:
            pp.frame = probe_frame(pp.ent, pp.path, pr.cfg.udp_port, pp.auth_key is not None)
        f = pp.frame
        n = len(f) - (wire.MRC_AUTH_LEN if pp.auth_key else 0)
        struct.pack_into("!I", f, n - 24, pp.seq)
        struct.pack_into("!I", f, n - 20, (time.monotonic_ns() // 1000) & 0xFFFFFFFF)
        nonce = int.from_bytes(os.urandom(8), "big") or 1
        hdr = wire.probe_nonce_fields(nonce)
        struct.pack_into("!I", f, n - 12, hdr["seq0"])
        struct.pack_into("!I", f, n - 4, hdr["fb_ts"])
        if pp.nonces is None:
            pp.nonces = wire.ProbeNonce()
        pp.nonces.add(pp.seq, nonce)
        if pp.auth_key:
            sign_probe(f, pp.auth_key)
        nonce_m.update(pp.key, pp.nonces.pack())
        pr.socks[pp.plane].send(f)


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--probes", type=int, default=2000, help="probes per round")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--paths", type=int, default=64)
    a = ap.parse_args()
    loaded = load_objects(None, wire.DEFAULT_SIZING)
    subprocess.run(["ip", "link", "add", A, "type", "veth", "peer", "name", B], check=True)
    try:
        for d in (A, B):
            subprocess.run(["ip", "link", "set", d, "addrgenmode", "none"], check=False)
            subprocess.run(["ip", "link", "set", d, "up"], check=True)
        subprocess.run(["ip", "link", "set", "dev", B, "xdpdrv", "obj", str(REPO / "bpf" / "xdp_pass.bpf.o"),
                        "sec", "xdp"], check=True)
        ia = socket.if_nametoindex(A)
        dp = _Dp(loaded.maps)
        gen = ProbeGen(dp)
        tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        tx.bind((A, 0))
        tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)
        print("| sender | auth | probes/round | agent CPU us/probe | arrived |")
        print("|---|---|---|---|---|")
        for sender in ("single", "packet", "xdp"):
            for auth in (False, True):
                loaded.maps["mrc_auth"].update(wire.u32(PEER), wire.AuthKey.of(KEY if auth else None).pack())
                pr = Prober.__new__(Prober)
                pr.agent = SimpleNamespace(dp=dp)
                pr.cfg = SimpleNamespace(udp_port=wire.MRC_DEFAULT_UDP_PORT)
                pr.tokens, pr.errors, pr.sent, pr.generated, pr.gen_error = 0.0, 0, 0, 0, ""
                pr.socks = {A: tx}
                pr.generator = gen if sender == "xdp" else None
                pr.gen_planes = {A} if sender == "xdp" else set()
                pps = []
                for pid in range(a.paths):
                    ent = wire.Path(ifindex=ia, ev=49152 + pid, family=4, plane=0, smac="02:00:00:00:01:01",
                                    dmac="02:00:00:00:01:02", saddr="192.0.2.1", daddr="192.0.2.2")
                    pps.append(ProbePath(PEER, pid, wire.DEFAULT_SIZING.path_key(PEER, pid), A, None, ent,
                                         auth_key=KEY if auth else None))
                rx0 = int(Path(f"/sys/class/net/{B}/statistics/rx_packets").read_text())
                round_ = [pps[k % len(pps)] for k in range(a.probes)]
                send = (lambda r: one_by_one(pr, r)) if sender == "single" else \
                    (lambda r: pr._send_all(r, time.monotonic_ns()))
                send(round_[:len(pps)])            # frames built, nonces made
                c0 = cpu()
                for _ in range(a.rounds):
                    send(round_)
                dc = cpu() - c0
                time.sleep(0.2)
                rx = int(Path(f"/sys/class/net/{B}/statistics/rx_packets").read_text()) - rx0
                n = a.rounds * a.probes
                print(f"| {sender} | {'on' if auth else 'off'} | {a.probes} | {1e6 * dc / n:.1f} | "
                      f"{rx - len(pps)} of {n} |", flush=True)
        tx.close()
        gen.close()
    finally:
        subprocess.run(["ip", "link", "del", A], check=False)
        loaded.close()


if __name__ == "__main__":
    main()
