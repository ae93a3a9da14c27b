/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Every write of outer headers, in one place: encapsulation (encap_push),
 * the hedge's rewrite of a sent unit for another path (encap_write), a
 * probe turned around in place (encap_turn_around) and decapsulation
 * (decap_xdp, decap_tc). Each helper re-derives its packet pointers itself: after
 * bpf_skb_adjust_room / bpf_skb_pull_data / bpf_xdp_adjust_head every
 * pointer the caller held is invalid (testbed facts).
 */
#ifndef MRC_ENCAP_H
#define MRC_ENCAP_H

#include <stdbool.h>
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_endian.h>
#include "parsing.h"
#include "csum.h"
#include "mrc.h"
#include "auth.h"

#define MRC_TTL		64
/* ver_type: MRC_VERSION in the high nibble, enum mrc_type in the low one */
#define MRCH_VERSION_SHIFT	4
#define MRCH_TYPE_MASK		0x0f

/* What one unit's MRC header says; host order. */
struct mrc_unit {
	__u32	psn;
	__u32	tx_ts;
	__u32	seq0;
	__u32	fb_ts;
	__u16	path_id;
	__u16	segs;
	__u16	seg_size;
	__u16	epoch;
	__u8	fb_path;
	__u8	path_seq;
	__u8	flags;
	__u8	tos;		/* inner DSCP and ECN, copied to the outer header */
	/* auth (bpf/auth.h): a copy of the key toward the peer (key.on 0: no
	 * MAC) and the inner flow whose block it covers, taken before the
	 * headers move.
	 * A copy, not the map pointer: NULL-or-pointer kept through the slot
	 * walk split the verifier's states past its 1M-instruction limit. */
	struct mrc_auth_key key;
	struct l3_flow fl;
};

/* An MRC frame as mrc_rx sees it: outer headers, then the inner packet. */
struct mrc_frame {
	struct ethhdr	*eth;
	__u32		l2_len;	/* Ethernet and a priority tag (parse_l2) */
	struct l3_desc	l3;	/* outer */
	struct udphdr	*udp;
	struct mrc_hdr	*mh;
	__u32		inner_family;	/* DATA: the inner packet's, 4 or 6 (its ethertype at decap) */
	const struct mrc_auth_key *auth;	/* the peer's key, if auth is on */
	__u32		mac_len;	/* 0 or MRC_AUTH_LEN, behind the MRC header */
	__u32		len;	/* whole frame: with XDP multi-buffer (jumbo
				 * planes) more than data_end - data */
	__u32		fb_peer;	/* fb_due: the DATA frame's peer and path */
	__u16		fb_path;
	bool		fb_due;	/* tc: send a feedback frame (feedback.h) */
};

static __always_inline __u32 encap_overhead(__u8 family)
{
	return family == 4 ? MRC_OVERHEAD_V4 : MRC_OVERHEAD_V6;
}

/* Bytes behind the MRC header: the MAC, when the unit is authenticated. */
static __always_inline __u32 encap_mac_len(const struct mrc_unit *u)
{
	return u->key.on ? MRC_AUTH_LEN : 0;
}

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
	iph->ihl = IPV4_MIN_IHL;
	iph->tos = u->tos;
	iph->tot_len = bpf_htons((__u16)tot_len);
	iph->id = bpf_htons((__u16)u->psn);
	iph->frag_off = bpf_htons(IPV4_DF);
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
	__u32 fl = path->ev & IPV6_FLOWLABEL_MASK;

	ip6h->version = 6;
	ip6h->priority = u->tos >> 4;
	ip6h->flow_lbl[0] = ((u->tos & IP_TCLASS_LO_MASK) << 4) | ((fl >> 16) & 0x0f);
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
	mh->ver_type = (MRC_VERSION << MRCH_VERSION_SHIFT) | type;
	mh->flags = u->flags;
	mh->path_id = bpf_htons(u->path_id);
	mh->psn = bpf_htonl(u->psn);
	mh->tx_ts = bpf_htonl(u->tx_ts);
	mh->segs = bpf_htons(u->segs);
	mh->seg_size = bpf_htons(u->seg_size);
	mh->seq0 = bpf_htonl(u->seq0);
	mh->path_seq = u->path_seq;
	mh->fb_path = u->fb_path;
	mh->epoch = bpf_htons(u->epoch);
	mh->fb_ts = bpf_htonl(u->fb_ts);
}

