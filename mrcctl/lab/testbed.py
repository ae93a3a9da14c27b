"""mrc test bed: N hosts in network namespaces joined by veth "planes".

Needs only the standard library and the `ip`/`tc` commands of iproute2;
run as root. Its command line is scripts/testbed.py (mrcctl/cli/testbed.py):

    python3 scripts/testbed.py up --hosts 2 --planes 4 --rate 1gbit [--ipv6] [--json]
    python3 scripts/testbed.py status [--json]
    python3 scripts/testbed.py blackhole --host 0 --plane 1 [--off]
    python3 scripts/testbed.py loss --host 0 --plane 1 --percent 20
    python3 scripts/testbed.py carrier --host 0 --plane 1 down|up
    python3 scripts/testbed.py rate --host 0 --plane 1 500mbit|none
    python3 scripts/testbed.py exec 0 -- ping -c 1 10.200.0.2
    python3 scripts/testbed.py down

    from mrcctl.lab.testbed import Testbed
    with Testbed(hosts=2, planes=4, rates="1gbit") as tb:
        tb.exec(0, ["ping", "-c", "1", tb.addr(1, 0, 2)])

Layout (deterministic; every name is derived from the prefix, default "mrct"):

* host i (0-based) is the network namespace ``{prefix}-h{i}``.
* For every pair of hosts i < j and every plane p there is one veth pair.
  In host i the end toward host j is ``p{p}h{j}``; in host j the other end
  is ``p{p}h{i}``.  (Two hosts, four planes: h0 has p0h1..p3h1, h1 has
  p0h0..p3h0.)
* pair index of hosts i<j: ``pair = j*(j-1)/2 + i``  ((0,1)=0, (0,2)=1,
  (1,2)=2, (0,3)=3, ...), independent of the number of hosts.
* IPv4 (always): host i on plane p toward j has ``10.{200+p}.{pair}.{i+1}/24``.
* IPv6 (only with ipv6=True / --ipv6, in addition to IPv4):
  ``fd00:{p:x}:{pair:x}::{i+1:x}/64`` added with ``nodad``.  Without --ipv6,
  IPv6 is disabled on the plane devices (no link-local chatter).
* MAC of host i's end toward j on plane p: ``02:6d:{p:02x}:00:{i:02x}:{j:02x}``.
* Overlay addresses belong to mrc; ``overlay_addr(i)`` returns the
  conventional ``172.31.0.{i+1}``.
* Every plane device gets a root qdisc: ``tbf rate R burst B latency 20ms``
  when a rate is set (on both ends), otherwise ``pfifo limit 1000``.  A
  veth with the default noqueue drops when the XDP peer's ring is full; any
  qdisc turns that into backpressure.
* rp_filter is 0 on all/default and every plane device; lo is up.

Faults act on a host's *egress* on a plane device (the packets that host
sends), through a classic-BPF tc filter on the device's clsact egress hook
(pref 4901 blackhole, pref 4902 random loss).  A dropped packet is returned
as TC_ACT_STOLEN, so the sender is told "sent" as with loss on a wire.
nftables' netdev egress hook was not used, for two reasons measured on
kernel 6.18: packets that a tc program on another device bpf_redirect()s
into a plane skip the plane's netfilter egress hook (so an nft
"policy drop" would not stop mrc's traffic at all), and an nft drop of a
locally sent packet returns ENOBUFS to the sender, which ping and TCP
silently retry (so "loss" would be invisible).  The tc egress hook of the
plane sees redirected packets too.  Packets that an XDP program sends with
XDP_TX or XDP_REDIRECT bypass both hooks.  carrier() sets the host's end
administratively down (the peer sees NO-CARRIER); set_rate() replaces the
root qdisc.

State of an `up` is recorded in /run/mrc-testbed/{prefix}.json so the CLI's
other commands (and Testbed.attach) can find the layout again.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import signal
import subprocess
import time
from typing import Iterable, Sequence

DEFAULT_PREFIX = "mrct"
STATE_DIR = "/run/mrc-testbed"
NETNS_DIR = "/run/netns"

MAX_HOSTS = 23  # keeps pair index <= 252
MAX_PLANES = 55  # keeps 200+p <= 255

FAULT_PREF_BLACKHOLE = 4901
FAULT_PREF_LOSS = 4902
FAULT_PREF_ECN = 4903   # CE marking (bpf/ecn_mark.bpf.c), on fabric links
TBF_LATENCY = "20ms"
TBF_MIN_BURST = 16 * 1024
PFIFO_LIMIT = 1000

# classic BPF, tc direct-action programs. A dropped packet returns
# TC_ACT_STOLEN (4): freed, but the sender is told "sent", like a loss on the
# wire. (TC_ACT_SHOT or an nft drop return NET_XMIT_DROP: a local sender sees
# ENOBUFS and ping/TCP quietly resend, which hides the loss.) Passing returns
# TC_ACT_UNSPEC (-1): continue with the next filter, if any.
_TC_ACT_STOLEN = 4
_TC_ACT_UNSPEC = 0xFFFFFFFF
_SKF_AD_RANDOM = (-0x1000 + 56) & 0xFFFFFFFF  # SKF_AD_OFF + SKF_AD_RANDOM
_CBPF_DROP_ALL = f"1,6 0 0 {_TC_ACT_STOLEN}"


def _cbpf_drop_percent(percent: int) -> str:
    # A = random; A %= 100; if A >= percent pass else drop
    return (
        f"5,32 0 0 {_SKF_AD_RANDOM},148 0 0 100,53 0 1 {percent},"
        f"6 0 0 {_TC_ACT_UNSPEC},6 0 0 {_TC_ACT_STOLEN}"
    )


def family_addr(family: int, ipv6: bool, what: str, v4: str, v6: str) -> str:
    """The v4 or v6 form of a lab address; v6 only on a lab built with ipv6=True."""
    if family == 4:
        return v4
    if family == 6:
        if not ipv6:
            raise TestbedError(f"{what} was built without ipv6=True")
        return str(ipaddress.IPv6Address(v6))
    raise TestbedError("family must be 4 or 6")


class TestbedError(RuntimeError):
    """Raised for invalid arguments or a failed set-up step."""

    __test__ = False  # not a pytest test class


class CommandError(subprocess.CalledProcessError):
    """CalledProcessError whose message includes the command's stderr."""

    def __str__(self) -> str:
        msg = super().__str__()
        err = self.stderr
        if isinstance(err, bytes):
            err = err.decode(errors="replace")
        if err:
            msg += ": " + err.strip()[-2000:]
        return msg


