/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Path MTU (issue #13.11). mrc sends every outer packet with DF (encap.h),
 * and bpf_redirect neither fragments nor answers a too-big packet, so a
 * fabric link with a smaller MTU than the planes' would swallow full-size
 * units silently. Instead:
 *
 *  - rx (pmtu_rx_icmp): an ICMP "fragmentation needed" (IPv4) or "packet
 *    too big" (IPv6) that arrives on a plane and quotes one of our own DATA
 *    frames records the MTU it names for that one path (mrc_path_mtu).
 *    The quote must name the path exactly: the peer's address on this
 *    plane, our address, the path's EV and id, and a PSN we sent recently.
 *    Whoever forges one must have seen our traffic or guess a 2^20 window
 *    out of 2^32 PSNs (docs/hostile-input.md).
 *  - tx (pmtu_fits, tx_icmp_too_big, tx_icmp6_too_big): a unit whose wire
 *    segments do not fit its path's recorded MTU is turned into an ICMP
 *    "fragmentation needed" (inner IPv6: ICMPv6 "packet too big") to the
 *    inner sender, with the overlay MTU every recorded path of the
 *    peer can carry, and redirected into the overlay device's ingress: the
 *    sender's stack lowers its PMTU and TCP retransmits at once at the
 *    smaller size. An inner packet without DF may not be answered so
 *    (RFC 1191): it is dropped and counted (MRC_R_TX_TOO_BIG_DROP); the
 *    kernel sets DF on TCP and on UDP unless a socket opts out.
 *  - ageing: a record older than MRC_PMTU_AGE_S is ignored, so a link
 *    whose MTU went back up carries full-size units again; the first one
 *    too big for a still-small link brings a new ICMP (the stack's own PMTU
 *    expiry, net.ipv4.route.mtu_expires, is also 10 minutes).
 */
#ifndef MRC_PMTU_H
#define MRC_PMTU_H

#include <stdbool.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "mrc.h"
#include "parsing.h"
#include "csum.h"
#include "path.h"
#include "peer.h"
#include "encap.h"
#include "validate.h"

#define MRC_PMTU_AGE_S		600
#define PMTU_NS_PER_S		1000000000ULL
/* A quoted PSN must lie this far below the next PSN to send, at most:
 * about 2.5 s of 1500-byte packets at 5 Gbit/s. */
#define MRC_PMTU_PSN_WINDOW	(1U << 20)
/* Smallest MTU an ICMP may set: IPv4's minimum datagram every link
 * carries reassembled (RFC 791), IPv6's minimum link MTU (RFC 8200). A
 * smaller claim is raised to it, as the kernel does (min_pmtu), so a forged
 * tiny MTU cannot shrink the overlay to nothing. */
#define MRC_PMTU_MIN_V4		576
#define MRC_PMTU_MIN_V6		1280
/* ICMP generated toward the inner sender: inner IP header (with options)
 * plus this much of what follows, like a router quoting its datagram. */
#define PMTU_QUOTE_L4		64
#define PMTU_QUOTE_MAX		(60 + PMTU_QUOTE_L4)
/* <linux/icmp.h> drags in libc headers; the 8 bytes we need, both
 * families: type, code, checksum, then IPv4's unused + 16-bit next-hop MTU
 * (RFC 1191) or IPv6's 32-bit MTU (RFC 4443). */
#define ICMP_DEST_UNREACH	3
#define ICMP_FRAG_NEEDED	4
#define ICMP6_PKT_TOO_BIG	2
struct pmtu_icmp {
	__u8	type;
	__u8	code;
	__be16	checksum;
	union {
		struct {
			__be16	unused;
			__be16	mtu;
		} v4;
		__be32	mtu6;
	};
};

/* Per path, MRC_PATH_IDX(peer, path); writer: mrc_rx (pmtu_rx_icmp). A
 * map of its own: mrc_paths is rewritten whole by the agent. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_N_PATH_ENTRIES);
	__type(key, __u32);
	__type(value, struct mrc_path_mtu);
} mrc_path_mtu SEC(".maps");

/* The recorded MTU of a path, or 0 when none is in force. */
static __always_inline __u32 pmtu_of(__u32 peer_idx, __u32 pid, __u64 now)
{
	__u32 idx = path_idx(peer_idx, pid);
	struct mrc_path_mtu *m = bpf_map_lookup_elem(&mrc_path_mtu, &idx);
	__u32 mtu;

	if (!m)
		return 0;
	mtu = m->mtu;
	if (!mtu || (__u32)(now / PMTU_NS_PER_S) - m->s > MRC_PMTU_AGE_S)
		return 0;
	return mtu;
}

/* May an outer packet of l3_len bytes (IP header included) go out on the
 * path, as far as we have been told? */
static __always_inline bool pmtu_fits(__u32 peer_idx, __u32 pid, __u32 l3_len,
				      __u64 now)
{
	__u32 mtu = pmtu_of(peer_idx, pid, now);

	return !mtu || l3_len <= mtu;
}

/* What the overlay can carry to this peer over every path with a record:
 * the smallest recorded MTU less its path's encapsulation, or 0 when no
 * record is in force. A sender sized by it fits whichever path the spray
 * picks. Walked only for a unit that did not fit (rare), with bpf_loop:
 * an open-coded walk of 256 paths multiplied the verifier's states. */
struct pmtu_walk {
	__u64	now;
	__u32	peer_idx;
	__u32	best;
};

static long pmtu_overlay_one(__u64 i, void *ctx)
{
	struct pmtu_walk *w = ctx;
	struct mrc_path *p = path_cfg(w->peer_idx, i);
	__u32 mtu = pmtu_of(w->peer_idx, i, w->now), ovh;

	if (!mtu || !p)
		return 0;
	ovh = encap_overhead(p->family);
	mtu = mtu > ovh ? mtu - ovh : 0;
	if (!w->best || mtu < w->best)
		w->best = mtu;
	return 0;
}

static __always_inline __u32 pmtu_overlay(__u32 peer_idx, __u32 n_paths, __u64 now)
{
	struct pmtu_walk w = { .now = now, .peer_idx = peer_idx };

	bpf_loop(n_paths < MRC_STRIDE ? n_paths : MRC_STRIDE,
		 pmtu_overlay_one, &w, 0);
	return w.best;
}

/* Ones' complement sum (unfolded) of the bytes from p to data_end, at most
 * the ICMP header and quote; an odd last byte is padded with zero (RFC
 * 1071). Sums raw 16-bit words: the result is stored as it comes out. */
static __always_inline __u32 pmtu_csum(void *p, void *data_end)
{
	__u32 sum = 0, i;

	for (i = 0; i < (8 + PMTU_QUOTE_MAX) / 2; i++) {
		__u8 *b = p + 2 * i;

		if ((void *)(b + 2) <= data_end) {
			sum += *(__u16 *)b;
		} else {
			if ((void *)(b + 1) <= data_end)
				sum += bpf_ntohs((__u16)*b << 8);
			break;
		}
	}
	return sum;
}

/* After room for our l3 + ICMP header was opened in front of the quoted
 * packet: cut the frame to `quote` bytes of it (fewer if it is shorter)
 * and make it linear. Returns the quote's length, or -1. */
static __always_inline int pmtu_trim(struct __sk_buff *skb, __u32 l3, __u32 quote)
{
	__u32 tot = l3 + sizeof(struct pmtu_icmp) + quote;

	if (skb->len < ETH_HLEN + tot) {
		tot = skb->len - ETH_HLEN;
		quote = tot - l3 - sizeof(struct pmtu_icmp);
	}
	if (bpf_skb_change_tail(skb, ETH_HLEN + tot, 0) || bpf_skb_pull_data(skb, ETH_HLEN + tot))
		return -1;
	return quote;
}

/* Back to the device it came from: the sender's own MAC becomes the
 * destination, so the stack takes the frame as addressed to it. */
static __always_inline void pmtu_turn_eth(struct ethhdr *eth, __u16 proto)
{
	__u8 mac[ETH_ALEN];

	__builtin_memcpy(mac, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, mac, ETH_ALEN);
	eth->h_proto = bpf_htons(proto);
}

/* The ICMP checksum: the message (the frame ends with the quote) and the
 * pseudo-header's sum (0 for ICMPv4). */
static __always_inline void pmtu_csum_set(struct pmtu_icmp *ic, void *data_end, __u32 sum)
{
	ic->checksum = 0;
	sum += pmtu_csum(ic, data_end);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	ic->checksum = ~sum & 0xffff;
}

/*
 * Turn the inner packet (Ethernet + IPv4, not yet encapsulated) into an
 * ICMP "fragmentation needed" with next-hop MTU `mtu`, from the inner
 * destination to the inner sender, for the caller to redirect into the
 * overlay device's ingress. The room for the new IP and ICMP headers is
 * opened before trimming: trimming first would cut into the bytes a
 * CHECKSUM_PARTIAL TCP packet's checksum offset still points at, which
 * bpf_skb_change_tail refuses. FIXED_GSO: without it adjust_room refuses a
 * UDP GSO unit; the trim then ends the skb's GSO life (skb_gso_reset). -1
 * on failure (the caller drops).
 */
static __always_inline int tx_icmp_too_big(struct __sk_buff *skb, __u32 mtu)
{
	void *data, *data_end;
	struct ethhdr *eth;
	struct iphdr *oip, *qip;
	struct pmtu_icmp *ic;
	__be32 saddr, daddr;
	int ihl, quote;

	if (bpf_skb_adjust_room(skb, sizeof(struct iphdr) + sizeof(struct pmtu_icmp),
				BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_FIXED_GSO))
		return -1;
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	qip = data + ETH_HLEN + sizeof(*oip) + sizeof(*ic);
	if ((void *)(qip + 1) > data_end)
		return -1;
	ihl = qip->ihl * 4;
	if (ihl < (int)sizeof(*qip) || ihl > 60)
		return -1;
	quote = pmtu_trim(skb, sizeof(*oip), ihl + PMTU_QUOTE_L4);
	if (quote < 0)
		return -1;

	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	eth = data;
	oip = (void *)(eth + 1);
	ic = (void *)(oip + 1);
	qip = (void *)(ic + 1);
	if ((void *)(qip + 1) > data_end)
		return -1;
	pmtu_turn_eth(eth, ETH_P_IP);
	saddr = qip->daddr;
	daddr = qip->saddr;

	oip->version = 4;
	oip->ihl = IPV4_MIN_IHL;
	oip->tos = 0xc0;	/* internetwork control, as the kernel's ICMP */
	oip->tot_len = bpf_htons((__u16)(sizeof(*oip) + sizeof(*ic) + quote));
	oip->id = 0;
	oip->frag_off = 0;
	oip->ttl = MRC_TTL;
	oip->protocol = IPPROTO_ICMP;
	oip->saddr = saddr;
	oip->daddr = daddr;
	ipv4_csum_set(oip);

	ic->type = ICMP_DEST_UNREACH;
	ic->code = ICMP_FRAG_NEEDED;
	ic->v4.unused = 0;
	ic->v4.mtu = bpf_htons((__u16)mtu);
	pmtu_csum_set(ic, data_end, 0);
	return 0;
}

/*
 * The same for an inner IPv6 packet: an ICMPv6 "packet too big" (RFC 4443
 * type 2) with MTU `mtu`, quoting the IPv6 header and PMTU_QUOTE_L4 bytes
 * behind it, its checksum over the IPv6 pseudo-header too. A sender's
 * stack never lowers its path MTU below 1280 (IPv6's minimum link MTU):
 * a smaller `mtu` makes it send 1280-byte packets, which such a path drops
 * again (tx_too_big once more). -1 on failure (the caller drops).
 */
static __always_inline int tx_icmp6_too_big(struct __sk_buff *skb, __u32 mtu)
{
	void *data, *data_end;
	struct ethhdr *eth;
	struct ipv6hdr *oip, *qip;
	struct pmtu_icmp *ic;
	struct in6_addr saddr, daddr;
	__u32 sum = 0, i;
	__u16 *w;
	int quote;

	if (bpf_skb_adjust_room(skb, sizeof(struct ipv6hdr) + sizeof(struct pmtu_icmp),
				BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_FIXED_GSO))
		return -1;
	quote = pmtu_trim(skb, sizeof(*oip), sizeof(*qip) + PMTU_QUOTE_L4);
	if (quote < 0)
		return -1;

	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	eth = data;
	oip = (void *)(eth + 1);
	ic = (void *)(oip + 1);
	qip = (void *)(ic + 1);
	if ((void *)(qip + 1) > data_end)
		return -1;
	pmtu_turn_eth(eth, ETH_P_IPV6);
	saddr = qip->daddr;
	daddr = qip->saddr;

	oip->version = 6;
	oip->priority = 0;
	oip->flow_lbl[0] = 0;
	oip->flow_lbl[1] = 0;
	oip->flow_lbl[2] = 0;
	oip->payload_len = bpf_htons((__u16)(sizeof(*ic) + quote));
	oip->nexthdr = IPPROTO_ICMPV6;
	oip->hop_limit = MRC_TTL;
	oip->saddr = saddr;
	oip->daddr = daddr;

	ic->type = ICMP6_PKT_TOO_BIG;
	ic->code = 0;
	ic->mtu6 = bpf_htonl(mtu);
	/* the pseudo-header: both addresses, the upper-layer length and next
	 * header, as raw 16-bit words like pmtu_csum's */
	w = (__u16 *)&oip->saddr;
	for (i = 0; i < 16; i++)
		sum += w[i];
	sum += bpf_htons((__u16)(sizeof(*ic) + quote)) + bpf_htons(IPPROTO_ICMPV6);
	pmtu_csum_set(ic, data_end, sum);
	return 0;
}

static __always_inline bool pmtu_addr6_eq(const __be32 *a, const struct in6_addr *b)
{
	return a[0] == b->in6_u.u6_addr32[0] && a[1] == b->in6_u.u6_addr32[1] &&
	       a[2] == b->in6_u.u6_addr32[2] && a[3] == b->in6_u.u6_addr32[3];
}

/*
 * An ICMP error on a plane (validate.h hands over IPv4 ICMP and ICMPv6 that
 * are not fragments). Anything but "fragmentation needed" / "packet too
 * big" about a frame to our UDP port is someone else's and passes
 * untouched; one about our port either names one of our paths exactly and
 * is consumed (MRC_R_RX_PMTU), or is dropped (MRC_R_RX_PMTU_BAD).
 */
static __always_inline __u32 pmtu_rx_icmp(const struct mrc_frame *f, void *data_end,
					  __u32 ifindex, __u16 udp_port)
{
	struct hdr_cursor nh = { .pos = f->l3.l4 };
	struct mrc_rx_key key = {};
	struct l3_desc q;
	struct udphdr *udp;
	struct mrc_hdr *mh;
	struct mrc_path *p;
	struct mrc_peer *peer;
	struct mrc_peer_seq *seq;
	struct mrc_path_mtu *rec;
	__u32 mtu, plane, pid, delta, idx, min;
	int pidx, proto;

	if (f->l3.family == 4) {
		struct pmtu_icmp *ic = nh.pos;

		if ((void *)(ic + 1) > data_end)
			return RX_PASS_UNCOUNTED;
		if (ic->type != ICMP_DEST_UNREACH || ic->code != ICMP_FRAG_NEEDED)
			return RX_PASS_UNCOUNTED;
		mtu = bpf_ntohs(ic->v4.mtu);
		nh.pos = ic + 1;
		proto = bpf_htons(ETH_P_IP);
		min = MRC_PMTU_MIN_V4;
	} else {
		struct pmtu_icmp *ic = nh.pos;

		if ((void *)(ic + 1) > data_end)
			return RX_PASS_UNCOUNTED;
		if (ic->type != ICMP6_PKT_TOO_BIG || ic->code != 0)
			return RX_PASS_UNCOUNTED;
		mtu = bpf_ntohl(ic->mtu6);
		nh.pos = ic + 1;
		proto = bpf_htons(ETH_P_IPV6);
		min = MRC_PMTU_MIN_V6;
	}
	/* The quoted packet: is it one of our frames at all? */
	if (parse_l3(&nh, data_end, proto, L3_F_IPV4 | L3_F_IPV6, &q) != L3_OK ||
	    q.proto != IPPROTO_UDP || q.frag != L3_FRAG_NONE || l3_has_options(&q))
		return RX_PASS_UNCOUNTED;
	if (parse_udphdr(&nh, data_end, &udp) < 0 || udp->dest != bpf_htons(udp_port))
		return RX_PASS_UNCOUNTED;

	/* About our port: from here on it must name one of our paths. */
	mh = nh.pos;
	if ((void *)(mh + 1) > data_end)
		return RX_V(RX_DROP, MRC_R_RX_PMTU_BAD);
	if (mh->ver_type != ((MRC_VERSION << MRCH_VERSION_SHIFT) | MRC_T_DATA))
		return RX_V(RX_DROP, MRC_R_RX_PMTU_BAD);
	key.ifindex = ifindex;
	key.family = q.family;
	if (q.family == 4)
		key.addr[0] = q.ip4->daddr;
	else
		__builtin_memcpy(key.addr, &q.ip6->daddr, 16);
	pidx = peer_by_source(&key, &plane);
	if (pidx < 0)
		return RX_V(RX_DROP, MRC_R_RX_PMTU_BAD);
	peer = peer_get(pidx);
	seq = peer_seq(pidx);
	pid = bpf_ntohs(mh->path_id);
	if (!peer || !seq || pid >= peer->n_paths || pid >= MRC_STRIDE)
		return RX_V(RX_DROP, MRC_R_RX_PMTU_BAD);
	p = path_cfg(pidx, pid);
	if (!p || p->plane != plane || p->family != q.family ||
	    p->ev != bpf_ntohs(udp->source))
		return RX_V(RX_DROP, MRC_R_RX_PMTU_BAD);
	if (q.family == 4 ? p->saddr[0] != q.ip4->saddr :
			    !pmtu_addr6_eq(p->saddr, &q.ip6->saddr))
		return RX_V(RX_DROP, MRC_R_RX_PMTU_BAD);
	delta = (__u32)seq->psn - bpf_ntohl(mh->psn);
	if (delta == 0 || delta > MRC_PMTU_PSN_WINDOW)
		return RX_V(RX_DROP, MRC_R_RX_PMTU_BAD);
	/* It must say the quoted packet was too big: an MTU at or above its
	 * length (or none at all, pre-RFC 1191 routers) tells nothing. */
	if (!mtu || mtu >= q.len)
		return RX_V(RX_DROP, MRC_R_RX_PMTU_BAD);
	if (mtu < min)
		mtu = min;
	idx = path_idx(pidx, pid);
	rec = bpf_map_lookup_elem(&mrc_path_mtu, &idx);
	if (!rec)
		return RX_V(RX_DROP, MRC_R_RX_PMTU_BAD);
	rec->mtu = mtu;		/* < q.len: fits 16 bits */
	rec->s = bpf_ktime_get_ns() / PMTU_NS_PER_S;
	if (rec->icmps != 0xffff)
		rec->icmps++;
	return RX_V(RX_DROP, MRC_R_RX_PMTU);
}

#endif /* MRC_PMTU_H */
