/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Receive-side validation: is a frame on a plane an MRC frame, from whom,
 * and is it well formed. The policy, top to bottom (docs/hostile-input.md;
 * tests/unit/rxmodel.py models it independently):
 *
 * What counts as an MRC frame:
 *  - outer IPv4 or IPv6, UDP, destination port cfg.udp_port;
 *  - or UDP *source* port cfg.udp_port from a configured peer on this
 *    plane, carrying a version-1 PROBE_REPLY: replies swap the probe's
 *    ports, so they come back to the probe's EV. Anything else with that
 *    source port is someone else's traffic and passes untouched.
 * A priority tag (802.1Q, VID 0) is walked: the kernel treats the frame as
 * untagged. Not ours, passed untouched: VLAN-tagged frames (a VID, 802.1ad:
 * they belong to a VLAN device; counted as MRC_R_RX_PASS_VLAN), non-IP, non-UDP, outer frames cut short before the
 * UDP ports (the stack drops them as malformed), non-first UDP fragments
 * (no UDP header to tell; counted as MRC_R_RX_PASS_FRAGMENT; the first
 * fragment is dropped below, so the datagram never reassembles), and
 * IPv6 with extension headers other than a fragment header (mrc never
 * sends them; we do not walk them).
 * ICMP (IPv4) and ICMPv6 that are not fragments are handed to pmtu.h
 * (RX_ICMP): a "too big" for one of our own frames is path MTU news.
 *
 * Hook-neutral: it reads the frame only, so a tc-ingress receive hook can
 * share it with XDP.
 */
#ifndef MRC_VALIDATE_H
#define MRC_VALIDATE_H

#include <stdbool.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "mrc.h"
#include "parsing.h"
#include "peer.h"
#include "encap.h"

/*
 * A receive verdict: what to do with the frame and which enum mrc_reason
 * to count, one value so that one exit (rx_exit) records every verdict.
 */
enum rx_action {
	RX_PASS		= 1,	/* to the stack untouched */
	RX_DROP		= 2,
	RX_TURN_AROUND	= 3,	/* a probe: send it back (encap_turn_around) */
	RX_DELIVER	= 4,	/* decapsulate, then to the stack */
	RX_CONTINUE	= 5,	/* validation passed: keep going */
	RX_ICMP		= 6,	/* an ICMP error: may concern our paths (pmtu.h) */
};
#define RX_NOT_COUNTED		MRC_R_MAX
#define RX_V(action, reason)	((__u32)(action) << 8 | (reason))
#define RX_ACTION(v)		((v) >> 8)
#define RX_REASON(v)		((v) & 0xff)
#define RX_PASS_UNCOUNTED	RX_V(RX_PASS, RX_NOT_COUNTED)
#define RX_CONTINUE_V		RX_V(RX_CONTINUE, RX_NOT_COUNTED)

/*
 * The path id and the inner addresses (after validation, in rx.bpf.c):
 *  - a DATA or PROBE_REPLY path id must name a path of the plane the frame
 *    arrived on (rx_path_on_plane), else MRC_R_RX_WRONG_PLANE;
 *  - a DATA inner packet's source must be owned by the sending peer and its
 *    destination by this host (rx_inner_bound, mrc_ovl_owner), else
 *    MRC_R_RX_INNER_SRC / MRC_R_RX_INNER_DST: a peer may inject only its own
 *    traffic, and only toward us.
 */
static __always_inline __u32 rx_inner_bound(const struct l3_flow *fl, __u32 peer_idx)
{
	if (ovl_owner(fl, false) != peer_idx)
		return RX_V(RX_DROP, MRC_R_RX_INNER_SRC);
	if (ovl_owner(fl, true) != MRC_OWNER_LOCAL)
		return RX_V(RX_DROP, MRC_R_RX_INNER_DST);
	return RX_CONTINUE_V;
}

/* A frame matched by the source port only is someone else's unless it
 * proves to be a probe reply: it passes where ours would be dropped. */
static __always_inline __u32 rx_refuse(bool reply_only, __u32 reason)
{
	return reply_only ? RX_PASS_UNCOUNTED : RX_V(RX_DROP, reason);
}

/*
 * Outer headers up to the MRC header (linear: data..data_end; len is the
 * whole frame, which at tc ingress and in an XDP multi-buffer frame may go
 * on beyond data_end): fills f (eth, l3, udp, mh), the
 * sending peer, its entry and the plane the frame arrived on (its index in
 * this host's config). Returns RX_CONTINUE_V for a well-formed MRC frame
 * from a configured peer, else the final verdict. *type is the MRC packet
 * type.
 */
