"""The TOML configuration: parsing, strict validation and the path plan.

Every problem is reported as one ConfigError whose message names the key
("plane[2].device: ...") so the CLI can print a single line and exit 2.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import ipaddress
import os
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
# docs/benchmarks/receive-hook.md. tc hands a unit on whole; an inner UDP
# GSO unit arrives segmented only because `up` turns tx-udp-segmentation
# off on the sender's virtual planes (reconcile.py), so a peer running an
# mrc from before that can still send tc planes units a UDP socket drops.
RX_HOOKS = ("auto", "xdp", "tc")
RX_HOOK_DEFAULT = "auto"


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


@dataclass(frozen=True, slots=True)
class Plane:
    index: int
    device: str
    weight: int = 1
    address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None
    # None: every non-MRC frame reaches the stack (the default); a tuple
    # (maybe empty): only ARP, IPv6 ND and these (bpf/acl.h)
    allow_underlay: tuple[AclEntry, ...] | None = None
    rx_hook: str = RX_HOOK_DEFAULT


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class Peer:
    index: int
    name: str
    # peer[].overlay: its overlay addresses, at most one per family, in
    # the order given
    overlays: tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, ...]
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
    # peer[].prefixes: networks behind the peer (pods, containers), routed
    # to it through the overlay
    prefixes: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    @property
    def overlay(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        """The first overlay address (the one a single-family config has)."""
        return self.overlays[0]

    def owned(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        """What the peer owns in mrc_ovl_owner (and what is routed to it):
        its overlay addresses as /32, /128, then its prefixes."""
        return [ipaddress.ip_network(a) for a in self.overlays] + list(self.prefixes)
    # where it is defined: "inline" (a [[peer]] table of the config file)
    # or the path of its file in [peers] dir
    source: str = "inline"


WEIGHT_MODES = ("fixed", "adaptive")


@dataclass(frozen=True)
class Weights:
    """[weights]: fixed = the planes' configured weights; adaptive = the
    agent re-weights paths by what they deliver (mrcctl/agent/weights.py).
    Default: adaptive, unless a plane has a `weight` of its own (then what
    the operator typed stands: fixed)."""
    mode: str = "adaptive"
    mode_set: bool = False        # written in the config (else the default, see weights_mode)
    interval_ms: float = 10.0
    min_weight: float = 0.02      # floor of a usable path's share, so it keeps being measured
    ecn_hold_us: float = 1000.0   # after a CE echo the slot walk passes the path over this long (bpf/congest.h)
    per_ev: bool = True           # adaptive mode also splits each plane over its EVs by their own queues
    loss: bool = True             # ... and moves weight off EVs whose echoes report loss (docs/fabric.md)


EV_MAP_MODES = ("auto", "off")


@dataclass(frozen=True)
class EvMap:
    """[ev_map]: which fabric links each EV of a peer behind a gateway
    crosses, learnt from EV traces (TTL-limited frames the routers on the
    way answer), and each plane's EVs moved onto ports that spread them
    evenly over those links (mrcctl/agent/evmap.py). auto (the default):
    peers behind a gateway (on-link peers have no fabric to map); off:
    every path keeps its configured EV."""
    mode: str = "auto"
    # router hops past the first gateway whose answers tell EVs apart: 1
    # for leaf-spine planes (the spine), 2 for three tiers
    depth: int = 1
    # ports tried per path, its configured EV included: with 3, 4 EVs over
    # 2 spines find a 2:2 split but 1 time in ~150 (with 2: 1 in ~14)
    candidates: int = 3


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
    # suspect threshold; None = dead_after_ms / 4: until a path is suspect its units are
    # lost with it, and one-way traffic has no TCP to resend them (docs/benchmarks/failover-trials.md)
    hedge_after_ms: float | None = None
    # EV probes per second per host at most (the agent's Prober)
    probe_budget: int = 2000
    # how probes leave: "packet" (AF_PACKET, one sendmmsg per plane and round, through the
    # host's egress path) or "xdp" (the probe generator, bpf/probe_gen.bpf.c: one live-frames
    # test run per 256 probes, past qdisc, tc and netfilter egress; planes whose driver cannot
    # transmit redirected frames still use "packet")
    probe_sender: str = "packet"
    # a plane with rx_hook = "tc" answers one-way traffic with feedback frames (bpf/feedback.h)
    feedback_frames: bool = True

    @property
    def hedge_after(self) -> float:
        return self.hedge_after_ms if self.hedge_after_ms is not None else self.dead_after_ms / 4


# Path slots (peers x stride) cheap enough to give by default: 64 peers x
# 256 paths, what the maps always held before they were sized from the
# config (about 6 MiB on 2 CPUs).
ROOMY_SLOTS = 64 * 256
# mrc_flowlets entries (Config.flowlet_room); FLOWLETS_ROOM is MRC_FLOWLETS of bpf/spray.h
FLOWLETS_ROOM = 16384
FLOWLETS_IDLE = 2048


@dataclass(frozen=True)
class Config:
    source: str
    digest: str
    overlay_device: str
    # overlay.address: this host's overlay addresses, at most one per family
    overlay_addresses: tuple[ipaddress.IPv4Interface | ipaddress.IPv6Interface, ...]
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
    ev_map: EvMap = field(default_factory=EvMap)
    # overlay.gso_max_size: largest GSO unit TCP may hand the overlay, i.e. the
    # largest spraying unit (None: spray_unit() picks one)
    gso_max_size: int | None = None
    # [security] key_file: the cluster key (None: no authentication)
    key_file: str | None = None
    # overlay.prefixes: networks served here besides the overlay addresses
    # (pods behind this host), which peers may send to
    overlay_prefixes: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    # overlay.paws_guard: lift a delivered TCP segment's timestamp that
    # reordering across paths left older than PAWS accepts (bpf/paws.h)
    paws_guard: bool = True
    # overlay.rto_min_ms: the RTO floor the routes to peers give inner TCP
    # (the route metric rto_min); 0 = the kernel's own (200 ms)
    rto_min_ms: int = 5
    # overlay.tcp_min_rtt_wlen: what `up` sets net.ipv4.tcp_min_rtt_wlen
    # to in its network namespace, restored when the last instance there
    # goes down (None, "keep", the default: the host's value stands). The
    # window of TCP's min_rtt bounds RACK's reordering window (min_rtt / 4
    # per DSACK step): over sprayed paths min_rtt is an empty queue's few
    # µs, and units reordered by ms on slow links read as loss. 0 cut the
    # spurious retransmissions on 200 Mbit/s fabric links from 8-15 % to
    # 1-3 %, but lengthened failover stalls (docs/fabric.md, "Slow links"),
    # so it is the operator's choice
    tcp_min_rtt_wlen: int | None = None

    @property
    def overlay_address(self) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
        """The first overlay address (the one a single-family config has)."""
        return self.overlay_addresses[0]

    def overlay_families(self) -> set[int]:
        return {a.version for a in self.overlay_addresses}

    def local_owned(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        """What mrc_ovl_owner marks as served here: our overlay addresses
        as /32, /128, and overlay.prefixes."""
        return [ipaddress.ip_network(a.ip) for a in self.overlay_addresses] + list(self.overlay_prefixes)
    # [peers] dir: a directory of one TOML file per peer, merged with the
    # [[peer]] tables and watched by the agent (None: inline peers only)
    peers_dir: str | None = None
    # the digest of the config file alone (digest covers the peer files too)
    file_digest: str = ""
    # peer files left out because they do not validate (a lenient load)
    peer_errors: tuple[str, ...] = ()
    # [limits] max_peers / max_paths_per_peer: room the maps are sized for
    # (None: derived from the peers, see sizing())
    max_peers: int | None = None
    max_paths_per_peer: int | None = None

    def flowlet_room(self) -> int:
        """Flows the flowlet cache (mrc_flowlets, LRU) has room for: all of
        FLOWLETS_ROOM when a configured peer sprays flowlets, else
        FLOWLETS_IDLE (a peer switched to flowlets by `mrcctl spray` still
        works, its flows evicted sooner). 1.4 MiB against 0.2."""
        return FLOWLETS_ROOM if any(p.spray == "flowlet" for p in self.peers) else FLOWLETS_IDLE

    def room(self, n: int | None = None) -> int:
        """Peers the maps have room for with n peers (default: the
        configured count): limits.max_peers, else n plus 1/64 (at least
        16), in steps of 64, at least MRC_DEFAULT_PEERS."""
        n = len(self.peers) if n is None else n
        return self.max_peers or min(wire.MRC_PEERS_LIMIT, max(
            wire.MRC_DEFAULT_PEERS, -(-(n + max(16, n // 64)) // 64) * 64))

    def sizing(self) -> wire.Sizing:
        """How big the datapath's maps are for this config (bpf/sizing.h).
        Peers: limits.max_peers, else the peers configured plus 1/64 (at
        least 16) for peers added later, in steps of 64, at least
        MRC_DEFAULT_PEERS: a few more peers keep the maps as they are (more
        resize them, keeping every peer's state, objects.carry_resized).
        Paths: the stride, a power of two at least limits.max_paths_per_peer
        and the largest peer's paths; without the limit, as many more as
        keep the path slots within ROOMY_SLOTS (64 peers: 256 paths each),
        so that a few more EVs or planes need no new maps either. Memory
        per peer and path: docs/operator-guide.md ([limits])."""
        # indices, not the count: a live membership leaves holes (assign_indices)
        peers = self.room(max(len(self.peers), max((p.index for p in self.peers), default=-1) + 1))
        need = [len(p.paths) for p in self.peers]
        if self.max_paths_per_peer:
            need.append(self.max_paths_per_peer)
        else:
            need.append(min(wire.MRC_MAX_PATHS, 1 << ((ROOMY_SLOTS // peers).bit_length() - 1)))
        return wire.Sizing.of(peers, max(need))

    def key_file_of(self, peer: "Peer") -> str | None:
        """The key file authenticating traffic with a peer, if any."""
        return peer.key_file or self.key_file

    @property
    def auth(self) -> bool:
        return any(self.key_file_of(p) for p in self.peers)

    def spray_unit(self, whole_units: bool = False) -> int:
        """The overlay's gso_max_size. Units sprayed over n planes drain in
        parallel, so the receiver sees reordering of about (n - 1) units.
        Where a unit reaches the peer's TCP segment by segment (XDP, NICs:
        whole_units False), 64 KiB / planes, at least 16 KiB: one TCP
        connection on 4 x 1 Gbit/s veth planes received with XDP moved
        3.22 Gbit/s with 8.5 % retransmissions at 64 KiB, 3.58 / 0.45 % at
        16 KiB; on 8 x 0.5 Gbit/s 16 KiB beat 8 KiB (3.48 against 3.20):
        below 16 KiB the per-unit CPU cost wins. Where every plane is a
        veth received at tc ingress and every peer is on-link
        (whole_units, decided by `up`), a unit crosses whole and TCP takes
        it as one skb, reordered only against other units: 64 KiB, the
        kernel's own, moved 3.59-3.66 Gbit/s on those planes with 0.4-0.8 %
        retransmissions, 16 KiB the same goodput with 0.4-3.6 %, at twice
        the CPU per GB (docs/benchmarks/aggregation.md)."""
        if self.gso_max_size:
            return self.gso_max_size
        if whole_units:
            return 65536
        return max(16384, 65536 // max(1, len(self.planes)))

    @property
    def index_span(self) -> int:
        """1 + the highest peer index: how far a batch read over the
        peers must reach (indices are stable, not dense: instance/members.py)."""
        return 1 + max((p.index for p in self.peers), default=-1)

    def peer_at(self, index: int) -> "Peer | None":
        """The peer with map index `index`, if any."""
        for p in self.peers:
            if p.index == index:
                return p
        return None

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

class LoadCache:
    """What load() parsed the last time, for a caller that loads the same
    file again after each change of its peers (the agent's peers watcher):
    the config file's own parse while its bytes stay the same, and each peer
    file's peer while its bytes and the config file's stay the same. A
    cached peer is checked against the others again (names, addresses); one
    that conflicts is parsed again, which says how."""

    def __init__(self):
        self.main: tuple[bytes, Config] | None = None
        self.files: dict[str, tuple[bytes, "Peer | None"]] = {}


def load(path: str | pathlib.Path, peer_files: dict[str, bytes | None] | None = None,
         strict: bool = True, cache: LoadCache | None = None) -> Config:
    """The config file with the peers of its [peers] dir. `peer_files`
    (file name -> contents, None: absent) overrides what the directory holds,
    so that a change can be validated before it is written. strict=False
    leaves out peer files that do not validate (Config.peer_errors says
    which and why): one bad file must not stop `status` or `down`."""
    path = pathlib.Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:   # the caller names the file
        raise ConfigError("no such file") from None
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}") from None
    source = str(path.resolve())
    if cache is not None and cache.main is not None and cache.main[0] == raw and cache.main[1].source == source:
        base = cache.main[1]
    else:
        base = parse(raw, source=source)
        if cache is not None:
            cache.main, cache.files = (raw, base), {}
    cfg = with_peers_dir(base, peer_files, strict, cache)
    if cfg.auth:
        # A new key in the same file is a change `up` must apply: fold the
        # key files' contents (hashed; unreadable ones are preflight's to
        # report) into the digest that tells `up` whether anything changed.
        cfg = dataclasses.replace(cfg, digest=_keys_digest(cfg.digest, cfg))
    return cfg


def _keys_digest(digest: str, cfg: Config) -> str:
    h = hashlib.sha256(digest.encode())
    for name in sorted({cfg.key_file_of(p) for p in cfg.peers} - {None}):
        try:
            h.update(hashlib.sha256(pathlib.Path(name).read_bytes()).digest())
        except OSError:
            pass
    return h.hexdigest()


def _files_digest(digest: str, files: dict[str, bytes]) -> str:
    """The config file's digest with the peers dir's files folded in."""
    h = hashlib.sha256(digest.encode())
    for fname in sorted(files):
        h.update(fname.encode() + b"\0" + hashlib.sha256(files[fname]).digest())
    return h.hexdigest()


def digest_on_disk(cfg: Config) -> str | None:
    """What load() would give as the digest of `cfg`'s files as they are
    now, from their bytes alone (None: unreadable). Parsing is what costs:
    1.5 s for 4,096 peers, where reading and hashing their files is tens of
    ms; a watcher asks this first and parses only when it differs."""
    try:
        digest = hashlib.sha256(pathlib.Path(cfg.source).read_bytes()).hexdigest()
        d = peers_dir_path(cfg)
        if d is not None:
            digest = _files_digest(digest, read_peers_dir(d))
    except (OSError, ConfigError):
        return None
    return _keys_digest(digest, cfg) if cfg.auth else digest


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
    _check_keys("", doc, {"overlay", "plane", "peer", "peers", "health", "metrics", "weights", "security",
                          "limits", "ev_map"})

    overlay = _typed("overlay", doc.get("overlay", None) or {}, dict)
    if "overlay" not in doc:
        raise ConfigError("overlay: missing table [overlay]")
    _check_keys("overlay", overlay, {"device", "address", "mtu", "udp_port", "gso_max_size", "prefixes",
                                     "paws_guard", "rto_min_ms", "tcp_min_rtt_wlen"})
    device = _ifname("overlay.device", overlay.get("device", "mrc0"))
    if len(device) > 14:
        raise ConfigError(f"overlay.device: {device!r} is longer than 14 characters")
    if "address" not in overlay:
        raise ConfigError("overlay.address: missing (e.g. \"172.31.0.1/24\", or "
                          "[\"172.31.0.1/24\", \"fd31::1/64\"] for both families)")
    ov_addrs = _overlay_addresses(overlay["address"])
    ov_prefixes = _prefixes("overlay.prefixes", overlay.get("prefixes", []))
    mtu = overlay.get("mtu")
    if mtu is not None:
        # IPv6 needs links of 1280 bytes at least (RFC 8200)
        mtu = _int_in("overlay.mtu", mtu, 1280 if 6 in {a.version for a in ov_addrs} else 576,
                      65535 - wire.MRC_OVERHEAD_V6)
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

    max_peers, max_paths = _limits(doc.get("limits", {}))
    n_raw = len(doc["peer"]) if isinstance(doc.get("peer"), list) else 0
    if max_peers is not None and n_raw > max_peers:
        raise ConfigError(f"peer: {n_raw} peers, more than limits.max_peers = {max_peers}")
    peers_dir = _peers_table(doc.get("peers", {}))
    if peers_dir is not None and not doc.get("peer"):
        peers_raw = []          # peers may all come from the directory, or none yet
    else:
        peers_raw = _table_array(doc, "peer", wire.MRC_PEERS_LIMIT)
    peers: list[Peer] = []
    seen = _Seen()
    for i, p in enumerate(peers_raw):
        peers.append(_peer(i, _typed(f"peer[{i}]", p, dict), planes, ov_addrs, seen))
        _peer_conflicts(peers, udp_port, seen)
        if max_paths is not None and len(peers[-1].paths) > max_paths:
            raise ConfigError(f"peer[{i}]: {len(peers[-1].paths)} paths, more than limits.max_paths_per_peer "
                              f"= {max_paths}")
    _owner_conflicts(ov_addrs, ov_prefixes, peers)

    if sum(p.weight for p in planes) == 0:
        raise ConfigError("plane: every plane has weight 0, nothing could be sent")
    return Config(source=source, digest=digest, overlay_device=device, overlay_addresses=ov_addrs,
                  overlay_prefixes=ov_prefixes,
                  mtu=mtu, udp_port=udp_port, planes=tuple(planes), peers=tuple(peers), health=health,
                  metrics_listen=_metrics(doc.get("metrics", {})),
                  metrics_per_path=_metrics_per_path(doc.get("metrics", {})),
                  weights=_weights(doc.get("weights", {}), any("weight" in p for p in planes_raw)),
                  ev_map=_ev_map(doc.get("ev_map", {})),
                  gso_max_size=gso_max_size,
                  key_file=_security(doc.get("security", {})), peers_dir=peers_dir, file_digest=digest,
                  max_peers=max_peers, max_paths_per_peer=max_paths,
                  paws_guard=_typed("overlay.paws_guard", overlay.get("paws_guard", True), bool),
                  rto_min_ms=_int_in("overlay.rto_min_ms", overlay.get("rto_min_ms", 5), 0, 1000),
                  tcp_min_rtt_wlen=_min_rtt_wlen(overlay.get("tcp_min_rtt_wlen", "keep")))


def _min_rtt_wlen(v) -> int | None:
    if v == "keep":
        return None
    if isinstance(v, str):
        raise ConfigError(f"overlay.tcp_min_rtt_wlen: {v!r} is neither \"keep\" nor a number of seconds")
    return _int_in("overlay.tcp_min_rtt_wlen", v, 0, 86400)


def _peers_table(t) -> str | None:
    t = _typed("peers", t, dict)
    _check_keys("peers", t, {"dir"})
    if "dir" not in t:
        return None
    d = _typed("peers.dir", t["dir"], str)
    if not d:
        raise ConfigError("peers.dir: empty")
    return d


# ---------------------------------------------------------------- the peers directory

PEER_FILE_SUFFIX = ".toml"


def is_peer_file(name: str) -> bool:
    """Which names in a peers directory are peers: NAME.toml, not hidden
    (editors' and our own temporary files start with a dot, and so do the
    `..data` links a Kubernetes ConfigMap volume is made of)."""
    return name.endswith(PEER_FILE_SUFFIX) and not name.startswith(".") and len(name) > len(PEER_FILE_SUFFIX)


def peers_dir_path(cfg: Config) -> pathlib.Path | None:
    """[peers] dir, relative to the config file's directory."""
    if cfg.peers_dir is None:
        return None
    d = pathlib.Path(cfg.peers_dir)
    return d if d.is_absolute() else pathlib.Path(cfg.source).parent / d


def with_peers_dir(cfg: Config, peer_files: dict[str, bytes | None] | None = None,
                   strict: bool = True, cache: LoadCache | None = None) -> Config:
    """A parsed config with the peers of its [peers] dir (if any)."""
    d = peers_dir_path(cfg)
    if d is None:
        return cfg
    files = read_peers_dir(d)
    for name, content in (peer_files or {}).items():
        if content is None:
            files.pop(name, None)
        else:
            files[name] = content
    return merge_peer_files(cfg, str(d), files, strict, cache)


def read_peers_dir(d: pathlib.Path) -> dict[str, bytes]:
    """File name -> contents of every peer file in `d`."""
    try:
        names = sorted(os.listdir(d))
    except FileNotFoundError:
        raise ConfigError(f"peers.dir: {d}: no such directory") from None
    except NotADirectoryError:
        raise ConfigError(f"peers.dir: {d}: not a directory") from None
    except OSError as e:
        raise ConfigError(f"peers.dir: {d}: cannot read: {e.strerror}") from None
    out = {}
    for name in names:
        if not is_peer_file(name):
            continue
        try:
            out[name] = (d / name).read_bytes()
        except FileNotFoundError:
            continue        # removed while we listed
        except IsADirectoryError:
            raise ConfigError(f"peers.dir: {d / name}: a directory, not a peer file") from None
        except OSError as e:
            raise ConfigError(f"{d / name}: cannot read: {e.strerror}") from None
    return out


def merge_peer_files(cfg: Config, d: str, files: dict[str, bytes], strict: bool = True,
                     cache: LoadCache | None = None) -> Config:
    """`cfg` with the peers of `files` (name -> contents) after its inline
    ones, in file name order: one TOML table per file, the keys of a [[peer]]
    table; `name` defaults to the file name without .toml. A file with this
    host's own overlay address is skipped. Every check of an
    inline peer applies, across files too (a duplicate overlay address in
    two files names both). The digest covers every file, so that `up` sees
    a change."""
    peers = list(cfg.peers)
    seen = _Seen.of(peers)
    errors = []
    parsed = cache.files if cache is not None else None
    kept: dict[str, tuple[bytes, Peer | None]] = {}
    for fname in sorted(files):
        raw = files[fname]
        try:
            peer = _peer_file(cfg, pathlib.Path(d) / fname, raw, peers, seen, parsed, kept)
        except ConfigError as e:
            if strict:
                raise
            errors.append(str(e))
            continue
        if peer is not None:
            peers.append(peer)
    if cache is not None:
        cache.files = kept
    # prefixes across files: one sweep over everything (a file at a time
    # would be quadratic in the peers)
    try:
        _owner_conflicts(cfg.overlay_addresses, cfg.overlay_prefixes, peers)
    except ConfigError as e:
        if strict:
            raise
        errors.append(str(e))     # up (strict) refuses it; the others keep running
    return dataclasses.replace(cfg, peers=tuple(peers), digest=_files_digest(cfg.digest, files), file_digest=cfg.digest,
                               peer_errors=tuple(errors))


def _peer_file(cfg: Config, path: pathlib.Path, raw: bytes, peers: list[Peer], seen: "_Seen",
               parsed: dict | None = None, kept: dict | None = None) -> Peer | None:
    """One peer file after `peers`; None: it is this host's own. `parsed`:
    file name -> (contents, peer) of an earlier load with the same config
    file (LoadCache); `kept` gets this one's."""
    where = str(path)
    hit = parsed.get(path.name) if parsed else None
    if hit is not None and hit[0] == raw and (hit[1] is None or not seen.conflicts(hit[1])):
        peer = hit[1]
        if peer is not None:
            _room_for_one_more(cfg, peers, where)
            if peer.index != len(peers):
                peer = dataclasses.replace(peer, index=len(peers))
            seen.add(peer)
        kept[path.name] = hit
        return peer
    peer = _parse_peer_file(cfg, path, raw, peers, seen)
    if kept is not None:
        kept[path.name] = (raw, peer)
    return peer


def _room_for_one_more(cfg: Config, peers: list[Peer], where: str) -> None:
    limit = cfg.max_peers or wire.MRC_PEERS_LIMIT
    if len(peers) >= limit:
        raise ConfigError(f"{where}: more than {limit} peers, at most {limit} are supported"
                          + (" (limits.max_peers)" if cfg.max_peers else ""))


def _parse_peer_file(cfg: Config, path: pathlib.Path, raw: bytes, peers: list[Peer], seen: "_Seen") -> Peer | None:
    where = str(path)
    try:
        doc = tomllib.loads(raw.decode())
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: TOML syntax: {e}") from None
    doc.setdefault("name", path.name[:-len(PEER_FILE_SUFFIX)])
    ovs = doc.get("overlay")
    ovs = [ovs] if isinstance(ovs, str) else ovs if isinstance(ovs, list) else []
    if any(isinstance(o, str) and o in {str(a.ip) for a in cfg.overlay_addresses} for o in ovs):
        # this host's own file: every node may mount the same directory
        # (one Kubernetes ConfigMap for the cluster, deploy/kubernetes)
        return None
    _room_for_one_more(cfg, peers, where)
    _dir_duplicates(cfg, peers, seen, doc, where)
    peer = _peer(len(peers), doc, list(cfg.planes), cfg.overlay_addresses, seen, where=f"{where}: peer")
    peer = dataclasses.replace(peer, source=where)
    _peer_conflicts([peer], cfg.udp_port, seen, where=f"{where}: peer")
    if cfg.max_paths_per_peer is not None and len(peer.paths) > cfg.max_paths_per_peer:
        raise ConfigError(f"{where}: {len(peer.paths)} paths, more than limits.max_paths_per_peer "
                          f"= {cfg.max_paths_per_peer}")
    return peer


def _dir_duplicates(cfg: Config, peers: list[Peer], seen: "_Seen", doc: dict, where: str) -> None:
    """A file's peer against those defined before it, naming where the
    other one is (another file, or the config's [[peer]] tables)."""
    def origin(q: Peer) -> str:
        return q.source if q.source != "inline" else f"{cfg.source} ([[peer]] {q.name!r})"
    name, overlay = doc.get("name"), doc.get("overlay")
    if name not in seen.names and not (isinstance(overlay, str) and _maybe_ip(overlay) in seen.overlays):
        return      # the common case, without a walk over thousands of peers
    for q in peers:
        if doc.get("name") == q.name:
            raise ConfigError(f"{where}: name: peer {q.name!r} is already defined in {origin(q)}")
        if isinstance(doc.get("overlay"), str) and doc["overlay"] == str(q.overlay):
            raise ConfigError(f"{where}: overlay: {q.overlay} is already used by peer {q.name!r} (in {origin(q)})")


def peer_toml(fields: dict) -> str:
    """A peer file's text from [[peer]] keys (scalars and the underlay
    table): what `mrcctl peer add` writes."""
    lines, tables = [], []
    for k, v in fields.items():
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            lines.append(f"{k} = {_toml_scalar(v)}")
    for k, t in tables:
        lines.append(f"\n[{k}]")
        lines += [f"{_toml_key(kk)} = {_toml_scalar(vv)}" for kk, vv in t.items()]
    return "\n".join(lines) + "\n"


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else '"' + k.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml_scalar(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def assign_indices(cfg: Config, held: dict[str, int], retired: list[int] = ()) -> Config:
    """The one place peer indices are allocated. A peer the running
    instance knows (`held`: overlay address -> index) keeps its index;
    a new one takes the lowest index nobody holds that was never used
    within the room the maps have for this many peers (Config.room), else
    the one retired longest ago (`retired`, oldest first; the indices of
    running peers that `cfg` no longer has are retired too), and only then
    a never-used one beyond the room: a removed peer's index is not handed
    on while others are free, and replaced peers do not make the maps grow.
    Whoever applies a change clears a retired index's state anyway
    (instance/members.py); this only keeps reuse rare."""
    # sets, not lists: thousands of peers and retired indices
    keep: dict = {}
    taken: set[int] = set()
    for p in cfg.peers:
        i = held.get(str(p.overlay))
        if i is not None and 0 <= i < wire.MRC_PEERS_LIMIT and i not in taken:
            keep[p.overlay] = i
            taken.add(i)
    # peers leaving in this same change retire their indices now
    wanted = {str(p.overlay) for p in cfg.peers}
    leaving = [i for ov, i in held.items() if ov not in wanted]
    quarantined = [i for i in dict.fromkeys(list(retired) + leaving)
                   if i not in taken and 0 <= i < wire.MRC_PEERS_LIMIT]
    out_of_order = taken | set(quarantined)
    # Never-used indices within the room the maps have for this many peers
    # come first, then the retired ones (oldest first: their state was
    # cleared when their peer left, and a new epoch tells its receivers),
    # and only then never-used ones beyond: preferring every never-used
    # index made the indices, and the maps sized by them, creep up with
    # every peer that left and was replaced.
    room = cfg.room()
    fresh = [i for i in range(wire.MRC_PEERS_LIMIT) if i not in out_of_order]
    order = iter([i for i in fresh if i < room] + quarantined + [i for i in fresh if i >= room])
    peers = []
    for p in cfg.peers:
        i = keep.get(p.overlay)
        if i is None:
            i = next(order, None)
            if i is None:
                raise ConfigError(f"peers: no free peer index for {p.name} (at most {wire.MRC_PEERS_LIMIT})")
        peers.append(p if p.index == i else dataclasses.replace(p, index=i))
    return dataclasses.replace(cfg, peers=tuple(peers))


def _limits(lim) -> tuple[int | None, int | None]:
    """[limits]: the room the maps are sized for (Config.sizing)."""
    lim = _typed("limits", lim, dict)
    _check_keys("limits", lim, {"max_peers", "max_paths_per_peer"})
    peers = _int_in("limits.max_peers", lim["max_peers"], 1, wire.MRC_PEERS_LIMIT) \
        if "max_peers" in lim else None
    paths = _int_in("limits.max_paths_per_peer", lim["max_paths_per_peer"], 1, wire.MRC_MAX_PATHS) \
        if "max_paths_per_peer" in lim else None
    return peers, paths


class _Seen:
    """What the peers so far use, by value, so that checking peer N against
    the ones before it is not O(N) (thousands of peers)."""

    def __init__(self):
        self.names: set[str] = set()
        self.overlays: set = set()
        self.underlay: dict[tuple[str, object], str] = {}   # (plane, address) -> peer name

    @classmethod
    def of(cls, peers) -> "_Seen":
        seen = cls()
        for p in peers:
            seen.add(p)
        return seen

    def add(self, p: "Peer") -> None:
        self.names.add(p.name)
        self.overlays.update(p.overlays)
        for dev, addr in p.underlay.items():
            self.underlay[(dev, addr)] = p.name

    def conflicts(self, p: "Peer") -> bool:
        """Whether `p` takes a name or address one of the peers so far has."""
        return p.name in self.names or any(a in self.overlays for a in p.overlays) or \
            any((dev, addr) in self.underlay for dev, addr in p.underlay.items())


def _maybe_ip(s: str):
    try:
        return ipaddress.ip_address(s)
    except ValueError:
        return None


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


def _weights(w, typed: bool) -> Weights:
    """`typed`: some plane has a weight in the config (mode then defaults to fixed)."""
    w = _typed("weights", w, dict)
    _check_keys("weights", w, {"mode", "interval_ms", "min_weight", "ecn_hold_us", "per_ev", "loss"})
    d = Weights()
    mode = _typed("weights.mode", w.get("mode", "fixed" if typed else d.mode), str)
    if mode not in WEIGHT_MODES:
        raise ConfigError(f"weights.mode: {mode!r} is not one of {', '.join(WEIGHT_MODES)}")
    iv = _float_in("weights.interval_ms", w.get("interval_ms", d.interval_ms), 1, 10000)
    mw = _float_in("weights.min_weight", w.get("min_weight", d.min_weight), 0, 0.5)
    hold = _float_in("weights.ecn_hold_us", w.get("ecn_hold_us", d.ecn_hold_us), 0, 1_000_000)
    per_ev = _typed("weights.per_ev", w.get("per_ev", d.per_ev), bool)
    loss = _typed("weights.loss", w.get("loss", d.loss), bool)
    return Weights(mode=mode, interval_ms=iv, min_weight=mw, ecn_hold_us=hold, per_ev=per_ev, loss=loss,
                   mode_set="mode" in w)


def _ev_map(m) -> EvMap:
    m = _typed("ev_map", m, dict)
    _check_keys("ev_map", m, {"mode", "depth", "candidates"})
    d = EvMap()
    mode = _typed("ev_map.mode", m.get("mode", d.mode), str)
    if mode not in EV_MAP_MODES:
        raise ConfigError(f"ev_map.mode: {mode!r} is not one of {', '.join(EV_MAP_MODES)}")
    return EvMap(mode=mode, depth=_int_in("ev_map.depth", m.get("depth", d.depth), 1, 6),
                 candidates=_int_in("ev_map.candidates", m.get("candidates", d.candidates), 1, 8))


# The agent's adaptive step reads every peer's counters each interval (about
# 0.3 ms a peer here): past this many peers the default is fixed weights, and
# `weights.mode = "adaptive"` in the config asks for them anyway.
ADAPTIVE_DEFAULT_MAX_PEERS = 64


def weights_mode(cfg: "Config") -> str:
    """The weights mode in force: the configured one, or the default for
    this config (adaptive, unless a plane has a typed weight or there are
    more than ADAPTIVE_DEFAULT_MAX_PEERS peers)."""
    w = cfg.weights
    if w.mode == "adaptive" and not w.mode_set and len(cfg.peers) > ADAPTIVE_DEFAULT_MAX_PEERS:
        return "fixed"
    return w.mode


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
                              "hedge_after_ms", "probe_budget", "feedback_frames", "probe_sender"})
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
    sender = _typed("health.probe_sender", h.get("probe_sender", d.probe_sender), str)
    if sender not in ("packet", "xdp"):
        raise ConfigError(f"health.probe_sender: must be \"packet\" or \"xdp\", not {sender!r}")
    fb = _typed("health.feedback_frames", h.get("feedback_frames", d.feedback_frames), bool)
    hedge_after = None
    if "hedge_after_ms" in h:
        hedge_after = _typed("health.hedge_after_ms", h["hedge_after_ms"], float)
        if not 0.1 <= hedge_after <= dead:
            raise ConfigError(f"health.hedge_after_ms: {hedge_after:g} is out of range 0.1..{dead:g} "
                              "(health.dead_after_ms)")
    return Health(dead_after_ms=dead, probe_interval_ms=probe, recover_probes=k, hedge=hedge, liveness=live,
                  hedge_after_ms=hedge_after, probe_budget=budget, feedback_frames=fb, probe_sender=sender)


