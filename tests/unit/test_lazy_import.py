"""topology._pyroute2 loads IPRoute without pyroute2's package __init__
(which imports every pyroute2 module: about a third of `up`'s way to its
first packet), and the package still answers every name afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import json, sys
sys.path.insert(0, %r)
from mrcctl.instance import topology
IPRoute = topology._pyroute2()
heavy = sorted(m for m in ("pyroute2.ipdb", "pyroute2.ndb.main", "pyroute2.conntrack", "pyroute2.ethtool")
               if m in sys.modules)
with IPRoute() as ipr:
    links = len(ipr.get_links())
from pyroute2 import IPRoute as Again, NetNS          # names only the __init__ defines
from pyroute2 import config                            # a submodule, as pyroute2's own modules ask
import pyroute2
print(json.dumps({"heavy": heavy, "links": links, "same": Again is IPRoute, "netns": NetNS.__name__,
                  "config": config.__name__, "after": "pyroute2.ipdb" in sys.modules,
                  "error": topology.NetlinkError.__module__}))
"""


def test_iproute_without_the_package_init_and_every_name_after():
    out = subprocess.run([sys.executable, "-c", PROBE % str(REPO)], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)
    assert got["heavy"] == []
    assert got["links"] >= 1
    assert got["same"] and got["netns"] == "NetNS" and got["config"] == "pyroute2.config"
    assert got["after"]                                # the __init__ ran once a name needed it
    assert got["error"] == "pyroute2.netlink.exceptions"
