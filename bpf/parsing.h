/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Header parsing, one parser for both programs (xdp-tools parsing_helpers.h
 * style): a cursor walks the packet, each parse_* checks that the header
 * lies before data_end (the verifier insists, and so does a hostile sender)
 * and advances the cursor.
 *
 * parse_l3() fills a family-neutral descriptor (struct l3_desc) for the outer
 * header mrc_rx receives and for the inner packet both programs carry. What a
 * caller accepts is policy, passed as L3_F_* flags, not a second parser:
 *   mrc_rx outer  L3_F_IPV4 | L3_F_IPV6 | L3_F_V6_FRAG, after parse_l2(L2_F_PRIO_TAG)
 *   mrc_tx inner  L3_F_IPV4 | L3_F_IPV6 | L3_F_WHOLE
 *   mrc_rx inner  L3_F_IPV4 | L3_F_IPV6, the family from the version nibble
 *                 (l3_inner_proto)
 * Inner IPv6 extension headers (a fragment header included) are not
 * walked, on either side: their next header is the L4 protocol, which then
 * reads as "not TCP / UDP", the same for the sender and the receiver.
 */
#ifndef MRC_PARSING_H
#define MRC_PARSING_H

#include <stdbool.h>
#include <linux/types.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* IPv4 frag_off, host order (compare against bpf_htons() of these) */
#define IPV4_DF			0x4000
#define IPV4_MF			0x2000
#define IPV4_OFFSET_MASK	0x1fff
#define IPV4_FRAG_MASK		(IPV4_MF | IPV4_OFFSET_MASK)	/* any fragment */
#define IPV4_MIN_IHL		5
/* IPv6 fragment header */
#define IPV6_NEXTHDR_FRAGMENT	44
#define IPV6_FRAG_OFFSET_MASK	0xfff8
#define IPV6_FLOWLABEL_MASK	0xfffff
/* The traffic class byte: DSCP in the high 6 bits, ECN in the low 2. */
#define IP_DSCP_MASK		0xfc
#define IP_TCLASS_LO_MASK	0x0f	/* low nibble of the IPv6 traffic class */

struct hdr_cursor {
	void *pos;
};

struct ip6_frag {
	__u8	nexthdr;
	__u8	reserved;
	__be16	frag_off;
	__be32	identification;
};

/* Returns the ethertype in network order, or -1 when cut short. VLAN tags
 * are not walked (parse_l2 walks a priority tag). */
static __always_inline int parse_ethhdr(struct hdr_cursor *nh, void *data_end,
					struct ethhdr **ethhdr)
{
	struct ethhdr *eth = nh->pos;

	if ((void *)(eth + 1) > data_end)
		return -1;
	nh->pos = eth + 1;
	*ethhdr = eth;
	return eth->h_proto;
}

/* Policy for parse_l2(). */
#define L2_F_PRIO_TAG	0x01	/* walk one 802.1Q tag with VID 0 */

#define VLAN_VID_MASK	0x0fff

struct vlan_tag {
	__be16	tci;
	__be16	proto;
};

/*
 * Ethernet, and with L2_F_PRIO_TAG an 802.1Q priority tag (VID 0, only the
 * PCP set: switches and NICs add them for 802.1p). The kernel treats such
 * a frame as untagged on the device itself, so it is the plane's traffic
 * and mrc's if it is MRC. Any other tag (a VID, 802.1ad, a second tag)
 * is returned as the ethertype: it belongs to a VLAN device.
 */
static __always_inline int parse_l2(struct hdr_cursor *nh, void *data_end,
				    struct ethhdr **ethhdr, __u32 flags)
{
	int proto = parse_ethhdr(nh, data_end, ethhdr);
	struct vlan_tag *vt = nh->pos;

	if ((flags & L2_F_PRIO_TAG) && proto == bpf_htons(ETH_P_8021Q) &&
	    (void *)(vt + 1) <= data_end && !(vt->tci & bpf_htons(VLAN_VID_MASK))) {
		nh->pos = vt + 1;
		return vt->proto;
	}
	return proto;
}

/* Policy for parse_l3(). */
#define L3_F_IPV4	0x01	/* accept IPv4 */
#define L3_F_IPV6	0x02	/* accept IPv6 */
#define L3_F_V6_FRAG	0x04	/* walk an IPv6 fragment header to the L4 protocol */
#define L3_F_WHOLE	0x08	/* IPv4 options must lie in the frame too (else
				 * the fixed header is enough: mrc_rx looks at
				 * the L4 header through its own bounds check,
				 * and counts a cut non-first fragment as one) */

