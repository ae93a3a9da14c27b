/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Header parsing in the xdp-tools parsing_helpers.h style: a cursor walks
 * the packet, each parse_* checks that the whole header lies before
 * data_end (the verifier insists, and so does a hostile sender), advances
 * the cursor and returns the header's next-protocol value, or -1 when the
 * packet is too short.
 */
#ifndef MRC_PARSING_H
#define MRC_PARSING_H

#include <linux/types.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>

struct hdr_cursor {
	void *pos;
};

/* Returns the ethertype in network order. VLAN tags are not walked: mrc
 * never sends tagged frames, so a tagged frame is someone else's and the
 * caller passes it on untouched. */
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

/* Returns the IP protocol. Accepts options (ihl > 5) and walks past them;
 * whether options are acceptable is the caller's policy. */
static __always_inline int parse_iphdr(struct hdr_cursor *nh, void *data_end,
				       struct iphdr **iphdr)
{
	struct iphdr *iph = nh->pos;
	int hdrsize;

	if ((void *)(iph + 1) > data_end)
		return -1;
	if (iph->version != 4)
		return -1;
	hdrsize = iph->ihl * 4;
	/* ihl < 5 is malformed; also keeps the cursor moving forward */
	if (hdrsize < (int)sizeof(*iph))
		return -1;
	if (nh->pos + hdrsize > data_end)
		return -1;
	nh->pos += hdrsize;
	*iphdr = iph;
	return iph->protocol;
}

/* Returns the next header; extension headers are not walked (see rx.bpf.c
 * for the policy on them). */
static __always_inline int parse_ip6hdr(struct hdr_cursor *nh, void *data_end,
					struct ipv6hdr **ip6hdr)
{
	struct ipv6hdr *ip6h = nh->pos;

	if ((void *)(ip6h + 1) > data_end)
		return -1;
	if (ip6h->version != 6)
		return -1;
	nh->pos = ip6h + 1;
	*ip6hdr = ip6h;
	return ip6h->nexthdr;
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
