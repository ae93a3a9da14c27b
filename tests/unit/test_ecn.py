"""ECN through the tunnel, RFC 6040 normal mode (bpf/ecn.h), through BPF_PROG_TEST_RUN.

Encapsulation copies the inner ECN field to the outer header; decapsulation
merges the outer field into the inner packet (CE reaches the inner TCP),
drops CE on a not-ECT inner packet and counts CE per path.
"""

from __future__ import annotations

import struct

import pytest

import unit_pkt as pkt
from unit_dp import PATHS, PEER, TC_ACT_REDIRECT, XDP_DROP, XDP_PASS, drops_delta
from mrcctl.datapath import abi as wire

# every test here runs against mrc_rx (XDP) and mrc_rx_tc (tc ingress)
pytestmark = pytest.mark.usefixtures("rx_hook")

NOT_ECT, ECT1, ECT0, CE = 0, 1, 2, 3
DSCP = 0xB8   # DSCP 46 in the TOS byte: must survive every rewrite

# description, outer ECN, inner ECN, delivered inner ECN (None: dropped)
DECAP = [
    ("not-ECT both: untouched", NOT_ECT, NOT_ECT, NOT_ECT),
    ("ECT(0) outside, not-ECT inside: inner kept", ECT0, NOT_ECT, NOT_ECT),
    ("ECT(1) outside, not-ECT inside: inner kept", ECT1, NOT_ECT, NOT_ECT),
    ("CE outside, not-ECT inside: dropped", CE, NOT_ECT, None),
    ("ECT(0) both: untouched", ECT0, ECT0, ECT0),
    ("ECT(1) outside, ECT(0) inside: ECT(1)", ECT1, ECT0, ECT1),
    ("ECT(0) outside, ECT(1) inside: inner kept", ECT0, ECT1, ECT1),
    ("CE outside, ECT(0) inside: CE", CE, ECT0, CE),
    ("CE outside, ECT(1) inside: CE", CE, ECT1, CE),
    ("CE outside, CE inside: CE", CE, CE, CE),
    ("ECT(0) outside, CE inside: CE kept", ECT0, CE, CE),
    ("not-ECT outside, ECT(1) inside: inner kept", NOT_ECT, ECT1, ECT1),
]


def _inner(ecn: int) -> bytes:
    body = pkt.udp(5201, 40000, bytes(range(200)))
    return pkt.ipv4(pkt.PEER_OVERLAY, pkt.LOCAL_OVERLAY, pkt.IPPROTO_UDP, body, ident=77, tos=DSCP | ecn)


@pytest.mark.parametrize("family", [4, 6], ids=["outer-ipv4", "outer-ipv6"])
def test_decap_merges_outer_ecn(dp, family):
    path = 0 if family == 4 else 1
    for desc, outer, inner, out_ecn in DECAP:   # one datapath for the table: loading is the slow part
        ip_kw = {"tos": DSCP | outer} if family == 4 else {"tc": DSCP | outer}
        frame = pkt.mrc_frame(family, inner=_inner(inner), path_id=path, psn=5, ip_kw=ip_kw)
        ce_before = dp.stats(path).rx_ce
        before = dp.drops()
        ret, out = dp.run_rx(frame)
        assert dp.stats(path).rx_ce - ce_before == (1 if outer == CE else 0), desc
        if out_ecn is None:
            assert ret == XDP_DROP, desc
            assert drops_delta(before, dp.drops()) == {wire.Reason.RX_ECN_NOT_ECT: 1}, desc
            continue
        assert ret == XDP_PASS, desc
        got = out[14:]
        assert got == _inner(out_ecn), desc      # TOS byte and header checksum as if built so
        assert got[1] == DSCP | out_ecn, desc
        assert wire.inet_csum(got[:20]) == 0, f"{desc}: inner IPv4 checksum must verify"


@pytest.mark.parametrize("path", [0, 1], ids=["outer-ipv4", "outer-ipv6"])
def test_encap_copies_inner_ecn_to_the_outer_header(dp, path):
    dp.set_slots([path])
    # a loopback (see test_rx.test_tx_then_rx_restores_inner): what we send
    # comes back as from the peer
    dp.set_owner(pkt.LOCAL_OVERLAY, PEER)
    dp.set_owner(pkt.PEER_OVERLAY, wire.MRC_OWNER_LOCAL)
    for ecn in (NOT_ECT, ECT1, ECT0, CE):
        inner = pkt.overlay(pkt.udp(40000, 5201, b"q" * 64), tos=DSCP | ecn)
        ret, out = dp.run_tx(inner)
        assert ret == TC_ACT_REDIRECT
        if PATHS[path].family == 4:
            tos = out[15]
        else:
            tos = (struct.unpack("!I", out[14:18])[0] >> 20) & 0xFF
        assert tos == DSCP | ecn, ecn
        # and through the receiver again the inner packet is unchanged
        ret, back = dp.run_rx(out)
        assert ret == XDP_PASS and back[14:] == inner[14:], ecn