def _run(cmd: Sequence[str], input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cp = subprocess.run(list(cmd), input=input, capture_output=True, text=True)
    if check and cp.returncode != 0:
        raise CommandError(cp.returncode, list(cmd), cp.stdout, cp.stderr)
    return cp


# --------------------------------------------------------------------------
# rates

_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(bit|bps|b)?\s*$", re.I)
_RATE_MULT = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_rate(rate) -> int | None:
    """'1gbit' -> 1_000_000_000 (bit/s). tc units: kbit/mbit/gbit (bits),
    kbps/mbps/gbps (bytes), plain number = bit/s. None/'none'/0 -> None."""
    if rate is None:
        return None
    if isinstance(rate, (int, float)):
        return int(rate) if rate > 0 else None
    s = str(rate).strip().lower()
    if s in ("", "none", "0", "off", "unlimited"):
        return None
    m = _RATE_RE.match(s)
    if not m:
        raise TestbedError(f"cannot parse rate {rate!r} (use e.g. 1gbit, 500mbit, 100kbit)")
    value = float(m.group(1)) * _RATE_MULT[m.group(2).lower()]
    if (m.group(3) or "").lower() == "bps":
        value *= 8
    bits = int(value)
    if bits < 8000:
        raise TestbedError(f"rate {rate!r} is too small")
    return bits


def format_rate(bits: int | None) -> str:
    if not bits:
        return "none"
    for unit, mult in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits % mult == 0:
            return f"{bits // mult}{unit}"
    return f"{bits}bit"


def tbf_burst(bits: int, mtu: int = 1500) -> int:
    """Bucket size in bytes: 4 ms worth of the rate, at least 16 KiB."""
    return max(bits // 8 // 250, TBF_MIN_BURST, mtu + 64)


# --------------------------------------------------------------------------
# helpers that do not need a Testbed object


def overlay_addr(i: int) -> str:
    """Conventional overlay address of host i (mrc assigns it, not the testbed)."""
    return f"172.31.0.{i + 1}"


def pair_index(i: int, j: int) -> int:
    a, b = min(i, j), max(i, j)
    if a == b:
        raise TestbedError("a host has no plane toward itself")
    return b * (b - 1) // 2 + a


def list_namespaces(prefix: str) -> list[str]:
    """Namespaces named '{prefix}-...' (only those; nothing else is touched)."""
    try:
        names = os.listdir(NETNS_DIR)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(prefix + "-"))


def _netns_pids(ns: str) -> list[int]:
    cp = _run(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in cp.stdout.split() if x.isdigit() and int(x) != os.getpid()]


def _kill_netns_pids(ns: str, grace: float = 2.0) -> None:
    pids = _netns_pids(ns)
    if not pids:
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        pids = [p for p in pids if os.path.exists(f"/proc/{p}")]
        if not pids:
            return
        time.sleep(0.05)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _validate_prefix(prefix: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.]{0,19}", prefix or ""):
        raise TestbedError(f"bad prefix {prefix!r}: 1-20 chars of [A-Za-z0-9_.], no '-'")


def state_path(prefix: str) -> str:
    return os.path.join(STATE_DIR, f"{prefix}.json")


def cleanup(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Delete every namespace named '{prefix}-*' (ending the processes that
    still run inside it) and the prefix's state file. Idempotent. Returns the
    deleted namespace names."""
    _validate_prefix(prefix)
    removed = []
    for ns in list_namespaces(prefix):
        _kill_netns_pids(ns)
        cp = _run(["ip", "netns", "del", ns], check=False)
        if cp.returncode != 0 and os.path.exists(os.path.join(NETNS_DIR, ns)):
            time.sleep(0.2)
            _run(["ip", "netns", "del", ns], check=False)
        removed.append(ns)
    try:
        os.unlink(state_path(prefix))
    except FileNotFoundError:
        pass
    return removed


def set_egress_filter(ns: str, dev: str, pref: int, bytecode: str | None) -> None:
    """Install (or with bytecode None remove) a classic-BPF fault filter on
    dev's egress in namespace ns."""
    if bytecode is None:
        _run(["tc", "-n", ns, "filter", "del", "dev", dev, "egress", "pref", str(pref)], check=False)
        return
    if "clsact" not in _run(["tc", "-n", ns, "qdisc", "show", "dev", dev]).stdout:
        _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "clsact"])
    _run(["tc", "-n", ns, "filter", "replace", "dev", dev, "egress", "pref", str(pref), "handle", "1",
          "protocol", "all", "bpf", "da", "bytecode", bytecode])