enum l3_status {
	L3_OK		= 0,
	L3_SHORT	= -1,	/* header cut short */
	L3_BAD		= -2,	/* version nibble or IHL wrong */
	L3_UNSUPPORTED	= -3,	/* not IP, or a family the flags exclude */
};

enum l3_frag {
	L3_FRAG_NONE	= 0,
	L3_FRAG_FIRST	= 1,	/* offset 0, more to come: holds the L4 header */
	L3_FRAG_LATER	= 2,	/* no L4 header to look at */
};

struct l3_desc {
	union {
		void		*hdr;
		struct iphdr	*ip4;
		struct ipv6hdr	*ip6;
	};
	void	*l4;		/* first byte after L3 (and the fragment header) */
	__u32	len;		/* bytes the header claims: L3 header + payload */
	__u16	hdr_len;	/* L3 header: IPv4 with options, IPv6 + fragment header */
	__u8	family;		/* 4 or 6 */
	__u8	proto;		/* L4 protocol (after an IPv6 fragment header) */
	__u8	frag;		/* enum l3_frag */
	__u8	tos;		/* traffic class: DSCP << 2 | ECN */
};

static __always_inline int parse_l3(struct hdr_cursor *nh, void *data_end,
				    int eth_proto, __u32 flags, struct l3_desc *d)
{
	if ((flags & L3_F_IPV4) && eth_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *iph = nh->pos;

		if ((void *)(iph + 1) > data_end)
			return L3_SHORT;
		/* ihl < 5 is malformed; also keeps the cursor moving forward */
		if (iph->version != 4 || iph->ihl < IPV4_MIN_IHL)
			return L3_BAD;
		d->ip4 = iph;
		d->family = 4;
		d->proto = iph->protocol;
		d->tos = iph->tos;
		d->hdr_len = iph->ihl * 4;
		d->len = bpf_ntohs(iph->tot_len);
		if (iph->frag_off & bpf_htons(IPV4_OFFSET_MASK))
			d->frag = L3_FRAG_LATER;
		else if (iph->frag_off & bpf_htons(IPV4_MF))
			d->frag = L3_FRAG_FIRST;
		else
			d->frag = L3_FRAG_NONE;
		d->l4 = (void *)iph + d->hdr_len;
		if ((flags & L3_F_WHOLE) && d->l4 > data_end)
			return L3_SHORT;
		nh->pos = d->l4;
		return L3_OK;
	}
	if ((flags & L3_F_IPV6) && eth_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6h = nh->pos;

		if ((void *)(ip6h + 1) > data_end)
			return L3_SHORT;
		if (ip6h->version != 6)
			return L3_BAD;
		d->ip6 = ip6h;
		d->family = 6;
		d->proto = ip6h->nexthdr;
		d->tos = ip6h->priority << 4 | ip6h->flow_lbl[0] >> 4;
		d->hdr_len = sizeof(*ip6h);
		d->len = sizeof(*ip6h) + bpf_ntohs(ip6h->payload_len);
		d->frag = L3_FRAG_NONE;
		d->l4 = ip6h + 1;
		/* Other extension headers are not walked: mrc never sends
		 * them, so their L4 protocol reads as "not UDP". */
		if ((flags & L3_F_V6_FRAG) &&
		    ip6h->nexthdr == IPV6_NEXTHDR_FRAGMENT) {
			struct ip6_frag *fh = (void *)(ip6h + 1);

			if ((void *)(fh + 1) > data_end)
				return L3_SHORT;
			d->proto = fh->nexthdr;
			d->frag = fh->frag_off & bpf_htons(IPV6_FRAG_OFFSET_MASK) ?
					  L3_FRAG_LATER : L3_FRAG_FIRST;
			d->hdr_len += sizeof(*fh);
			d->l4 = fh + 1;
		}
		nh->pos = d->l4;
		return L3_OK;
	}
	return L3_UNSUPPORTED;
}

/* IPv4 options are someone else's business on the outer header: mrc sends
 * none. (The IPv6 fragment header is a fragment, not an option.) */
static __always_inline bool l3_has_options(const struct l3_desc *d)
{
	return d->family == 4 && d->hdr_len != sizeof(struct iphdr);
}

static __always_inline __u16 l3_ethertype(const struct l3_desc *d)
{
	return d->family == 4 ? ETH_P_IP : ETH_P_IPV6;
}