static __always_inline __u32 rx_validate(void *data, void *data_end,
					 __u32 len, __u32 ifindex, __u16 udp_port,
					 struct mrc_frame *f, __u32 *peer_idx,
					 struct mrc_peer **peerp, __u32 *plane,
					 __u32 *type)
{
	struct hdr_cursor nh = { .pos = data };
	struct mrc_rx_key key = {};
	struct mrc_peer *peer;
	struct udphdr *udp;
	struct mrc_hdr *mh;
	bool reply_only = false;	/* matched by source port only */
	bool l3_ok;
	__be16 port = bpf_htons(udp_port);
	__u32 l3_len, ip_len;
	int proto, pidx;

	/* 1. Outer IP and UDP: is it ours? */
	proto = parse_l2(&nh, data_end, &f->eth, L2_F_PRIO_TAG);
	f->l2_len = nh.pos - data;
	if (proto != bpf_htons(ETH_P_IP) && proto != bpf_htons(ETH_P_IPV6)) {
		/* Counted because a tagged MRC frame is a misconfiguration an
		 * operator wants to see, not silence. */
		if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD))
			return RX_V(RX_PASS, MRC_R_RX_PASS_VLAN);
		return RX_PASS_UNCOUNTED;
	}
	l3_ok = parse_l3(&nh, data_end, proto, L3_F_IPV4 | L3_F_IPV6 | L3_F_V6_FRAG,
			 &f->l3) == L3_OK;
	if (!l3_ok ||
	    f->l3.proto != IPPROTO_UDP) {
		/* A router's "too big" for one of our frames (pmtu.h). */
		if (l3_ok && f->l3.frag == L3_FRAG_NONE &&
		    f->l3.proto == (f->l3.family == 4 ? IPPROTO_ICMP : IPPROTO_ICMPV6))
			return RX_V(RX_ICMP, RX_NOT_COUNTED);
		return RX_PASS_UNCOUNTED;
	}
	/* Non-first fragment: no UDP header to look at. */
	if (f->l3.frag == L3_FRAG_LATER)
		return RX_V(RX_PASS, MRC_R_RX_PASS_FRAGMENT);
	if (parse_udphdr(&nh, data_end, &udp) < 0)
		return RX_PASS_UNCOUNTED;
	if (udp->dest != port) {
		if (udp->source != port)
			return RX_PASS_UNCOUNTED;
		reply_only = true;
	}
	if (l3_has_options(&f->l3))
		return rx_refuse(reply_only, MRC_R_RX_IP_OPTIONS);
	/* A first fragment to the MRC port is ours and malformed. */
	if (f->l3.frag == L3_FRAG_FIRST)
		return rx_refuse(reply_only, MRC_R_RX_FRAGMENT);
	f->udp = udp;

	/* 2. Source check: this address may send MRC on this plane only. */
	key.ifindex = ifindex;
	if (f->l3.family == 4) {
		key.family = 4;
		key.addr[0] = f->l3.ip4->saddr;
	} else {
		key.family = 6;
		__builtin_memcpy(key.addr, &f->l3.ip6->saddr, 16);
	}
	pidx = peer_by_source(&key, plane);
	if (pidx < 0)
		return rx_refuse(reply_only, MRC_R_RX_UNKNOWN_PEER);
	peer = peer_get(pidx);
	if (!peer)
		return rx_refuse(reply_only, MRC_R_RX_UNKNOWN_PEER);

	/* Headers present, and the IP and UDP lengths claim no more than
	 * the frame holds (frames may carry Ethernet padding beyond them). */
	mh = (void *)(udp + 1);
	l3_len = f->l3.hdr_len;
	ip_len = f->l3.len;
	if ((void *)(mh + 1) > data_end ||
	    ip_len < l3_len + sizeof(*udp) + sizeof(*mh) ||
	    len < f->l2_len + ip_len ||
	    bpf_ntohs(udp->len) < sizeof(*udp) + sizeof(*mh) ||
	    bpf_ntohs(udp->len) > ip_len - l3_len)
		return rx_refuse(reply_only, MRC_R_RX_TRUNCATED);

	if ((mh->ver_type >> MRCH_VERSION_SHIFT) != MRC_VERSION)
		return rx_refuse(reply_only, MRC_R_RX_BAD_VERSION);
	*type = mh->ver_type & MRCH_TYPE_MASK;
	if (reply_only && *type != MRC_T_PROBE_REPLY)
		return RX_PASS_UNCOUNTED;
	f->mh = mh;
	*peer_idx = pidx;
	*peerp = peer;
	return RX_CONTINUE_V;
}

#endif /* MRC_VALIDATE_H */