def loss_bytecode(percent: float) -> str | None:
    """The filter dropping `percent` % at random; None for 0 (remove it)."""
    pct = int(round(float(percent)))
    if not 0 <= pct <= 100:
        raise TestbedError("percent must be 0..100")
    return None if pct == 0 else (_CBPF_DROP_ALL if pct == 100 else _cbpf_drop_percent(pct))


def device_status(ns: str, dev: str) -> dict:
    """Link state, root qdisc and fault filters of dev in namespace ns."""
    link = _run(["ip", "-n", ns, "-o", "link", "show", "dev", dev], check=False).stdout
    m = re.search(r"state (\S+)", link)
    qd = _run(["tc", "-n", ns, "qdisc", "show", "dev", dev], check=False).stdout
    root = next((ln for ln in qd.splitlines() if " root " in ln), "")
    kind = re.search(r"qdisc (\S+)", root)
    qrate = re.search(r" rate (\S+)", root)
    filt = _run(["tc", "-n", ns, "filter", "show", "dev", dev, "egress"], check=False).stdout
    faults = []
    if f"pref {FAULT_PREF_BLACKHOLE} " in filt:
        faults.append("blackhole")
    lm = re.search(rf"pref {FAULT_PREF_LOSS} .*?53 0 1 (\d+),", filt)
    if lm:
        faults.append(f"loss {lm.group(1)}%")
    elif f"pref {FAULT_PREF_LOSS} " in filt:
        faults.append("loss 100%")
    if f"pref {FAULT_PREF_ECN} " in filt:
        faults.append("ecn-mark")
    return {
        "dev": dev,
        "state": m.group(1) if m else "MISSING",
        "no_carrier": "NO-CARRIER" in link,
        "qdisc": (kind.group(1) + (f" {qrate.group(1)}" if qrate else "")) if kind else "?",
        "faults": faults,
    }


