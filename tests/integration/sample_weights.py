"""Records each peer's per-plane slot shares every --interval-ms for
--seconds, so a test can time how fast adaptive weights move. Runs as its
own process inside a testbed host, next to the instance it reads:

    python3 tests/integration/sample_weights.py sample -c FILE --seconds S --interval-ms MS --out F
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mrcctl.datapath import abi as wire  # noqa: E402
from mrcctl.datapath.maps import Datapath  # noqa: E402
from mrcctl.instance import config as cfgmod  # noqa: E402
from mrcctl.instance.slots import slot_weights  # noqa: E402
from mrcctl.instance.state import Instance  # noqa: E402


def sample(cfg: cfgmod.Config, seconds: float, interval_ms: float, out: str) -> None:
    """Rows of monotonic time, peer, per-plane slot shares and tx bytes."""
    rows = []
    with Datapath(Instance(cfg.overlay_device)) as dp:
        stats_m = dp.map("mrc_path_stats")
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t = time.monotonic()
            for peer in cfg.peers:
                counts = slot_weights(dp, peer)
                total = sum(counts) or 1
                planes: dict[str, float] = {}
                tx: dict[str, int] = {}
                for p, c in zip(peer.paths, counts):
                    planes[p.plane.device] = planes.get(p.plane.device, 0.0) + c / total
                    st = wire.PathStats.sum(stats_m.lookup_percpu(dp.path_key(peer.index, p.id)))
                    tx[p.plane.device] = tx.get(p.plane.device, 0) + st.tx_bytes
                rows.append({"t": t, "peer": peer.name, "shares": planes, "tx_bytes": tx})
            time.sleep(max(0.0, interval_ms / 1000.0 - (time.monotonic() - t)))
    with open(out, "w") as f:
        json.dump(rows, f)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="sample_weights.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample")
    s.add_argument("-c", "--config", required=True)
    s.add_argument("--seconds", type=float, default=5)
    s.add_argument("--interval-ms", type=float, default=2)
    s.add_argument("--out", required=True)
    s.add_argument("--ready-file")
    a = ap.parse_args(argv)
    cfg = cfgmod.load(a.config)
    if a.ready_file:
        open(a.ready_file, "w").close()
    sample(cfg, a.seconds, a.interval_ms, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
