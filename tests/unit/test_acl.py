"""The underlay access list ([[plane]] allow_underlay, issue #13.10,
bpf/acl.h) on the real mrc_rx: which non-MRC frames a plane lets reach the
stack. The rules go in through the config parser and AclEntry.rule(), as
`up` writes them, so the syntax is tested end to end."""

from __future__ import annotations

import unit_pkt as pkt
from unit_dp import LO_IFINDEX, OUR_MAC, PEER_MAC, XDP_DROP, XDP_PASS, drops_delta
from unit_pkt import inner_ip, mrc_frame
from mrcctl.datapath import abi as wire
from mrcctl.instance import config as cfgmod

R = wire.Reason
ME4, ME6 = "192.0.2.1", "fd00:1::1"


def acl_of(entries: list[str]) -> bytes:
    rules = cfgmod._allow_underlay("plane[0].allow_underlay", entries)
    return wire.Acl.of([e.rule() for e in rules]).pack()


def v4(src: str, proto: int, l4: bytes, **kw) -> bytes:
    return pkt.eth(OUR_MAC, PEER_MAC, pkt.ETH_P_IP) + pkt.ipv4(src, ME4, proto, l4, **kw)


def v6(src: str, nh: int, l4: bytes) -> bytes:
    return pkt.eth(OUR_MAC, PEER_MAC, pkt.ETH_P_IPV6) + pkt.ipv6(src, ME6, nh, l4)


ICMP_ECHO = b"\x08\x00\x00\x00" + bytes(60)
ARP = pkt.eth("ff:ff:ff:ff:ff:ff", PEER_MAC, pkt.ETH_P_ARP) + bytes(28)
ND_NS = v6("fd00:1::2", pkt.IPPROTO_ICMPV6, b"\x87\x00\x00\x00" + bytes(20))
ND_NS_DAD = v6("::", pkt.IPPROTO_ICMPV6, b"\x87\x00\x00\x00" + bytes(20))
ICMP6_ECHO = v6("fd00:1::2", pkt.IPPROTO_ICMPV6, b"\x80\x00\x00\x00" + bytes(20))
SSH = v4("203.0.113.9", pkt.IPPROTO_TCP, pkt.tcp(40000, 22, 1))
SSH_LATER_FRAG = v4("203.0.113.9", pkt.IPPROTO_TCP, bytes(40), df=False, frag_off=20)
HTTP = v4("203.0.113.9", pkt.IPPROTO_TCP, pkt.tcp(40000, 80, 1))
DNS = v4("203.0.113.9", pkt.IPPROTO_UDP, pkt.udp(40000, 53, b"q" * 20))
PING_MGMT = v4("198.51.100.7", 1, ICMP_ECHO)
PING_OTHER = v4("203.0.113.9", 1, ICMP_ECHO)
BGP6 = v6("fd00:9::5", pkt.IPPROTO_TCP, pkt.tcp(40000, 179, 1))
BGP6_OUTSIDE = v6("fd00:8::5", pkt.IPPROTO_TCP, pkt.tcp(40000, 179, 1))
SYSLOG_RANGE = v4("203.0.113.9", pkt.IPPROTO_UDP, pkt.udp(40000, 5141, b"x" * 8))
VLAN = pkt.vlan(OUR_MAC, PEER_MAC, 7, pkt.ETH_P_IP) + pkt.ipv4("203.0.113.9", ME4, 1, ICMP_ECHO)
LLDP = pkt.eth("01:80:c2:00:00:0e", PEER_MAC, 0x88CC) + bytes(46)
NOT_OURS_UDP = v4("192.0.2.2", pkt.IPPROTO_UDP, pkt.udp(49152, 4795, b"m" * 40))

RULES = ["198.51.100.0/24", "tcp/22", "fd00:9::/32 tcp/179", "udp/5140-5149"]