# --------------------------------------------------------------------------


class Testbed:
    """N hosts (network namespaces) joined by veth planes; see module doc."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        hosts: int = 2,
        planes: int = 4,
        rates=None,
        ipv6: bool = False,
        prefix: str = DEFAULT_PREFIX,
        mtu: int = 1500,
    ):
        _validate_prefix(prefix)
        if not 2 <= int(hosts) <= MAX_HOSTS:
            raise TestbedError(f"hosts must be 2..{MAX_HOSTS}")
        if not 1 <= int(planes) <= MAX_PLANES:
            raise TestbedError(f"planes must be 1..{MAX_PLANES}")
        if not 576 <= int(mtu) <= 65535:
            raise TestbedError("mtu must be 576..65535")
        self.n_hosts = int(hosts)
        self.n_planes = int(planes)
        self.ipv6 = bool(ipv6)
        self.prefix = prefix
        self.mtu = int(mtu)
        if rates is None or isinstance(rates, (str, int, float)):
            self.rates: list[int | None] = [parse_rate(rates)] * self.n_planes
        else:
            rates = list(rates)
            if len(rates) != self.n_planes:
                raise TestbedError(f"{len(rates)} rates given for {self.n_planes} planes")
            self.rates = [parse_rate(r) for r in rates]
        self._procs: list[subprocess.Popen] = []

    # ---- names and addresses -------------------------------------------

    def ns(self, i: int) -> str:
        self._check_host(i)
        return f"{self.prefix}-h{i}"

    def hosts(self) -> list[int]:
        return list(range(self.n_hosts))

    def peers(self, i: int) -> list[int]:
        self._check_host(i)
        return [j for j in range(self.n_hosts) if j != i]

    def dev(self, i: int, j: int, p: int) -> str:
        """Device in host i toward host j on plane p."""
        self._check_link(i, j, p)
        return f"p{p}h{j}"

    def planes(self, i: int, j: int) -> list[str]:
        """Device names in host i toward host j, in plane order."""
        return [self.dev(i, j, p) for p in range(self.n_planes)]

    def pair(self, i: int, j: int) -> int:
        self._check_host(i)
        self._check_host(j)
        return pair_index(i, j)

    def addr(self, i: int, j: int, p: int, family: int = 4) -> str:
        """Underlay address of host i on plane p toward host j (no /len)."""
        self._check_link(i, j, p)
        pair = pair_index(i, j)
        return family_addr(family, self.ipv6, "testbed", f"10.{200 + p}.{pair}.{i + 1}",
                           f"fd00:{p:x}:{pair:x}::{i + 1:x}")

    @staticmethod
    def prefixlen(family: int = 4) -> int:
        return 24 if family == 4 else 64

    def mac(self, i: int, j: int, p: int) -> str:
        """MAC address of host i's device toward host j on plane p."""
        self._check_link(i, j, p)
        return f"02:6d:{p:02x}:00:{i:02x}:{j:02x}"

    def rate(self, p: int) -> int | None:
        """Configured rate of plane p in bit/s (as built; set_rate changes are not tracked)."""
        return self.rates[p]

    overlay_addr = staticmethod(overlay_addr)

    def _check_host(self, i: int) -> None:
        if not (isinstance(i, int) and 0 <= i < self.n_hosts):
            raise TestbedError(f"no host {i!r} (hosts are 0..{self.n_hosts - 1})")

    def _check_link(self, i: int, j: int, p: int) -> None:
        self._check_host(i)
        self._check_host(j)
        if i == j:
            raise TestbedError("a host has no plane toward itself")
        if not (isinstance(p, int) and 0 <= p < self.n_planes):
            raise TestbedError(f"no plane {p!r} (planes are 0..{self.n_planes - 1})")

    def links(self) -> Iterable[tuple[int, int, int]]:
        """(i, j, p) for every veth pair, i < j."""
        for j in range(self.n_hosts):
            for i in range(j):
                for p in range(self.n_planes):
                    yield i, j, p

    def layout(self) -> dict:
        hosts = []
        for i in self.hosts():
            devs = []
            for j in self.peers(i):
                for p in range(self.n_planes):
                    d = {
                        "dev": self.dev(i, j, p),
                        "plane": p,
                        "peer": j,
                        "peer_dev": self.dev(j, i, p),
                        "mac": self.mac(i, j, p),
                        "peer_mac": self.mac(j, i, p),
                        "addr4": self.addr(i, j, p, 4),
                        "peer_addr4": self.addr(j, i, p, 4),
                        "rate": format_rate(self.rates[p]),
                    }
                    if self.ipv6:
                        d["addr6"] = self.addr(i, j, p, 6)
                        d["peer_addr6"] = self.addr(j, i, p, 6)
                    devs.append(d)
            hosts.append({"host": i, "ns": self.ns(i), "overlay_addr": overlay_addr(i), "devices": devs})
        return {
            "prefix": self.prefix,
            "hosts": self.n_hosts,
            "planes": self.n_planes,
            "ipv6": self.ipv6,
            "mtu": self.mtu,
            "rates": [format_rate(r) for r in self.rates],
            "prefixlen4": 24,
            "prefixlen6": 64,
            "namespaces": [self.ns(i) for i in self.hosts()],
            "host_info": hosts,
        }

    # ---- mrc configuration --------------------------------------------------

    def mrc_config(self, i: int, peers: list[int] | None = None, evs: int = 4,
                   weights: list[int] | None = None, family: int = 4, device: str = "mrc0",
                   overlay_prefix: int = 24, extra: str = "", peer_extra: str = "",
                   rx_hook: str | None = None) -> str:
        """mrc TOML for host i toward `peers` (default: every other host).

        Planes are listed in plane order for every peer, so both ends agree on
        path ids. `extra` is appended at top level (e.g. a [health] table);
        `peer_extra` goes into every [[peer]] table. `rx_hook` sets every
        plane's receive hook (default: the config's, "auto"). `weights`: one
        per plane, written as the planes' `weight` (which makes them fixed);
        without, the config's default (adaptive).
        """
        peers = self.peers(i) if peers is None else peers
        lines = ["[overlay]", f'device = "{device}"',
                 f'address = "{self.overlay_addr(i)}/{overlay_prefix}"', ""]
        # a device per peer and plane here; one per plane on a routed fabric
        devices = dict.fromkeys((self.dev(i, j, p), p) for j in peers for p in range(self.n_planes))
        for dev, p in devices:
            # no weight: the config's default, adaptive weights; typed ones are fixed
            lines += ["[[plane]]", f'device = "{dev}"', *([f"weight = {weights[p]}"] if weights else [])]
            lines += [f'rx_hook = "{rx_hook}"', ""] if rx_hook else [""]
        for j in peers:
            lines += ["[[peer]]", f'name = "h{j}"', f'overlay = "{self.overlay_addr(j)}"',
                      f"evs_per_plane = {evs}"]
            if peer_extra:
                lines.append(peer_extra)
            lines.append("[peer.underlay]")
            for p in range(self.n_planes):
                lines.append(f'{self.dev(i, j, p)} = "{self.addr(j, i, p, family)}"')
            lines.append("")
        return "\n".join(lines) + ("\n" + extra + "\n" if extra else "")

    # ---- lifecycle ---------------------------------------------------------

    def up(self) -> "Testbed":
        """Build the namespaces, planes, addresses and qdiscs. Stale
        namespaces with the same prefix are removed first. On failure
        everything is torn down again and the error re-raised."""
        cleanup(self.prefix)
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        for i in self.hosts():
            _run(["ip", "netns", "add", self.ns(i)])
        # namespace-wide settings first, so new devices inherit the defaults
        for i in self.hosts():
            lines = [
                "echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter",
                "echo 0 > /proc/sys/net/ipv4/conf/default/rp_filter",
            ]
            if not self.ipv6:
                lines.append("if [ -d /proc/sys/net/ipv6 ]; then echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6; fi")
            else:
                lines += [
                    "echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad",
                    "echo 1 > /proc/sys/net/ipv6/conf/default/keep_addr_on_down",
                ]
            self._sh(i, lines)
            _run(["ip", "-n", self.ns(i), "link", "set", "lo", "up"])
        # veth pairs, created from the lower host straight into both namespaces
        for i in self.hosts():
            cmds = []
            for j in range(i + 1, self.n_hosts):
                for p in range(self.n_planes):
                    cmds.append(
                        f"link add {self.dev(i, j, p)} address {self.mac(i, j, p)} mtu {self.mtu} "
                        f"type veth peer name {self.dev(j, i, p)} address {self.mac(j, i, p)} "
                        f"mtu {self.mtu} netns {self.ns(j)}"
                    )
            if cmds:
                self._ip_batch(i, cmds)
        for i in self.hosts():
            devs = [(j, p, self.dev(i, j, p)) for j in self.peers(i) for p in range(self.n_planes)]
            lines, cmds = [], []     # sysctls first, then addresses and up
            for j, p, d in devs:
                lines.append(f"echo 0 > /proc/sys/net/ipv4/conf/{d}/rp_filter")
                cmds.append(f"addr add {self.addr(i, j, p, 4)}/24 dev {d}")
                if self.ipv6:
                    lines.append(f"echo 1 > /proc/sys/net/ipv6/conf/{d}/keep_addr_on_down")
                    lines.append(f"echo 0 > /proc/sys/net/ipv6/conf/{d}/accept_dad")
                    cmds.append(f"addr add {self.addr(i, j, p, 6)}/64 dev {d} nodad")
                else:
                    lines.append(f"if [ -d /proc/sys/net/ipv6 ]; then echo 1 > /proc/sys/net/ipv6/conf/{d}/disable_ipv6; fi")
                cmds.append(f"link set {d} up")
            self._sh(i, lines)
            self._ip_batch(i, cmds)
            self._tc_batch(i, [self._qdisc_cmd(d, self.rates[p]) for _, p, d in devs])
        self._write_state()

    def down(self) -> None:
        """Remove everything this testbed (or any earlier one with the same
        prefix) created. Safe on a half-built or already removed testbed."""
        for proc in self._procs:
            if proc.poll() is None:
                try:
                    proc.terminate()
                    proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=2)
                except ProcessLookupError:
                    pass
        self._procs.clear()
        cleanup(self.prefix)

    def __enter__(self) -> "Testbed":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def is_up(self) -> bool:
        return all(os.path.exists(os.path.join(NETNS_DIR, self.ns(i))) for i in self.hosts())

    def _write_state(self) -> None:
        os.makedirs(STATE_DIR, exist_ok=True)
        state = {
            "hosts": self.n_hosts,
            "planes": self.n_planes,
            "rates": [format_rate(r) for r in self.rates],
            "ipv6": self.ipv6,
            "prefix": self.prefix,
            "mtu": self.mtu,
        }
        tmp = state_path(self.prefix) + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, state_path(self.prefix))

    @classmethod
    def attach(cls, prefix: str = DEFAULT_PREFIX) -> "Testbed":
        """A Testbed object for a bed that is already up (e.g. built by the
        CLI), without changing it."""
        _validate_prefix(prefix)
        try:
            with open(state_path(prefix)) as f:
                st = json.load(f)
            rates = [None if r == "none" else r for r in st["rates"]]
            return cls(st["hosts"], st["planes"], rates, st["ipv6"], prefix, st["mtu"])
        except FileNotFoundError:
            pass
        nss = list_namespaces(prefix)
        idx = sorted(int(m.group(1)) for n in nss if (m := re.fullmatch(re.escape(prefix) + r"-h(\d+)", n)))
        if len(idx) < 2 or idx != list(range(len(idx))):
            raise TestbedError(f"no testbed with prefix {prefix!r} is up")
        cp = _run(["ip", "-n", f"{prefix}-h0", "-o", "link", "show"])
        planes = {int(m.group(1)) for m in re.finditer(r": p(\d+)h\d+[@:]", cp.stdout)}
        if not planes:
            raise TestbedError(f"testbed {prefix!r} has no plane devices")
        cp6 = _run(["ip", "-n", f"{prefix}-h0", "-6", "-o", "addr", "show", "scope", "global"])
        return cls(len(idx), max(planes) + 1, None, "fd00:" in cp6.stdout, prefix)

    # ---- running things inside hosts -----------------------------------

    def ns_cmd(self, i: int, cmd) -> list[str]:
        if isinstance(cmd, str):
            cmd = shlex.split(cmd)
        return ["ip", "netns", "exec", self.ns(i), *map(str, cmd)]

    def exec(self, i: int, cmd, **kw) -> subprocess.CompletedProcess:
        """Run cmd (list, or a string split with shlex) inside host i.
        Defaults: check=True, capture_output=True, text=True; any
        subprocess.run keyword (timeout=, input=, ...) can override them.
        A failure raises CommandError (a CalledProcessError naming stderr)."""
        check = kw.pop("check", True)
        if not any(k in kw for k in ("stdout", "stderr", "capture_output")):
            kw["capture_output"] = True
        if not any(k in kw for k in ("text", "encoding", "universal_newlines", "errors")):
            kw["text"] = True
        argv = self.ns_cmd(i, cmd)
        cp = subprocess.run(argv, **kw)
        if check and cp.returncode != 0:
            raise CommandError(cp.returncode, argv, cp.stdout, cp.stderr)
        return cp

    def popen(self, i: int, cmd, **kw) -> subprocess.Popen:
        """Start cmd inside host i; the process is ended by down()."""
        proc = subprocess.Popen(self.ns_cmd(i, cmd), **kw)
        self._procs.append(proc)
        return proc

    def ping(self, i: int, j: int, p: int, family: int = 4, count: int = 1, timeout: float = 1, interval: float = 0.2) -> bool:
        """True if host i reaches host j's address on plane p (underlay)."""
        cmd = ["ping", f"-{family}", "-n", "-q", "-c", str(count), "-W", str(timeout), "-i", str(interval),
               "-I", self.dev(i, j, p), self.addr(j, i, p, family)]
        cp = self.exec(i, cmd, check=False, timeout=count * (interval + timeout) + 5)
        return cp.returncode == 0

    def _sh(self, i: int, lines: list[str]) -> None:
        if lines:
            _run(["ip", "netns", "exec", self.ns(i), "sh", "-ec", "\n".join(lines)])

    def _ip_batch(self, i: int, cmds: list[str]) -> None:
        _run(["ip", "-n", self.ns(i), "-batch", "-"], input="\n".join(cmds) + "\n")

    def _tc_batch(self, i: int, cmds: list[str]) -> None:
        _run(["tc", "-n", self.ns(i), "-batch", "-"], input="\n".join(cmds) + "\n")

    def _tc(self, i: int, args: list[str], check: bool = True) -> subprocess.CompletedProcess:
        return _run(["tc", "-n", self.ns(i), *args], check=check)

    def _qdisc_cmd(self, dev: str, bits: int | None) -> str:
        if bits:
            return (f"qdisc replace dev {dev} root tbf rate {bits}bit "
                    f"burst {tbf_burst(bits, self.mtu)} latency {TBF_LATENCY}")
        return f"qdisc replace dev {dev} root pfifo limit {PFIFO_LIMIT}"

    # ---- faults ------------------------------------------------------------

    def _targets(self, host: int, plane: int, peer: int | None) -> list[tuple[int, int, str]]:
        peers = self.peers(host) if peer is None else [peer]
        return [(host, j, self.dev(host, j, plane)) for j in peers]

    def _set_filter(self, i: int, dev: str, pref: int, bytecode: str | None) -> None:
        set_egress_filter(self.ns(i), dev, pref, bytecode)

    def blackhole(self, host: int, plane: int, on: bool = True, peer: int | None = None, both: bool = False) -> None:
        """Drop everything host sends on plane (toward peer, or every peer).
        both=True also blackholes the other end(s), i.e. the plane is dead in
        both directions. on=False restores."""
        for i, j, dev in self._targets(host, plane, peer):
            self._set_filter(i, dev, FAULT_PREF_BLACKHOLE, _CBPF_DROP_ALL if on else None)
            if both:
                self._set_filter(j, self.dev(j, i, plane), FAULT_PREF_BLACKHOLE, _CBPF_DROP_ALL if on else None)

    def loss(self, host: int, plane: int, percent: float, peer: int | None = None, both: bool = False) -> None:
        """Drop `percent` % (random, 0..100) of what host sends on plane; 0 removes."""
        code = loss_bytecode(percent)
        for i, j, dev in self._targets(host, plane, peer):
            self._set_filter(i, dev, FAULT_PREF_LOSS, code)
            if both:
                self._set_filter(j, self.dev(j, i, plane), FAULT_PREF_LOSS, code)

    def clear_faults(self, host: int | None = None, plane: int | None = None) -> None:
        """Remove blackhole/loss filters and bring carriers up (default: everywhere)."""
        for i in (self.hosts() if host is None else [host]):
            for p in (range(self.n_planes) if plane is None else [plane]):
                self.blackhole(i, p, on=False)
                self.loss(i, p, 0)
                self.carrier(i, p, True)

    def carrier(self, host: int, plane: int, up: bool, peer: int | None = None) -> None:
        """Set host's device(s) on plane administratively up/down; the veth
        peer then sees NO-CARRIER."""
        for i, _, dev in self._targets(host, plane, peer):
            _run(["ip", "-n", self.ns(i), "link", "set", "dev", dev, "up" if up else "down"])

    def set_rate(self, host: int, plane: int, rate, peer: int | None = None, both_ends: bool = True) -> None:
        """tbf at `rate` (None/'none' -> pfifo) on host's device(s) on plane,
        and by default on the other end(s) as well."""
        bits = parse_rate(rate)
        for i, j, dev in self._targets(host, plane, peer):
            self._tc(i, self._qdisc_cmd(dev, bits).split())
            if both_ends:
                self._tc(j, self._qdisc_cmd(self.dev(j, i, plane), bits).split())

    # ---- inspection --------------------------------------------------------

    def device_status(self, i: int, j: int, p: int) -> dict:
        return device_status(self.ns(i), self.dev(i, j, p))

    def status(self) -> dict:
        lay = self.layout()
        lay["up"] = self.is_up()
        if lay["up"]:
            for h in lay["host_info"]:
                for d in h["devices"]:
                    d["live"] = self.device_status(h["host"], d["peer"], d["plane"])
        return lay
