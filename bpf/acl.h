/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The underlay access list of a plane ([[plane]] allow_underlay): mrc_rx
 * runs before netfilter, so whatever it passes reaches the stack unfiltered
 * by XDP. A plane with an mrc_acl entry passes a frame that is not mrc's
 * only if it is ARP, IPv6 neighbour discovery (the plane's own addresses
 * must keep resolving) or matches one of the entry's rules: source prefix,
 * L4 protocol, destination port range, each optional. Everything else is
 * dropped under MRC_R_RX_UNDERLAY_REFUSED. MRC frames never get here:
 * rx_validate judges them first.
 *
 * Hook-neutral (reads the frame only), like validate.h.
 */
#ifndef MRC_ACL_H
#define MRC_ACL_H

#include <stdbool.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "mrc.h"
#include "parsing.h"
#include "validate.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MRC_MAX_PLANES);
	__type(key, __u32);		/* plane ifindex */
	__type(value, struct mrc_acl);
} mrc_acl SEC(".maps");

#define ACL_ICMPV6		58
#define ACL_ND_FIRST		133	/* router solicitation .. */
#define ACL_ND_LAST		137	/* .. redirect */

/* What the rules judge of a frame: scalars, so the rule loop needs no
 * packet pointer. dport < 0: no port to judge. */
struct acl_flow {
	__be32	src[4];		/* IPv4: src[0], the rest 0 */
	__s32	dport;
	__u8	family;
	__u8	proto;
	__u8	rsvd[2];
};

static __always_inline bool acl_rule_match(const struct mrc_acl_rule *r,
					   const struct acl_flow *k)
{
	if (r->family && r->family != k->family)
		return false;
	if (r->proto && r->proto != k->proto)
		return false;
	if (r->port_hi && (k->dport < r->port_lo || k->dport > r->port_hi))
		return false;	/* also: no port to judge (dport < 0) */
	if ((k->src[0] & r->mask[0]) != r->addr[0])
		return false;
	/* IPv4: src[1..3] are 0, and so are a v4 or any-family rule's */
	return (k->src[1] & r->mask[1]) == r->addr[1] &&
	       (k->src[2] & r->mask[2]) == r->addr[2] &&
	       (k->src[3] & r->mask[3]) == r->addr[3];
}

/* 1 if one of the plane's rules lets the frame pass. A global function:
 * the verifier walks the 16 rules once, not once per state of the parsing
 * before it. */
__attribute__((noinline)) int acl_match(const struct mrc_acl *acl, const struct acl_flow *k)
{
	__u32 i, n;

	if (!acl || !k)
		return 0;
	n = acl->n;
	for (i = 0; i < MRC_ACL_RULES; i++) {
		if (i >= n)
			break;
		if (acl_rule_match(&acl->rule[i], k))
			return 1;
	}
	return 0;
}

/*
 * A frame rx_validate passed as not mrc's (verdict v, action RX_PASS):
 * v again if the plane lets it reach the stack, else the refusal.
 */
static __always_inline __u32 acl_underlay(void *data, void *data_end,
					  __u32 ifindex, __u32 v)
{
	struct hdr_cursor nh = { .pos = data };
	struct acl_flow k = { .dport = -1 };
	const struct mrc_acl *acl;
	struct ethhdr *eth;
	struct l3_desc d;
	int proto;

	acl = bpf_map_lookup_elem(&mrc_acl, &ifindex);
	if (!acl)
		return v;
	proto = parse_ethhdr(&nh, data_end, &eth);
	if (proto == bpf_htons(ETH_P_ARP))
		return v;
	if (parse_l3(&nh, data_end, proto, L3_F_IPV4 | L3_F_IPV6 | L3_F_V6_FRAG,
		     &d) != L3_OK)
		goto refuse;
	k.family = d.family;
	k.proto = d.proto;
	if (d.family == 4) {
		k.src[0] = d.ip4->saddr;
	} else {
		__builtin_memcpy(k.src, &d.ip6->saddr, 16);
		if (d.proto == ACL_ICMPV6 && d.frag == L3_FRAG_NONE) {
			__u8 *type = d.l4;

			if ((void *)(type + 1) <= data_end &&
			    *type >= ACL_ND_FIRST && *type <= ACL_ND_LAST)
				return v;
		}
	}
	/* A later fragment has no ports: only rules without ports take it. */
	if ((d.proto == IPPROTO_TCP || d.proto == IPPROTO_UDP) &&
	    d.frag != L3_FRAG_LATER) {
		__be16 *ports = d.l4;

		if ((void *)(ports + 2) <= data_end)
			k.dport = bpf_ntohs(ports[1]);
	}
	if (acl_match(acl, &k))
		return v;
refuse:
	return RX_V(RX_DROP, MRC_R_RX_UNDERLAY_REFUSED);
}

#endif /* MRC_ACL_H */