# description, frame, passes with RULES?
CASES = [
    ("ARP always passes: the plane's addresses keep resolving", ARP, True),
    ("IPv6 neighbour solicitation always passes", ND_NS, True),
    ("... also duplicate address detection from ::", ND_NS_DAD, True),
    ("ping from an allowed prefix", PING_MGMT, True),
    ("ping from elsewhere: refused", PING_OTHER, False),
    ("ICMPv6 echo: refused (only ND is implicit)", ICMP6_ECHO, False),
    ("tcp/22 from anywhere", SSH, True),
    ("a later fragment has no port: a port rule does not take it", SSH_LATER_FRAG, False),
    ("tcp/80: refused", HTTP, False),
    ("udp/53: refused", DNS, False),
    ("IPv6 prefix + tcp/179", BGP6, True),
    ("tcp/179 from outside the IPv6 prefix: refused", BGP6_OUTSIDE, False),
    ("udp port range", SYSLOG_RANGE, True),
    ("VLAN-tagged: refused (not ARP or IP)", VLAN, False),
    ("LLDP: refused", LLDP, False),
    ("UDP from a peer to another port: refused", NOT_OURS_UDP, False),
]


def test_allow_underlay(dp):
    # without a list everything passes, as before the list existed
    for desc, frame, _allowed in CASES:
        ret, out = dp.run_rx(frame)
        assert ret == XDP_PASS and out == frame, f"no list: {desc}"

    dp.maps["mrc_acl"].update(wire.u32(LO_IFINDEX), acl_of(RULES))
    for desc, frame, allowed in CASES:
        before = dp.drops()
        ret, out = dp.run_rx(frame)
        delta = drops_delta(before, dp.drops())
        if allowed:
            assert ret == XDP_PASS and out == frame, desc
            assert R.RX_UNDERLAY_REFUSED not in delta, desc
        else:
            assert ret == XDP_DROP, desc
            assert delta == {R.RX_UNDERLAY_REFUSED: 1}, desc

    # MRC traffic is judged by mrc, never by the list
    inner = inner_ip(80)
    ret, out = dp.run_rx(mrc_frame(inner=inner, psn=1))
    assert ret == XDP_PASS and out[14:] == inner
    ret, _ = dp.run_rx(mrc_frame(6, inner=inner, psn=2))
    assert ret == XDP_PASS

    # an empty list passes only MRC, ARP and ND
    dp.maps["mrc_acl"].update(wire.u32(LO_IFINDEX), acl_of([]))
    for desc, frame, _allowed in CASES:
        ret, _ = dp.run_rx(frame)
        implicit = frame in (ARP, ND_NS, ND_NS_DAD)
        assert ret == (XDP_PASS if implicit else XDP_DROP), f"empty list: {desc}"
    ret, _ = dp.run_rx(mrc_frame(inner=inner, psn=3))
    assert ret == XDP_PASS


def test_allow_underlay_syntax():
    """What the config accepts, how status shows it back (from the rules
    the datapath holds), and what it refuses with a message naming the key."""
    ok = {
        "10.0.0.0/8": "10.0.0.0/8",
        "192.0.2.7": "192.0.2.7/32",
        "icmp": "icmp",
        "TCP/22": "tcp/22",
        "udp/4000-4100": "udp/4000-4100",
        "fd00::/64 icmpv6": "fd00::/64 icmpv6",
        "proto/89": "ospf",
        "proto/200": "proto/200",
        "tcp 10.1.0.0/16": "10.1.0.0/16 tcp",
    }
    for text, shown in ok.items():
        (e,) = cfgmod._allow_underlay("x", [text])
        assert e.text == shown, text
        assert cfgmod.acl_rule_text(wire.AclRule.unpack(e.rule().pack())) == shown, text
    bad = {
        "": "empty entry",
        "icmp/5": "ports only with tcp or udp",
        "tcp/0": "1..65535",
        "tcp/9-8": "1..65535",
        "fd00::/64 icmp": "is IPv6",
        "10.0.0.0/8 10.1.0.0/16": "two prefixes",
        "tcp udp": "two protocols",
        "http": "not a prefix",
        "10.0.0.300/8": "not an address",
    }
    for text, msg in bad.items():
        try:
            cfgmod._allow_underlay("plane[0].allow_underlay", [text])
        except cfgmod.ConfigError as e:
            assert msg in str(e) and "plane[0].allow_underlay[0]" in str(e), (text, str(e))
        else:
            raise AssertionError(f"{text!r} accepted")
    try:
        cfgmod._allow_underlay("p", ["tcp/22"] * (wire.MRC_ACL_RULES + 1))
    except cfgmod.ConfigError as e:
        assert "at most 16" in str(e)
    else:
        raise AssertionError("17 entries accepted")