/* Write all outer headers of a DATA unit for `path` in front of the inner
 * packet of an skb that already has room for them (after encap_push's
 * adjust_room, or a sent unit being rewritten for another path). -1 if the
 * headers do not lie in the linear data. */
static __always_inline int encap_write(struct __sk_buff *skb,
				       const struct mrc_path *path,
				       const struct mrc_unit *u, __u16 port)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	__u32 len = skb->len;

	if (path->family == 4) {
		struct iphdr *oip = (void *)(eth + 1);
		struct udphdr *udp = (void *)(oip + 1);
		struct mrc_hdr *mh = (void *)(udp + 1);

		if ((void *)(mh + 1) > data_end)
			return -1;
		write_eth(eth, path, ETH_P_IP);
		write_ipv4(oip, path, len - ETH_HLEN, u);
		write_udp(udp, path->ev, port, len - ETH_HLEN - sizeof(*oip));
		write_mrc(mh, MRC_T_DATA, u);
		if (u->key.on)
			return auth_sign(mh, data_end, &u->key, &u->fl);
	} else {
		struct ipv6hdr *oip6 = (void *)(eth + 1);
		struct udphdr *udp = (void *)(oip6 + 1);
		struct mrc_hdr *mh = (void *)(udp + 1);

		if ((void *)(mh + 1) > data_end)
			return -1;
		write_eth(eth, path, ETH_P_IPV6);
		write_ipv6(oip6, path, len - ETH_HLEN - sizeof(*oip6), u);
		write_udp(udp, path->ev, port, len - ETH_HLEN - sizeof(*oip6));
		write_mrc(mh, MRC_T_DATA, u);
		if (u->key.on)
			return auth_sign(mh, data_end, &u->key, &u->fl);
	}
	return 0;
}

#define ENCAP_EALREADY		114	/* errno: skb already encapsulated */
#define ENCAP_NESTED_GSO	-2	/* encap_push: nested GSO unit refused */

/*
 * Encapsulate a unit for `path`: open room between the Ethernet header and
 * the inner packet, reserve the unit's PSNs from *psn_next, and write all
 * outer headers. The PSNs are reserved only once the room is there: a PSN
 * burnt on a failed adjust_room would look like loss to the receiver.
 *
 * FIXED_GSO keeps gso_size (the overlay MTU already leaves room for the
 * overhead); ENCAP_* tell the GSO layer where the outer L3/L4 and our "L2"
 * (the MRC header) are, so segmentation copies them into every segment.
 * Returns 0, ENCAP_NESTED_GSO or -1.
 */
static __always_inline int encap_push(struct __sk_buff *skb,
				      const struct mrc_path *path,
				      struct mrc_unit *u, __u16 port,
				      __u64 *psn_next)
{
	/* The MAC counts as part of the "L2" header: segmentation copies it
	 * into every segment with the MRC header it covers. */
	__u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L4_UDP |
		      BPF_F_ADJ_ROOM_ENCAP_L2(MRC_HDR_LEN + encap_mac_len(u));

	long err;

	flags |= path->family == 4 ? BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 :
				     BPF_F_ADJ_ROOM_ENCAP_L3_IPV6;
	err = bpf_skb_adjust_room(skb, encap_overhead(path->family) + encap_mac_len(u),
				  BPF_ADJ_ROOM_MAC, flags);
	/* The inner packet is itself a tunnel's (VXLAN or Geneve from a
	 * container network over the overlay): the skb describes one level
	 * of encapsulation only. A single packet needs no description (its
	 * checksum offset stays valid, room opens after the MAC header): plain
	 * room. A GSO unit would be segmented by the inner tunnel's headers
	 * with ours copied as an unchanged "MAC header", every segment's
	 * outer lengths wrong: refused. */
	if (err == -ENCAP_EALREADY) {
		/* u->seg_size is skb->gso_size, read before adjust_room (a
		 * ctx read here compiled to a modified-ctx dereference) */
		if (u->seg_size)
			return ENCAP_NESTED_GSO;
		err = bpf_skb_adjust_room(skb, encap_overhead(path->family) + encap_mac_len(u),
					  BPF_ADJ_ROOM_MAC, 0);
	}
	if (err)
		return -1;
	u->psn = __sync_fetch_and_add(psn_next, u->segs);
	return encap_write(skb, path, u, port);
}