def _addr_list(where: str, value) -> list[str]:
    """A string, or an array of strings (one per family)."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise ConfigError(f"{where}: must be a string or an array of strings, not {value!r}")
    items = value
    if not items:
        raise ConfigError(f"{where}: empty, give one address per family")
    if len(items) > 2:
        raise ConfigError(f"{where}: {len(items)} addresses, at most one IPv4 and one IPv6")
    return [_typed(f"{where}[{k}]", x, str) for k, x in enumerate(items)]


def _one_per_family(where: str, addrs: list) -> None:
    if len({a.version for a in addrs}) != len(addrs):
        raise ConfigError(f"{where}: two IPv{addrs[0].version} addresses, at most one per family")


def _overlay_addresses(value) -> tuple:
    """overlay.address: "172.31.0.1/24", or ["172.31.0.1/24", "fd31::1/64"]."""
    out = []
    for text in _addr_list("overlay.address", value):
        try:
            if "/" not in text:
                raise ValueError
            a = ipaddress.ip_interface(text)
        except ValueError:
            raise ConfigError(f"overlay.address: {text!r} is not an IPv4 or IPv6 address with prefix "
                              "length (e.g. \"172.31.0.1/24\", \"fd31::1/64\")") from None
        if a.ip.is_multicast or a.ip.is_unspecified or a.ip.is_loopback or \
                (a.version == 6 and a.ip.is_link_local):
            raise ConfigError(f"overlay.address: {text!r} cannot be used as a host address")
        out.append(a)
    _one_per_family("overlay.address", out)
    return tuple(out)


def _peer_overlays(where: str, value, ov_addrs, seen: "_Seen") -> tuple:
    """peer[].overlay: "172.31.0.2", or ["172.31.0.2", "fd31::2"]."""
    ours = {a.ip for a in ov_addrs}
    fams = {a.version for a in ov_addrs}
    out = []
    for text in _addr_list(where, value):
        a = _ip(where, text)
        if a.version not in fams:
            raise ConfigError(f"{where}: {a} is IPv{a.version} but overlay.address has no "
                              f"IPv{a.version} address")
        if a.is_multicast or a.is_unspecified or a.is_loopback:
            raise ConfigError(f"{where}: {a} cannot be a peer address")
        if a in ours:
            raise ConfigError(f"{where}: {a} is this host's own overlay address")
        if a in seen.overlays:
            raise ConfigError(f"{where}: {a} is already used by another peer")
        out.append(a)
    _one_per_family(where, out)
    return tuple(out)


def _prefixes(where: str, value) -> tuple:
    """An array of networks ("10.244.3.0/24", "fd00:3::/64"), host bits zero."""
    out = []
    for k, text in enumerate(_typed(where, value, list)):
        text = _typed(f"{where}[{k}]", text, str)
        try:
            net = ipaddress.ip_network(text, strict=True)
        except ValueError as e:
            hint = " (host bits set)" if "host bits" in str(e) else ""
            raise ConfigError(f"{where}: {text!r} is not a network prefix{hint}") from None
        if net.prefixlen == 0 or net.is_multicast or net.is_loopback or \
                (net.version == 6 and net.is_link_local):
            raise ConfigError(f"{where}: {text!r} cannot be routed through the overlay")
        if net in out:
            raise ConfigError(f"{where}: {net} given twice")
        out.append(net)
    return tuple(out)


def _owner_conflicts(ov_addrs, ov_prefixes, peers: list[Peer]) -> None:
    """Every inner address has one owner: the prefixes of two owners (this
    host, each peer) must not overlap, else the longest prefix would quietly
    take traffic meant for the other. Prefixes either nest or are disjoint,
    so one sweep in address order finds every overlap (thousands of peers:
    no pairwise comparison)."""
    local = [("overlay.address", ipaddress.ip_network(a.ip)) for a in ov_addrs] + \
        [("overlay.prefixes", n) for n in ov_prefixes]
    if len(local) > wire.MRC_OVL_PER_PEER:
        raise ConfigError(f"overlay.prefixes: {len(local)} addresses and prefixes, at most "
                          f"{wire.MRC_OVL_PER_PEER}")
    # (version, first address, prefix length, last address, owner peer
    # (None: this host), where, net or address): compared as integers
    # (ipaddress objects for thousands of peers at every change of the
    # peers dir were most of a reload), named only for the error
    entries = [(n.version, int(n.network_address), n.prefixlen, int(n.broadcast_address), None, where, n)
               for where, n in local]
    for p in peers:
        for a in p.overlays:
            entries.append((a.version, int(a), a.max_prefixlen, int(a), p, "overlay", a))
        for n in p.prefixes:
            entries.append((n.version, int(n.network_address), n.prefixlen, int(n.broadcast_address), p,
                            "prefixes", n))
    entries.sort(key=lambda e: e[:3])
    stack: list = []        # the nets enclosing the current one, outermost first
    for e in entries:
        while stack and not (stack[-1][0] == e[0] and e[3] <= stack[-1][3]):
            stack.pop()
        if stack and stack[-1][4] is not e[4]:
            top = stack[-1]
            raise ConfigError(f"{_owned_where(e)}: {ipaddress.ip_network(e[6])} overlaps "
                              f"{ipaddress.ip_network(top[6])} of {_owner_name(top)}")
        stack.append(e)


def _owner_name(e) -> str:
    return "this host (overlay.address / overlay.prefixes)" if e[4] is None else f"peer '{e[4].name}'"


def _owned_where(e) -> str:
    return e[5] if e[4] is None else f"peer[{e[4].index}].{e[5]}"


def _peer_conflicts(peers: list[Peer], udp_port: int, seen: "_Seen", where: str | None = None) -> None:
    """Checks of the newest peer against the others and the instance."""
    new, where = peers[-1], where or f"peer[{len(peers) - 1}]"
    # The receiver knows a sender by (plane, source address): a second peer
    # with the same address on a plane would silently take over the first's.
    for dev, addr in new.underlay.items():
        old = seen.underlay.get((dev, addr))
        if old is not None:
            raise ConfigError(f"{where}.underlay.{dev}: {addr} is already peer '{old}''s "
                              f"address on plane '{dev}'")
    seen.add(new)
    # Probe replies travel from the MRC port to an EV: an EV equal to the
    # MRC port would make replies indistinguishable from data.
    last = new.ev_base + len(new.paths) - 1
    if new.ev_base <= udp_port <= last:
        raise ConfigError(f"{where}.ev_base: EVs {new.ev_base}..{last} include the MRC UDP port {udp_port}")


def _peer(i: int, p: dict, planes: list[Plane], ov_addrs, seen: "_Seen", where: str | None = None) -> Peer:
    where = where or f"peer[{i}]"
    _check_keys(where, p, {"name", "overlay", "evs_per_plane", "ev_base", "spray", "min_active", "underlay",
                           "flowlet_gap_us", "key_file", "prefixes"})
    if "name" not in p:
        raise ConfigError(f"{where}.name: missing")
    name = _typed(f"{where}.name", p["name"], str)
    if not PEER_NAME_RE.match(name):
        raise ConfigError(f"{where}.name: {name!r} is not a valid peer name (letters, digits, _ . -)")
    if name in seen.names:
        raise ConfigError(f"{where}.name: duplicate peer {name!r}")
    if "overlay" not in p:
        raise ConfigError(f"{where}.overlay: missing")
    overlays = _peer_overlays(f"{where}.overlay", p["overlay"], ov_addrs, seen)
    prefixes = _prefixes(f"{where}.prefixes", p.get("prefixes", []))
    for net in prefixes:
        if net.version not in {a.version for a in ov_addrs}:
            raise ConfigError(f"{where}.prefixes: {net} is IPv{net.version} but overlay.address has no "
                              f"IPv{net.version} address (the peer could not reach this host from it)")
    if len(overlays) + len(prefixes) > wire.MRC_OVL_PER_PEER:
        raise ConfigError(f"{where}.prefixes: {len(overlays)} overlay addresses + {len(prefixes)} prefixes, "
                          f"at most {wire.MRC_OVL_PER_PEER} in all")
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
        for ov_addr in ov_addrs:
            if ov_addr.version == addr.version and addr in ov_addr.network:
                raise ConfigError(f"{where}.underlay.{dev}: {addr} lies inside the overlay subnet "
                                  f"{ov_addr.network}")
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
    return Peer(index=i, name=name, overlays=overlays, prefixes=prefixes, evs_per_plane=evs, ev_base=ev_base,
                spray=spray,
                min_active=min_active, underlay=underlay, paths=tuple(paths), flowlet_gap_us=gap,
                key_file=_key_file_name(f"{where}.key_file", p["key_file"]) if "key_file" in p else None)