/* The ethertype of the IP packet at p by its version nibble (network
 * order); 0 if p lies beyond data_end. For a packet behind a header that
 * names no ethertype (the MRC header). */
static __always_inline int l3_inner_proto(void *p, void *data_end)
{
	__u8 *v = p;

	if ((void *)(v + 1) > data_end)
		return 0;
	return (*v >> 4) == 6 ? bpf_htons(ETH_P_IPV6) : bpf_htons(ETH_P_IP);
}

/*
 * An IP packet's flow as scalars, no packet pointers: what mrc_tx reads of
 * the inner packet after its one parse (tx_parse_inner, a global function:
 * family-dependent packet pointers kept through the program multiplied the
 * verifier's states), and what a MAC covers (auth.h). Ports are read for
 * TCP and UDP unless the packet is a later IPv4 fragment.
 */
struct l3_flow {
	__be32	saddr[4];	/* IPv4 in [0], the rest 0 */
	__be32	daddr[4];
	__u32	ports;		/* the L4 header's first 4 bytes as loaded
				 * (source, destination port); 0 if none */
	__u8	family;		/* 4 or 6 */
	__u8	proto;		/* IPv6: the next header, not walked */
	__u8	has_ports;
	__u8	rsvd;
};

static __always_inline void l3_flow_of(const struct l3_desc *d, void *data_end,
				       struct l3_flow *fl)
{
	__u32 *ports = d->l4;

	__builtin_memset(fl, 0, sizeof(*fl));
	fl->family = d->family;
	fl->proto = d->proto;
	if (d->family == 4) {
		fl->saddr[0] = d->ip4->saddr;
		fl->daddr[0] = d->ip4->daddr;
	} else {
		__builtin_memcpy(fl->saddr, &d->ip6->saddr, 16);
		__builtin_memcpy(fl->daddr, &d->ip6->daddr, 16);
	}
	if ((d->proto == IPPROTO_TCP || d->proto == IPPROTO_UDP) &&
	    d->frag != L3_FRAG_LATER && (void *)(ports + 1) <= data_end) {
		fl->ports = *ports;
		fl->has_ports = 1;
	}
}

/* An address folded to 32 bits (xor of its words), for the flow hashes
 * (spray.h, retx.h): an IPv4 address is its own fold, so IPv4 hashes are
 * what they were before inner IPv6. */
static __always_inline __u32 l3_fold(const __be32 *a)
{
	return a[0] ^ a[1] ^ a[2] ^ a[3];
}

#define FLOW_HASH_MUL	0x9E3779B1u	/* golden ratio: Fibonacci hashing */
#define FLOW_HASH_V6_SALT 0x5bd1e995u	/* inner IPv6 flows (murmur2's constant) */

/* A flow's 32-bit hash for the per-peer flow slots (retx.h, paws.h): its
 * addresses (IPv6: folded) and (source << 16 | dest) of the raw
 * network-order ports, as loaded; the top bits pick the slot, the whole
 * hash tags it. The salt keeps an IPv6 flow off an IPv4 one whose
 * addresses xor to the same (fd99::1 / fd99::2 and 10.99.0.1 / 10.99.0.2
 * do). */
static __always_inline __u32 l3_flow_hash(const struct l3_flow *fl)
{
	return (l3_fold(fl->saddr) ^ l3_fold(fl->daddr) ^
		((fl->ports & 0xffff) << 16 | fl->ports >> 16) ^
		(fl->family == 6 ? FLOW_HASH_V6_SALT : 0)) * FLOW_HASH_MUL;
}

/* Returns the UDP length field (host order) or -1. */
static __always_inline int parse_udphdr(struct hdr_cursor *nh, void *data_end,
					struct udphdr **udphdr)
{
	struct udphdr *h = nh->pos;

	if ((void *)(h + 1) > data_end)
		return -1;
	nh->pos = h + 1;
	*udphdr = h;
	return bpf_ntohs(h->len);
}

/* Returns the TCP header length in bytes or -1. */
static __always_inline int parse_tcphdr(struct hdr_cursor *nh, void *data_end,
					struct tcphdr **tcphdr)
{
	struct tcphdr *h = nh->pos;
	int len;

	if ((void *)(h + 1) > data_end)
		return -1;
	len = h->doff * 4;
	if (len < (int)sizeof(*h))
		return -1;
	if (nh->pos + len > data_end)
		return -1;
	nh->pos += len;
	*tcphdr = h;
	return len;
}

#endif /* MRC_PARSING_H */
