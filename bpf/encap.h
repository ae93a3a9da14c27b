/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Writing the outer headers. Called after bpf_skb_adjust_room() has opened
 * a gap of MRC_OVERHEAD_V4/V6 bytes between the Ethernet header and the
 * inner IPv4 packet; the caller has checked that Ethernet + outer headers
 * lie inside the packet.
 */
#ifndef MRC_ENCAP_H
#define MRC_ENCAP_H

#include <linux/in.h>
#include <bpf/bpf_endian.h>
#include "parsing.h"
#include "csum.h"
#include "mrc.h"

#define MRC_TTL		64

/* What one unit's MRC header says; host order. */
struct mrc_unit {
	__u32	psn;
	__u32	tx_ts;
	__u32	seq0;
	__u32	fb_ts;
	__u16	path_id;
	__u16	segs;
	__u16	seg_size;
	__u16	fb_path;
	__u8	flags;
	__u8	tos;		/* inner DSCP, copied to the outer header */
};

static __always_inline void write_eth(struct ethhdr *eth,
				      const struct mrc_path *path, __u16 proto)
{
	__builtin_memcpy(eth->h_dest, path->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, path->smac, ETH_ALEN);
	eth->h_proto = bpf_htons(proto);
}

/*
 * Outer IPv4: no options, DF (mrc never relies on fragmentation: the overlay
 * MTU leaves room for the overhead), ID from the PSN so a capture shows the
 * unit. tot_len covers the whole (possibly GSO) unit; the kernel's
 * UDP-tunnel segmentation rewrites tot_len, ID and checksum per segment.
 */
static __always_inline void write_ipv4(struct iphdr *iph,
				       const struct mrc_path *path,
				       __u32 tot_len, const struct mrc_unit *u)
{
	iph->version = 4;
	iph->ihl = 5;
	iph->tos = u->tos;
	iph->tot_len = bpf_htons((__u16)tot_len);
	iph->id = bpf_htons((__u16)u->psn);
	iph->frag_off = bpf_htons(0x4000);	/* IP_DF */
	iph->ttl = MRC_TTL;
	iph->protocol = IPPROTO_UDP;
	iph->saddr = path->saddr[0];
	iph->daddr = path->daddr[0];
	ipv4_csum_set(iph);
}

/* Outer IPv6: the flow label carries the EV too, so fabrics that hash on
 * (addresses, flow label) spread paths as well as ones hashing on ports. */
static __always_inline void write_ipv6(struct ipv6hdr *ip6h,
				       const struct mrc_path *path,
				       __u32 payload_len,
				       const struct mrc_unit *u)
{
	__u32 fl = path->ev & 0xfffff;

	ip6h->version = 6;
	ip6h->priority = u->tos >> 4;
	ip6h->flow_lbl[0] = ((u->tos & 0x0f) << 4) | ((fl >> 16) & 0x0f);
	ip6h->flow_lbl[1] = (fl >> 8) & 0xff;
	ip6h->flow_lbl[2] = fl & 0xff;
	ip6h->payload_len = bpf_htons((__u16)payload_len);
	ip6h->nexthdr = IPPROTO_UDP;
	ip6h->hop_limit = MRC_TTL;
	__builtin_memcpy(&ip6h->saddr, path->saddr, 16);
	__builtin_memcpy(&ip6h->daddr, path->daddr, 16);
}

/*
 * UDP with checksum 0. IPv4: "no checksum" is always allowed (RFC 768).
 * IPv6: zero-checksum UDP is allowed for tunnel protocols (RFC 6935,
 * RFC 6936) when the receiver is prepared for it; the receiver here is our
 * own XDP program, which accepts it on the MRC port only. The inner packet
 * keeps its own checksums end to end, and a full checksum would have to
 * cover the inner payload, whose TCP/UDP checksum may still be unfinished
 * (CHECKSUM_PARTIAL) at this point, and GSO units would need it per segment.
 */
static __always_inline void write_udp(struct udphdr *udp, __u16 sport,
				      __u16 dport, __u32 len)
{
	udp->source = bpf_htons(sport);
	udp->dest = bpf_htons(dport);
	udp->len = bpf_htons((__u16)len);
	udp->check = 0;
}

static __always_inline void write_mrc(struct mrc_hdr *mh, __u8 type,
				      const struct mrc_unit *u)
{
	mh->ver_type = (MRC_VERSION << 4) | type;
	mh->flags = u->flags;
	mh->path_id = bpf_htons(u->path_id);
	mh->psn = bpf_htonl(u->psn);
	mh->tx_ts = bpf_htonl(u->tx_ts);
	mh->segs = bpf_htons(u->segs);
	mh->seg_size = bpf_htons(u->seg_size);
	mh->seq0 = bpf_htonl(u->seq0);
	mh->fb_path = bpf_htons(u->fb_path);
	mh->fb_rsvd = 0;
	mh->fb_ts = bpf_htonl(u->fb_ts);
}

#endif /* MRC_ENCAP_H */
