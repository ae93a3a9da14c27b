"""The TOML configuration: parsing, strict validation and the path plan.

Every problem is reported as one ConfigError whose message names the key
("plane[2].device: ...") so the CLI can print a single line and exit 2.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import ipaddress
import re
import tomllib
from dataclasses import dataclass, field
import pathlib

from ..datapath import abi as wire

# enum mrc_spray's names, in its order: what peer.spray and `mrcctl spray` accept
SPRAY_MODES = tuple(m.label for m in wire.SprayMode)
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
PEER_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")


class ConfigError(ValueError):
    """Invalid configuration or input; the message is one line."""


# plane[].rx_hook: where mrc's receive program runs on the plane. "auto"
# is decided at `up` from the device (topology.auto_rx_hook): tc ingress on
# virtual devices (native XDP on a veth turns TSO off on its peer, and every
# unit is then segmented in software), XDP on NICs. Measured on veth planes:
# docs/benchmarks/receive-hook.md. The default stays XDP until tc
# delivers inner UDP GSO units (it hands them on whole, and a receiving UDP
# socket got none of them: tests/integration/test_rxsafe_live.py).
RX_HOOKS = ("auto", "xdp", "tc")
RX_HOOK_DEFAULT = "xdp"


@dataclass(frozen=True)
class AclEntry:
    """One allow_underlay entry: frames matching every term it has pass."""
    text: str                                  # as written, normalised
    family: int = 0                            # 0: any
    proto: int = 0                             # 0: any
    port_lo: int = 0                           # destination port range; 0-0: any
    port_hi: int = 0
    prefix: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None   # source

    def rule(self) -> wire.AclRule:
        """The mrc_acl rule the datapath matches (bpf/acl.h)."""
        addr = mask = bytes(16)
        if self.prefix is not None:
            n = self.prefix.network_address.packed
            m = self.prefix.netmask.packed
            addr, mask = n + bytes(16 - len(n)), m + bytes(16 - len(m))
        return wire.AclRule(family=self.family, proto=self.proto, port_lo=self.port_lo,
                            port_hi=self.port_hi, addr=addr, mask=mask)


def acl_rule_text(r: wire.AclRule) -> str:
    """An mrc_acl rule as allow_underlay syntax (what `status` shows: the
    list the datapath holds, not the config's)."""
    terms = []
    if any(r.mask):
        size = 4 if r.family == 4 else 16
        plen = sum(bin(b).count("1") for b in r.mask[:size])
        addr = ipaddress.ip_address(r.addr[:size])
        terms.append(f"{addr}/{plen}")
    if r.proto:
        name = next((n for n, (v, _f) in ACL_PROTOS.items() if v == r.proto), f"proto/{r.proto}")
        if r.port_hi:
            name += f"/{r.port_lo}" + (f"-{r.port_hi}" if r.port_hi != r.port_lo else "")
        terms.append(name)
    elif r.family and not terms:
        terms.append(f"ipv{r.family}")
    return " ".join(terms) or "any"


@dataclass(frozen=True)
class Plane:
    index: int
    device: str
    weight: int = 1
    address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None
    # None: every non-MRC frame reaches the stack (the default); a tuple
    # (maybe empty): only ARP, IPv6 ND and these (bpf/acl.h)
    allow_underlay: tuple[AclEntry, ...] | None = None
    rx_hook: str = RX_HOOK_DEFAULT


@dataclass(frozen=True)
class Path:
    """(plane, EV) toward one peer; `id` is what goes into the MRC header."""
    id: int
    plane: Plane
    ev_index: int
    ev: int                      # outer UDP source port
    remote: ipaddress.IPv4Address | ipaddress.IPv6Address
    weight: int

    @property
    def family(self) -> int:
        return self.remote.version

    @property
    def label(self) -> str:
        return f"{self.plane.device}/{self.ev}"


@dataclass(frozen=True)
class Peer:
    index: int
    name: str
    overlay: ipaddress.IPv4Address
    evs_per_plane: int
    ev_base: int
    spray: str
    min_active: int
    underlay: dict[str, ipaddress.IPv4Address | ipaddress.IPv6Address]
    paths: tuple[Path, ...] = field(default=())
    # flowlet spray: idle gap (µs) after which a flow may change path;
    # 0 = adaptive (the agent derives it from the paths' RTT spread)
    flowlet_gap_us: int = 0
    # peer.key_file: a key for this peer pair instead of security.key_file
    key_file: str | None = None


WEIGHT_MODES = ("fixed", "adaptive")


@dataclass(frozen=True)
class Weights:
    """[weights]: fixed = the planes' configured weights; adaptive = the
    agent re-weights paths by what they deliver (mrcctl/agent/weights.py)."""
    mode: str = "fixed"
    interval_ms: float = 10.0
    min_weight: float = 0.02      # floor of a usable path's share, so it keeps being measured


@dataclass(frozen=True)
class Health:
    dead_after_ms: float = 20.0       # measured: 5 ms retires paths falsely under saturated shaped planes (docs/benchmarks/failover.md)
    probe_interval_ms: float = 20.0
    recover_probes: int = 3
    # true: hedge suspect paths; "always": every unit. On by default: it copies only units on
    # suspect paths (a few dozen per 5 s of a 3.5 Gbit/s flow, no measurable cost), and without
    # it a failure can cost TCP a 200 ms RTO (docs/benchmarks/failover.md)
    hedge: bool | str = True
    liveness: bool = True
    hedge_after_ms: float | None = None  # suspect threshold; None = dead_after_ms / 2
    # EV probes per second per host at most (the agent's Prober)
    probe_budget: int = 2000

    @property
    def hedge_after(self) -> float:
        return self.hedge_after_ms if self.hedge_after_ms is not None else self.dead_after_ms / 2


@dataclass(frozen=True)
class Config:
    source: str
    digest: str
    overlay_device: str
    overlay_address: ipaddress.IPv4Interface
    mtu: int | None
    udp_port: int
    planes: tuple[Plane, ...]
    peers: tuple[Peer, ...]
    health: Health
    # [metrics] listen: "HOST:PORT" for the agent's Prometheus exporter; None = off
    metrics_listen: str | None = None
    # [metrics] per_path: one series per path besides the per-peer and
    # per-plane aggregates (off: 4,096 peers would mean a million series)
    metrics_per_path: bool = False
    weights: Weights = field(default_factory=Weights)
    # overlay.gso_max_size: largest GSO unit TCP may hand the overlay, i.e. the
    # largest spraying unit (None: spray_unit() picks one)
    gso_max_size: int | None = None
    # [security] key_file: the cluster key (None: no authentication)
    key_file: str | None = None

    def key_file_of(self, peer: "Peer") -> str | None:
        """The key file authenticating traffic with a peer, if any."""
        return peer.key_file or self.key_file

    @property
    def auth(self) -> bool:
        return any(self.key_file_of(p) for p in self.peers)

    def spray_unit(self) -> int:
        """The overlay's gso_max_size. Default 64 KiB / planes, at least
        16 KiB: units sprayed over n planes drain in parallel, so TCP sees
        reordering of about (n - 1) units. Measured one TCP connection on
        4 x 1 Gbit/s: 64 KiB units 3.22 Gbit/s with 8.5 % retransmissions,
        32 KiB 3.43 / 5.3 %, 16 KiB 3.58 / 0.45 %; on 8 x 0.5 Gbit/s 16 KiB
        beat 8 KiB (3.48 against 3.20 Gbit/s): below 16 KiB the per-unit CPU
        cost wins (docs/benchmarks/aggregation.md)."""
        if self.gso_max_size:
            return self.gso_max_size
        return max(16384, 65536 // max(1, len(self.planes)))

    def plane(self, device: str) -> Plane:
        for p in self.planes:
            if p.device == device:
                return p
        raise KeyError(device)

    def peer(self, name: str) -> Peer:
        for p in self.peers:
            if p.name == name:
                return p
        raise KeyError(name)

    def families(self) -> set[int]:
        return {a.version for peer in self.peers for a in peer.underlay.values()}

    def overhead(self) -> int:
        """Encapsulation bytes added to every packet (largest underlay family,
        and the MAC when any peer is authenticated)."""
        base = wire.MRC_OVERHEAD_V6 if 6 in self.families() else wire.MRC_OVERHEAD_V4
        return base + (wire.MRC_AUTH_LEN if self.auth else 0)


# ---------------------------------------------------------------- parsing helpers

_TYPE_NAMES = {str: "a string", int: "an integer", bool: "true or false",
               float: "a number", dict: "a table", list: "an array"}


def _typed(where: str, value, kind):
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, bool):
        raise ConfigError(f"{where}: must be {_TYPE_NAMES[kind]}, not {value!r}")
    if not isinstance(value, kind):
        raise ConfigError(f"{where}: must be {_TYPE_NAMES[kind]}, not {value!r}")
    return value


def _check_keys(where: str, table: dict, allowed: set[str]) -> None:
    for key in table:
        if key not in allowed:
            hint = difflib.get_close_matches(key, sorted(allowed), n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            prefix = f"{where}." if where else ""
            raise ConfigError(f"{prefix}{key}: unknown key{extra}")


def _int_in(where: str, value, lo: int, hi: int) -> int:
    value = _typed(where, value, int)
    if not lo <= value <= hi:
        raise ConfigError(f"{where}: {value} is out of range {lo}..{hi}")
    return value


def _float_in(where: str, value, lo: float, hi: float) -> float:
    value = _typed(where, value, float)
    if not lo <= value <= hi:
        raise ConfigError(f"{where}: {value:g} is out of range {lo:g}..{hi:g}")
    return value


def _ifname(where: str, value) -> str:
    value = _typed(where, value, str)
    if not IFNAME_RE.match(value):
        raise ConfigError(f"{where}: {value!r} is not a valid interface name")
    return value


def _ip(where: str, value):
    value = _typed(where, value, str)
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        raise ConfigError(f"{where}: {value!r} is not an IP address") from None


def _table_array(doc: dict, key: str, most: int) -> list:
    """A required [[key]] array of 1..most tables."""
    items = doc.get(key)
    if items is None or _typed(key, items, list) == []:
        raise ConfigError(f"{key}: at least one [[{key}]] is required")
    if len(items) > most:
        raise ConfigError(f"{key}: {len(items)} {key}s, at most {most} are supported")
    return items


# ---------------------------------------------------------------- the loader

def load(path: str | pathlib.Path) -> Config:
    path = pathlib.Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:   # the caller names the file
        raise ConfigError("no such file") from None
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}") from None
    cfg = parse(raw, source=str(path.resolve()))
    if cfg.auth:
        # A new key in the same file is a change `up` must apply: fold the
        # key files' contents (hashed; unreadable ones are preflight's to
        # report) into the digest that tells `up` whether anything changed.
        h = hashlib.sha256(cfg.digest.encode())
        for name in sorted({cfg.key_file_of(p) for p in cfg.peers} - {None}):
            try:
                h.update(hashlib.sha256(pathlib.Path(name).read_bytes()).digest())
            except OSError:
                pass
        cfg = dataclasses.replace(cfg, digest=h.hexdigest())
    return cfg


def parse(raw: bytes | str, source: str = "<string>") -> Config:
    if isinstance(raw, str):
        raw = raw.encode()
    try:
        doc = tomllib.loads(raw.decode())
    except UnicodeDecodeError:
        raise ConfigError("not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"TOML syntax: {e}") from None
    digest = hashlib.sha256(raw).hexdigest()
    return _build(doc, source, digest)


def _build(doc: dict, source: str, digest: str) -> Config:
    _check_keys("", doc, {"overlay", "plane", "peer", "health", "metrics", "weights", "security"})

    overlay = _typed("overlay", doc.get("overlay", None) or {}, dict)
    if "overlay" not in doc:
        raise ConfigError("overlay: missing table [overlay]")
    _check_keys("overlay", overlay, {"device", "address", "mtu", "udp_port", "gso_max_size"})
    device = _ifname("overlay.device", overlay.get("device", "mrc0"))
    if len(device) > 14:
        raise ConfigError(f"overlay.device: {device!r} is longer than 14 characters")
    if "address" not in overlay:
        raise ConfigError("overlay.address: missing (e.g. \"172.31.0.1/24\")")
    addr_s = _typed("overlay.address", overlay["address"], str)
    try:
        if "/" not in addr_s:
            raise ValueError
        ov_addr = ipaddress.IPv4Interface(addr_s)
    except ValueError:
        raise ConfigError(f"overlay.address: {addr_s!r} is not an IPv4 address with prefix length "
                          "(the overlay carries IPv4)") from None
    if ov_addr.ip.is_multicast or ov_addr.ip.is_unspecified or ov_addr.ip.is_loopback:
        raise ConfigError(f"overlay.address: {addr_s!r} cannot be used as a host address")
    mtu = overlay.get("mtu")
    if mtu is not None:
        mtu = _int_in("overlay.mtu", mtu, 576, 65535 - wire.MRC_OVERHEAD_V6)
    udp_port = _int_in("overlay.udp_port", overlay.get("udp_port", wire.MRC_DEFAULT_UDP_PORT), 1, 65535)
    gso_max_size = overlay.get("gso_max_size")
    if gso_max_size is not None:
        gso_max_size = _int_in("overlay.gso_max_size", gso_max_size, 1500, 65536)

    planes_raw = _table_array(doc, "plane", wire.MRC_MAX_PLANES)
    planes: list[Plane] = []
    for i, p in enumerate(planes_raw):
        where = f"plane[{i}]"
        p = _typed(where, p, dict)
        _check_keys(where, p, {"device", "weight", "address", "allow_underlay", "rx_hook"})
        if "device" not in p:
            raise ConfigError(f"{where}.device: missing")
        dev = _ifname(f"{where}.device", p["device"])
        if dev == device:
            raise ConfigError(f"{where}.device: {dev!r} is the overlay device")
        if any(q.device == dev for q in planes):
            raise ConfigError(f"{where}.device: duplicate plane {dev!r}")
        weight = _int_in(f"{where}.weight", p.get("weight", 1), 0, 1000)
        address = _ip(f"{where}.address", p["address"]) if "address" in p else None
        acl = _allow_underlay(f"{where}.allow_underlay", p["allow_underlay"]) \
            if "allow_underlay" in p else None
        rx_hook = _typed(f"{where}.rx_hook", p.get("rx_hook", RX_HOOK_DEFAULT), str)
        if rx_hook not in RX_HOOKS:
            raise ConfigError(f"{where}.rx_hook: {rx_hook!r} is not one of {', '.join(RX_HOOKS)}")
        planes.append(Plane(index=i, device=dev, weight=weight, address=address, allow_underlay=acl,
                            rx_hook=rx_hook))

    health = _health(doc.get("health", {}))

    peers_raw = _table_array(doc, "peer", wire.MRC_MAX_PEERS)
    peers: list[Peer] = []
    for i, p in enumerate(peers_raw):
        peers.append(_peer(i, _typed(f"peer[{i}]", p, dict), planes, ov_addr, peers))
        _peer_conflicts(peers, udp_port)

    if sum(p.weight for p in planes) == 0:
        raise ConfigError("plane: every plane has weight 0, nothing could be sent")
    return Config(source=source, digest=digest, overlay_device=device, overlay_address=ov_addr,
                  mtu=mtu, udp_port=udp_port, planes=tuple(planes), peers=tuple(peers), health=health,
                  metrics_listen=_metrics(doc.get("metrics", {})),
                  metrics_per_path=_metrics_per_path(doc.get("metrics", {})),
                  weights=_weights(doc.get("weights", {})), gso_max_size=gso_max_size,
                  key_file=_security(doc.get("security", {})))


def _key_file_name(where: str, value) -> str:
    value = _typed(where, value, str)
    if not value:
        raise ConfigError(f"{where}: empty")
    return value


def _security(sec) -> str | None:
    sec = _typed("security", sec, dict)
    _check_keys("security", sec, {"key_file"})
    return _key_file_name("security.key_file", sec["key_file"]) if "key_file" in sec else None


KEY_LEN = 16


def read_key(where: str, path: str) -> bytes:
    """A key file: 32 hex digits (16 bytes, e.g. `openssl rand -hex 16`),
    readable by nobody but its owner and group. The key itself never
    appears in a message."""
    import os
    import stat
    try:
        st = os.stat(path)
        if st.st_mode & stat.S_IRWXO:
            raise ConfigError(f"{where}: {path} is accessible to every user (mode "
                              f"{stat.S_IMODE(st.st_mode):04o}); a key must not be: chmod o-rwx {path}")
        text = pathlib.Path(path).read_text().strip()
    except FileNotFoundError:
        raise ConfigError(f"{where}: {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: {path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    if not re.fullmatch(r"[0-9A-Fa-f]{%d}" % (2 * KEY_LEN), text):
        raise ConfigError(f"{where}: {path} must hold {2 * KEY_LEN} hex digits ({KEY_LEN} bytes, e.g. "
                          f"`openssl rand -hex {KEY_LEN}`)")
    return bytes.fromhex(text)


# allow_underlay protocol names; icmp / icmpv6 also fix the family
ACL_PROTOS = {"icmp": (1, 4), "icmpv6": (58, 6), "tcp": (6, 0), "udp": (17, 0), "sctp": (132, 0),
              "gre": (47, 0), "esp": (50, 0), "ospf": (89, 0), "vrrp": (112, 0)}


def _acl_entry(where: str, text: str) -> AclEntry:
    """One entry: whitespace-separated terms, each at most once: a source
    prefix (\"192.0.2.0/24\", an address is a /32 or /128), a protocol
    (a name of ACL_PROTOS or proto/NUMBER), optionally with a destination port
    or range (\"tcp/22\", \"udp/4000-4100\")."""
    terms = text.split()
    if not terms:
        raise ConfigError(f"{where}: empty entry")
    family = proto = lo = hi = 0
    prefix = None
    for t in terms:
        if t[0].isdigit() or ":" in t:
            if prefix is not None:
                raise ConfigError(f"{where}: {text!r} names two prefixes")
            try:
                prefix = ipaddress.ip_network(t, strict=False)
            except ValueError:
                raise ConfigError(f"{where}: {t!r} is not an address or prefix") from None
            continue
        if proto:
            raise ConfigError(f"{where}: {text!r} names two protocols")
        name, _, port = t.lower().partition("/")
        if name == "proto":
            if not port.isdigit() or not 1 <= int(port) <= 255:
                raise ConfigError(f"{where}: {t!r}: proto/NUMBER needs 1..255")
            proto, port = int(port), ""
        elif name in ACL_PROTOS:
            proto, family = ACL_PROTOS[name][0], ACL_PROTOS[name][1] or family
        else:
            raise ConfigError(f"{where}: {t!r} is not a prefix or one of "
                              f"{', '.join(ACL_PROTOS)}, proto/NUMBER")
        if port:
            if proto not in (6, 17):
                raise ConfigError(f"{where}: {t!r}: ports only with tcp or udp")
            m = re.fullmatch(r"(\d{1,5})(?:-(\d{1,5}))?", port)
            lo = int(m.group(1)) if m else 0
            hi = int(m.group(2) or lo) if m else 0
            if not m or not 1 <= lo <= hi <= 65535:
                raise ConfigError(f"{where}: {t!r}: the port must be 1..65535 or a range LO-HI")
    if prefix is not None:
        if family and family != prefix.version:
            raise ConfigError(f"{where}: {text!r}: {prefix} is IPv{prefix.version}")
        family = prefix.version
    norm = " ".join(x for x in (str(prefix) if prefix else "",
                                 next((n for n, (v, _f) in ACL_PROTOS.items() if v == proto), f"proto/{proto}")
                                 if proto else "") if x)
    if lo:
        norm += f"/{lo}" + (f"-{hi}" if hi != lo else "")
    return AclEntry(text=norm, family=family, proto=proto, port_lo=lo, port_hi=hi, prefix=prefix)


def _allow_underlay(where: str, value) -> tuple[AclEntry, ...]:
    value = _typed(where, value, list)
    if len(value) > wire.MRC_ACL_RULES:
        raise ConfigError(f"{where}: {len(value)} entries, at most {wire.MRC_ACL_RULES}")
    return tuple(_acl_entry(f"{where}[{i}]", _typed(f"{where}[{i}]", e, str)) for i, e in enumerate(value))


def _weights(w) -> Weights:
    w = _typed("weights", w, dict)
    _check_keys("weights", w, {"mode", "interval_ms", "min_weight"})
    d = Weights()
    mode = _typed("weights.mode", w.get("mode", d.mode), str)
    if mode not in WEIGHT_MODES:
        raise ConfigError(f"weights.mode: {mode!r} is not one of {', '.join(WEIGHT_MODES)}")
    iv = _float_in("weights.interval_ms", w.get("interval_ms", d.interval_ms), 1, 10000)
    mw = _float_in("weights.min_weight", w.get("min_weight", d.min_weight), 0, 0.5)
    return Weights(mode=mode, interval_ms=iv, min_weight=mw)


def parse_listen(where: str, value) -> tuple[str, int]:
    """"HOST:PORT", "[v6]:PORT" or ":PORT" (= 127.0.0.1) -> (host, port)."""
    value = _typed(where, value, str)
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"{where}: {value!r} is not HOST:PORT (e.g. \"127.0.0.1:9477\")")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    host = host or "127.0.0.1"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not re.fullmatch(r"[A-Za-z0-9.-]{1,253}", host):
            raise ConfigError(f"{where}: {host!r} is not an address or host name") from None
    return host, int(port)


def _metrics(m) -> str | None:
    m = _typed("metrics", m, dict)
    _check_keys("metrics", m, {"listen", "per_path"})
    if "listen" not in m:
        return None
    parse_listen("metrics.listen", m["listen"])
    return m["listen"]


def _metrics_per_path(m) -> bool:
    return _typed("metrics.per_path", m.get("per_path", False), bool)


def _health(h) -> Health:
    h = _typed("health", h, dict)
    _check_keys("health", h, {"dead_after_ms", "probe_interval_ms", "recover_probes", "hedge", "liveness",
                              "hedge_after_ms", "probe_budget"})
    d = Health()
    dead = _float_in("health.dead_after_ms", h.get("dead_after_ms", d.dead_after_ms), 0.5, 60000)
    probe = _float_in("health.probe_interval_ms", h.get("probe_interval_ms", d.probe_interval_ms), 1, 60000)
    k = _int_in("health.recover_probes", h.get("recover_probes", d.recover_probes), 1, 100)
    budget = _int_in("health.probe_budget", h.get("probe_budget", d.probe_budget), 10, 1_000_000)
    hedge = h.get("hedge", d.hedge)
    if hedge != "always":
        try:
            hedge = _typed("health.hedge", hedge, bool)
        except ConfigError:
            raise ConfigError(f"health.hedge: must be true, false or \"always\", not {hedge!r}") from None
    live = _typed("health.liveness", h.get("liveness", d.liveness), bool)
    hedge_after = None
    if "hedge_after_ms" in h:
        hedge_after = _typed("health.hedge_after_ms", h["hedge_after_ms"], float)
        if not 0.1 <= hedge_after <= dead:
            raise ConfigError(f"health.hedge_after_ms: {hedge_after:g} is out of range 0.1..{dead:g} "
                              "(health.dead_after_ms)")
    return Health(dead_after_ms=dead, probe_interval_ms=probe, recover_probes=k, hedge=hedge, liveness=live,
                  hedge_after_ms=hedge_after, probe_budget=budget)


def _peer_conflicts(peers: list[Peer], udp_port: int) -> None:
    """Checks of the newest peer against the others and the instance."""
    new, where = peers[-1], f"peer[{len(peers) - 1}]"
    # The receiver knows a sender by (plane, source address): a second peer
    # with the same address on a plane would silently take over the first's.
    for dev, addr in new.underlay.items():
        for old in peers[:-1]:
            if old.underlay.get(dev) == addr:
                raise ConfigError(f"{where}.underlay.{dev}: {addr} is already peer '{old.name}''s "
                                  f"address on plane '{dev}'")
    # Probe replies travel from the MRC port to an EV: an EV equal to the
    # MRC port would make replies indistinguishable from data.
    last = new.ev_base + len(new.paths) - 1
    if new.ev_base <= udp_port <= last:
        raise ConfigError(f"{where}.ev_base: EVs {new.ev_base}..{last} include the MRC UDP port {udp_port}")


def _peer(i: int, p: dict, planes: list[Plane], ov_addr, seen: list[Peer]) -> Peer:
    where = f"peer[{i}]"
    _check_keys(where, p, {"name", "overlay", "evs_per_plane", "ev_base", "spray", "min_active", "underlay",
                           "flowlet_gap_us", "key_file"})
    if "name" not in p:
        raise ConfigError(f"{where}.name: missing")
    name = _typed(f"{where}.name", p["name"], str)
    if not PEER_NAME_RE.match(name):
        raise ConfigError(f"{where}.name: {name!r} is not a valid peer name (letters, digits, _ . -)")
    if any(q.name == name for q in seen):
        raise ConfigError(f"{where}.name: duplicate peer {name!r}")
    if "overlay" not in p:
        raise ConfigError(f"{where}.overlay: missing")
    overlay = _ip(f"{where}.overlay", p["overlay"])
    if overlay.version != 4:
        raise ConfigError(f"{where}.overlay: {overlay} is not IPv4 (the overlay carries IPv4)")
    if overlay == ov_addr.ip:
        raise ConfigError(f"{where}.overlay: {overlay} is this host's own overlay address")
    if any(q.overlay == overlay for q in seen):
        raise ConfigError(f"{where}.overlay: {overlay} is already used by another peer")
    evs = _int_in(f"{where}.evs_per_plane", p.get("evs_per_plane", 4), 1, wire.MRC_MAX_PATHS)
    spray = _typed(f"{where}.spray", p.get("spray", wire.SprayMode.WEIGHTED.label), str)
    if spray not in SPRAY_MODES:
        raise ConfigError(f"{where}.spray: {spray!r} is not one of {', '.join(SPRAY_MODES)}")
    gap = _int_in(f"{where}.flowlet_gap_us", p.get("flowlet_gap_us", 0), 0, 10_000_000)
    if "underlay" not in p:
        raise ConfigError(f"{where}.underlay: missing (plane device -> the peer's address on it)")
    und = _typed(f"{where}.underlay", p["underlay"], dict)
    if not und:
        raise ConfigError(f"{where}.underlay: empty, the peer needs an address on at least one plane")
    known = {pl.device for pl in planes}
    underlay = {}
    for dev, a in und.items():
        if dev not in known:
            hint = difflib.get_close_matches(dev, sorted(known), n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ConfigError(f"{where}.underlay.{dev}: no such plane in this config{extra}")
        addr = _ip(f"{where}.underlay.{dev}", a)
        if addr.is_multicast or addr.is_unspecified or addr.is_loopback:
            raise ConfigError(f"{where}.underlay.{dev}: {addr} cannot be a peer address")
        plane = next(pl for pl in planes if pl.device == dev)
        if plane.address is not None and plane.address.version != addr.version:
            raise ConfigError(f"{where}.underlay.{dev}: {addr} is IPv{addr.version} but plane "
                              f"{dev!r} has an IPv{plane.address.version} address")
        if ov_addr.version == addr.version and addr in ov_addr.network:
            raise ConfigError(f"{where}.underlay.{dev}: {addr} lies inside the overlay subnet {ov_addr.network}")
        underlay[dev] = addr
    n_paths = evs * len(underlay)
    if n_paths > wire.MRC_MAX_PATHS:
        raise ConfigError(f"{where}.evs_per_plane: {evs} EVs x {len(underlay)} planes = {n_paths} paths, "
                          f"at most {wire.MRC_MAX_PATHS}")
    ev_base = _int_in(f"{where}.ev_base", p.get("ev_base", wire.MRC_DEFAULT_EV_BASE), 1024, 65535)
    if ev_base + n_paths - 1 > 65535:
        raise ConfigError(f"{where}.ev_base: {ev_base} + {n_paths} paths runs past port 65535")
    min_active = _int_in(f"{where}.min_active", p.get("min_active", 1), 0, n_paths)

    # Path ids are dense over the planes the peer is reachable on, in plane
    # order, so two hosts that list their planes in the same order agree on ids.
    paths = []
    for plane in planes:
        if plane.device not in underlay:
            continue
        for e in range(evs):
            pid = len(paths)
            paths.append(Path(id=pid, plane=plane, ev_index=e, ev=ev_base + pid,
                              remote=underlay[plane.device], weight=plane.weight))
    return Peer(index=i, name=name, overlay=overlay, evs_per_plane=evs, ev_base=ev_base, spray=spray,
                min_active=min_active, underlay=underlay, paths=tuple(paths), flowlet_gap_us=gap,
                key_file=_key_file_name(f"{where}.key_file", p["key_file"]) if "key_file" in p else None)