/* Turn a probe around in place: swap MACs, addresses and ports, keep
 * path_id and tx_ts so the prober measures its own path's RTT. The frame
 * was bounds-checked up to the end of the MRC header. */
static __always_inline void encap_turn_around(struct mrc_frame *f)
{
	struct ethhdr *eth = f->eth;
	struct udphdr *udp = f->udp;
	__u8 mac[ETH_ALEN];
	__be16 port;

	__builtin_memcpy(mac, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, mac, ETH_ALEN);

	if (f->l3.family == 4) {
		struct iphdr *iph = f->l3.ip4;
		__be32 a = iph->saddr;

		iph->saddr = iph->daddr;
		iph->daddr = a;
		iph->ttl = MRC_TTL;
		ipv4_csum_set(iph);
	} else {
		struct ipv6hdr *ip6h = f->l3.ip6;
		struct in6_addr a = ip6h->saddr;

		ip6h->saddr = ip6h->daddr;
		ip6h->daddr = a;
		ip6h->hop_limit = MRC_TTL;
	}

	port = udp->source;
	udp->source = udp->dest;
	udp->dest = port;
	udp->check = 0;		/* zero UDP checksum, also IPv6: see write_udp */

	f->mh->ver_type = (MRC_VERSION << MRCH_VERSION_SHIFT) | MRC_T_PROBE_REPLY;
}

/* Strip the outer IP/UDP/MRC headers, keep the outer MACs and write the
 * inner packet's ethertype: the kernel receives it on the plane device. */
static __always_inline int decap_xdp(struct xdp_md *ctx, __u32 overhead,
				     __u16 inner_proto)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__u8 dmac[ETH_ALEN], smac[ETH_ALEN];

	if ((void *)(eth + 1) > data_end)
		return -1;
	__builtin_memcpy(dmac, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(smac, eth->h_source, ETH_ALEN);
	if (bpf_xdp_adjust_head(ctx, overhead))
		return -1;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;
	if ((void *)(eth + 1) > data_end)
		return -1;
	__builtin_memcpy(eth->h_dest, dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, smac, ETH_ALEN);
	eth->h_proto = bpf_htons(inner_proto);
	return 0;
}

/* Newer than some uapi headers this builds against; the kernel checks. */
#ifndef BPF_F_ADJ_ROOM_DECAP_L3_IPV4
#define BPF_F_ADJ_ROOM_DECAP_L3_IPV4	(1ULL << 7)
#define BPF_F_ADJ_ROOM_DECAP_L3_IPV6	(1ULL << 8)
#endif
#define MRC_ADJ_ROOM_DECAP_L4_UDP	(1ULL << 10)	/* BPF_F_ADJ_ROOM_DECAP_L4_UDP */

/*
 * tc ingress: strip the outer IP/UDP/MRC headers behind the Ethernet header
 * and write the inner ethertype; skb->protocol follows the inner family
 * (DECAP_L3_*). FIXED_GSO keeps gso_size: a GSO unit's segments carried
 * seg_size inner bytes each, which is the inner MSS. DECAP_L4_UDP also
 * clears the UDP-tunnel GSO type and skb->encapsulation the sender's encap
 * set; kernels without it (before it reached mainline) refuse the flag, and
 * the retry leaves them: TCP delivered locally ignores both, a forwarded
 * inner packet is segmented in software.
 */
static __always_inline int decap_tc(struct __sk_buff *skb, __u32 overhead,
				    __u16 inner_proto)
{
	__u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO |
		      (inner_proto == ETH_P_IP ? BPF_F_ADJ_ROOM_DECAP_L3_IPV4 :
						 BPF_F_ADJ_ROOM_DECAP_L3_IPV6);
	struct ethhdr *eth;

	if (bpf_skb_adjust_room(skb, -(__s32)overhead, BPF_ADJ_ROOM_MAC,
				flags | MRC_ADJ_ROOM_DECAP_L4_UDP) &&
	    bpf_skb_adjust_room(skb, -(__s32)overhead, BPF_ADJ_ROOM_MAC, flags))
		return -1;
	eth = (void *)(long)skb->data;
	if ((void *)(eth + 1) > (void *)(long)skb->data_end)
		return -1;
	eth->h_proto = bpf_htons(inner_proto);
	return 0;
}

#endif /* MRC_ENCAP_H */
