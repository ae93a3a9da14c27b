/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * ECN through the tunnel, RFC 6040 "normal mode". Encapsulation copies the
 * inner ECN field to the outer header (tx.bpf.c), so a fabric switch on an
 * EV's path can mark CE instead of dropping; decapsulation merges the outer
 * field back into the inner packet, so the inner TCP sees the mark and
 * reacts, and counts CE per path (the EV that crossed the congestion).
 */
#ifndef MRC_ECN_H
#define MRC_ECN_H

#include <linux/ip.h>
#include <linux/ipv6.h>
#include "csum.h"
#include "parsing.h"

#define IP_ECN_MASK		0x03
#define IPV6_FLOW0_ECN_SHIFT	4	/* ECN: bits 4-5 of flow_lbl[0] */

enum ip_ecn {
	ECN_NOT_ECT	= 0,
	ECN_ECT1	= 1,
	ECN_ECT0	= 2,
	ECN_CE		= 3,
};

/* RFC 6040 section 4.2: the ECN the inner header leaves with, or -1: drop
 * (congestion was marked outside on a packet whose transport cannot hear
 * of it). */
static __always_inline int ecn_decap(__u8 outer_tos, __u8 inner_tos)
{
	__u8 outer = outer_tos & IP_ECN_MASK, inner = inner_tos & IP_ECN_MASK;

	if (outer == ECN_CE)
		return inner == ECN_NOT_ECT ? -1 : ECN_CE;
	if (outer == ECN_ECT1 && inner == ECN_ECT0)
		return ECN_ECT1;
	return inner;
}

/* Write the inner header's ECN field; IPv4 with an incremental checksum
 * update (RFC 1624: HC' = ~(~HC + ~m + m') over the 16-bit word holding
 * the TOS byte). The caller parsed the header (bounds checked). */
static __always_inline void ecn_set(struct l3_desc *d, __u8 ecn)
{
	if (d->family == 4) {
		struct iphdr *iph = d->ip4;
		__u16 *word = (__u16 *)iph;	/* version, IHL, TOS */
		__u16 old = *word;

		iph->tos = (iph->tos & ~IP_ECN_MASK) | ecn;
		iph->check = csum_fold((__u16)~iph->check + (__u16)~old + *word);
	} else {
		struct ipv6hdr *ip6h = d->ip6;

		ip6h->flow_lbl[0] = (ip6h->flow_lbl[0] &
				     ~(IP_ECN_MASK << IPV6_FLOW0_ECN_SHIFT)) |
				    ecn << IPV6_FLOW0_ECN_SHIFT;
	}
	d->tos = (d->tos & ~IP_ECN_MASK) | ecn;
}

#endif /* MRC_ECN_H */
