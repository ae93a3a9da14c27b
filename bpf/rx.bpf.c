// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * mrc_rx: XDP on every plane device.
 *
 * Frames that are not mrc's leave untouched with XDP_PASS. MRC frames are
 * validated (each failure dropped and counted under its enum mrc_reason),
 * counted per path, probes are answered in place with XDP_TX, probe replies
 * and feedback echoes update path liveness, and DATA is decapsulated: the
 * outer IP/UDP/MRC headers are removed, a fresh Ethernet header (outer MACs,
 * ethertype IPv4) is written in front of the inner IPv4 packet and the
 * kernel receives it on the plane device (XDP_PASS).
 *
 * What counts as an MRC frame:
 *  - outer IPv4 or IPv6, UDP, destination port cfg.udp_port;
 *  - or UDP *source* port cfg.udp_port from a configured peer on this
 *    plane, carrying a version-1 PROBE_REPLY: replies swap the probe's
 *    ports, so they come back to the probe's EV. Anything else with that
 *    source port is someone else's traffic and passes untouched.
 * Not ours, passed untouched: VLAN-tagged frames (mrc never tags; counted
 * as MRC_R_RX_PASS_VLAN), non-IP, non-UDP, outer frames cut short before the
 * UDP ports (the stack drops them as malformed), non-first UDP fragments
 * (no UDP header to tell; counted as MRC_R_RX_PASS_FRAGMENT; the first
 * fragment is dropped below, so the datagram never reassembles), and
 * IPv6 with extension headers other than a fragment header (mrc never
 * sends them; we do not walk them).
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "mrc.h"
#include "maps.h"
#include "parsing.h"
#include "csum.h"
#include "stats.h"
#include "reorder.h"
#include "health.h"

#define IP_MF_BIT		0x2000
#define IP_OFFSET_MASK		0x1fff
#define IP6_NEXTHDR_FRAGMENT	44
#define IP6_FRAG_OFFSET_MASK	0xfff8

/* RTT samples above this are stale echoes or garbage (tx_ts wraps every
 * ~71 minutes): ignore them. */
#define RX_RTT_MAX_US		(4U * 1000 * 1000)

struct ip6_frag {
	__u8	nexthdr;
	__u8	reserved;
	__be16	frag_off;
	__be32	identification;
};

static __always_inline int rx_drop(__u32 reason)
{
	count_drop(reason);
	return XDP_DROP;
}

/*
 * Evidence that our path delivered a packet sent rtt_us ago (probe reply,
 * or a feedback echo of a data packet's tx_ts). last_ack_ns records when
 * that packet was *sent* (now - rtt), not when the evidence arrived: an
 * echo may repeat a receive timestamp for a while after the path died, and
 * dating the evidence by its send time keeps now - last_ack_ns the honest
 * age of the newest packet known delivered. Monotonic: older evidence
 * never moves it back (racy across CPUs; a lost race costs one sample).
 */
static __always_inline void path_acked(struct mrc_path_live *live,
				       __u64 now_ns, __u32 rtt_us)
{
	__u64 sent_ns;

	if (rtt_us > RX_RTT_MAX_US)
		return;
	sent_ns = now_ns - (__u64)rtt_us * 1000;
	if ((__s64)(sent_ns - live->last_ack_ns) > 0)
		live->last_ack_ns = sent_ns;
	rtt_sample(live, rtt_us);
}

/* Turn a probe around in place: swap MACs, addresses and ports, keep
 * path_id and tx_ts so the prober measures its own path's RTT. The caller
 * has bounds-checked everything up to the end of the MRC header. */
static __always_inline int probe_reply(struct ethhdr *eth, struct iphdr *iph,
				       struct ipv6hdr *ip6h,
				       struct udphdr *udp, struct mrc_hdr *mh)
{
	__u8 mac[ETH_ALEN];
	__be16 port;

	__builtin_memcpy(mac, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, mac, ETH_ALEN);

	if (iph) {
		__be32 a = iph->saddr;

		iph->saddr = iph->daddr;
		iph->daddr = a;
		iph->ttl = 64;
		ipv4_csum_set(iph);
	} else if (ip6h) {
		struct in6_addr a = ip6h->saddr;

		ip6h->saddr = ip6h->daddr;
		ip6h->daddr = a;
		ip6h->hop_limit = 64;
	}

	port = udp->source;
	udp->source = udp->dest;
	udp->dest = port;
	udp->check = 0;		/* see encap.h: zero UDP checksum, also IPv6 */

	mh->ver_type = (MRC_VERSION << 4) | MRC_T_PROBE_REPLY;
	count_drop(MRC_R_RX_PROBE_REPLIED);
	return XDP_TX;
}

SEC("xdp")
int mrc_rx(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct hdr_cursor nh = { .pos = data };
	struct ethhdr *eth;
	struct iphdr *iph = NULL;
	struct ipv6hdr *ip6h = NULL;
	struct udphdr *udp;
	struct mrc_hdr *mh;
	struct iphdr *inner;
	struct mrc_config *cfg;
	struct mrc_rx_peer *rxp;
	struct mrc_peer *peer;
	struct mrc_peer_seq *seq;
	struct mrc_path_live *live;
	struct mrc_path_stats *st;
	struct mrc_rx_key key = {};
	__u8 dmac[ETH_ALEN], smac[ETH_ALEN];
	__u32 zero = 0, l3_len, ip_len, peer_idx, path_id, type, psn;
	__u32 overhead, now_us, unit;
	__u64 now;
	bool receipt;
	__be16 port;
	bool reply_only = false;	/* matched by source port only */
	int proto;

	proto = parse_ethhdr(&nh, data_end, &eth);
	if (proto != bpf_htons(ETH_P_IP) && proto != bpf_htons(ETH_P_IPV6)) {
		/* Counted because a tagged MRC frame is a misconfiguration an
		 * operator wants to see, not silence. */
		if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD))
			count_drop(MRC_R_RX_PASS_VLAN);
		return XDP_PASS;
	}

	cfg = bpf_map_lookup_elem(&mrc_cfg, &zero);
	if (!cfg)
		return XDP_PASS;
	port = bpf_htons(cfg->udp_port ? cfg->udp_port : MRC_DEFAULT_UDP_PORT);

	/* 1. Outer IP and UDP: is it ours? */
	if (proto == bpf_htons(ETH_P_IP)) {
		__u32 ihl;

		iph = nh.pos;
		if ((void *)(iph + 1) > data_end)
			return XDP_PASS;
		if (iph->version != 4 || iph->protocol != IPPROTO_UDP)
			return XDP_PASS;
		ihl = iph->ihl * 4;
		if (ihl < sizeof(*iph))
			return XDP_PASS;
		/* Non-first fragment: no UDP header to look at. */
		if (iph->frag_off & bpf_htons(IP_OFFSET_MASK)) {
			count_drop(MRC_R_RX_PASS_FRAGMENT);
			return XDP_PASS;
		}
		udp = (void *)iph + ihl;
		if ((void *)(udp + 1) > data_end)
			return XDP_PASS;
		if (udp->dest != port) {
			if (udp->source != port)
				return XDP_PASS;
			reply_only = true;
		}
		if (ihl != sizeof(*iph))
			return reply_only ? XDP_PASS :
					    rx_drop(MRC_R_RX_IP_OPTIONS);
		if (iph->frag_off & bpf_htons(IP_MF_BIT))
			return reply_only ? XDP_PASS :
					    rx_drop(MRC_R_RX_FRAGMENT);
		key.family = 4;
		key.addr[0] = iph->saddr;
		l3_len = sizeof(*iph);
		ip_len = bpf_ntohs(iph->tot_len);
	} else {
		ip6h = nh.pos;
		if ((void *)(ip6h + 1) > data_end)
			return XDP_PASS;
		if (ip6h->version != 6)
			return XDP_PASS;
		if (ip6h->nexthdr == IP6_NEXTHDR_FRAGMENT) {
			/* A first fragment to the MRC port is ours and
			 * malformed; anything else fragmented passes. */
			struct ip6_frag *fh = (void *)(ip6h + 1);

			if ((void *)(fh + 1) > data_end)
				return XDP_PASS;
			if (fh->nexthdr != IPPROTO_UDP)
				return XDP_PASS;
			if (fh->frag_off & bpf_htons(IP6_FRAG_OFFSET_MASK)) {
				count_drop(MRC_R_RX_PASS_FRAGMENT);
				return XDP_PASS;
			}
			udp = (void *)(fh + 1);
			if ((void *)(udp + 1) > data_end)
				return XDP_PASS;
			if (udp->dest != port)
				return XDP_PASS;
			return rx_drop(MRC_R_RX_FRAGMENT);
		}
		if (ip6h->nexthdr != IPPROTO_UDP)
			return XDP_PASS;
		udp = (void *)(ip6h + 1);
		if ((void *)(udp + 1) > data_end)
			return XDP_PASS;
		if (udp->dest != port) {
			if (udp->source != port)
				return XDP_PASS;
			reply_only = true;
		}
		key.family = 6;
		__builtin_memcpy(key.addr, &ip6h->saddr, 16);
		l3_len = sizeof(*ip6h);
		ip_len = sizeof(*ip6h) + bpf_ntohs(ip6h->payload_len);
	}

	/* 2. Source check: this address may send MRC on this plane only. */
	key.ifindex = ctx->ingress_ifindex;
	rxp = bpf_map_lookup_elem(&mrc_rx_peers, &key);
	if (!rxp || rxp->peer >= MRC_MAX_PEERS)
		return reply_only ? XDP_PASS : rx_drop(MRC_R_RX_UNKNOWN_PEER);
	peer_idx = rxp->peer;
	peer = bpf_map_lookup_elem(&mrc_peers, &peer_idx);
	if (!peer || peer->n_paths == 0)
		return reply_only ? XDP_PASS : rx_drop(MRC_R_RX_UNKNOWN_PEER);

	/* Headers present, and the IP and UDP lengths claim no more than
	 * the frame holds (frames may carry Ethernet padding beyond them). */
	mh = (void *)(udp + 1);
	if ((void *)(mh + 1) > data_end ||
	    ip_len < l3_len + sizeof(*udp) + sizeof(*mh) ||
	    (__u32)(data_end - data) < ETH_HLEN + ip_len ||
	    bpf_ntohs(udp->len) < sizeof(*udp) + sizeof(*mh) ||
	    bpf_ntohs(udp->len) > ip_len - l3_len)
		return reply_only ? XDP_PASS : rx_drop(MRC_R_RX_TRUNCATED);

	if ((mh->ver_type >> 4) != MRC_VERSION)
		return reply_only ? XDP_PASS : rx_drop(MRC_R_RX_BAD_VERSION);
	type = mh->ver_type & 0x0f;
	if (reply_only && type != MRC_T_PROBE_REPLY)
		return XDP_PASS;

	/* Probes are answered whatever their path_id: it names a path of the
	 * prober's and is only echoed back. */
	if (type == MRC_T_PROBE)
		return probe_reply(eth, iph, ip6h, udp, mh);
	if (type != MRC_T_DATA && type != MRC_T_PROBE_REPLY)
		return rx_drop(MRC_R_RX_BAD_TYPE);

	/* DATA: path_id names the sender's path toward us (both ends are
	 * configured with the same path list); PROBE_REPLY: our own path. */
	path_id = bpf_ntohs(mh->path_id);
	if (path_id >= peer->n_paths || path_id >= MRC_MAX_PATHS)
		return rx_drop(MRC_R_RX_UNKNOWN_PATH);

	live = path_live(peer_idx, path_id);
	st = path_stats(peer_idx, path_id);
	if (!live || !st)
		return rx_drop(MRC_R_RX_UNKNOWN_PATH);

	/* 3. Probe reply: an RTT sample for our path. */
	if (type == MRC_T_PROBE_REPLY) {
		now = bpf_ktime_get_ns();
		now_us = (__u32)(now / 1000);
		path_acked(live, now, now_us - bpf_ntohl(mh->tx_ts));
		/* recovery of an ASSUMED_BAD path: bpf/health.h */
		health_probe_reply(cfg, peer_idx, path_id, live,
				   bpf_ntohl(mh->psn),
				   now_us - bpf_ntohl(mh->tx_ts), now);
		st->probes_rx += 1;
		count_drop(MRC_R_RX_PROBE_REPLY);
		return XDP_DROP;
	}

	/* 4. DATA. The inner packet must be IPv4. */
	inner = (void *)(mh + 1);
	if ((void *)(inner + 1) > data_end || inner->version != 4 ||
	    inner->ihl < 5)
		return rx_drop(MRC_R_RX_BAD_INNER);

	/* Wire PSN of this segment: the unit's PSN plus the segment's index,
	 * recovered from the inner TCP sequence number. */
	psn = bpf_ntohl(mh->psn);
	if (bpf_ntohs(mh->segs) > 1 && bpf_ntohs(mh->seg_size) > 0 &&
	    inner->protocol == IPPROTO_TCP) {
		struct tcphdr *tcph = (void *)inner + inner->ihl * 4;

		if ((void *)tcph + 8 <= data_end) {
			__u32 off = bpf_ntohl(tcph->seq) - bpf_ntohl(mh->seq0);
			__u32 i = off / bpf_ntohs(mh->seg_size);

			/* garbage beyond the unit: leave the unit's PSN */
			if (i < bpf_ntohs(mh->segs))
				psn += i;
		}
	}

	st->rx_packets += 1;
	st->rx_bytes += data_end - data;

	/* Every segment of a unit carries the unit's header (PSN of its first
	 * segment, tx_ts, feedback). The first segment of a unit to arrive is
	 * the receipt and applies the feedback; the others would only read the
	 * clock again (a fifth of this program's cost in a VM) to apply the
	 * same echo again. */
	unit = bpf_ntohl(mh->psn);
	receipt = unit != live->last_rx_unit || !live->last_rx_ns;
	if (receipt) {
		now = bpf_ktime_get_ns();
		now_us = (__u32)(now / 1000);
		live->last_rx_ns = now;
		live->last_rx_ts = bpf_ntohl(mh->tx_ts);
		live->last_rx_unit = unit;
	}

	/* Reordering hints, duplicates and loss, per wire packet:
	 * bpf/reorder.h. */
	seq = bpf_map_lookup_elem(&mrc_peer_seq, &peer_idx);
	reorder_account(peer_idx, psn, st, seq);

	/* Feedback: the peer tells us one of OUR paths delivered a packet
	 * we sent at fb_ts. */
	if (receipt && (mh->flags & MRC_F_FEEDBACK)) {
		__u32 fb = bpf_ntohs(mh->fb_path);
		struct mrc_path_live *fb_live;

		if (fb < peer->n_paths) {
			fb_live = path_live(peer_idx, fb);
			if (fb_live) {
				path_acked(fb_live, now,
					   now_us - bpf_ntohl(mh->fb_ts));
				delay_sample(peer_idx, fb, now_us,
					     bpf_ntohl(mh->fb_ts));
				health_peer_evidence(peer_idx, fb, fb_live, now,
						     true);
			}
		}
	}

	/* The second copy of a hedged unit's packet goes no further; it
	 * still counted as evidence above. */
	if ((mh->flags & MRC_F_HEDGE) && health_dedup(peer_idx, psn))
		return rx_drop(MRC_R_RX_DUPLICATE);

	/* 5. Decapsulate: keep the outer MACs, drop outer IP/UDP/MRC. */
	__builtin_memcpy(dmac, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(smac, eth->h_source, ETH_ALEN);
	overhead = l3_len + sizeof(*udp) + sizeof(*mh);
	if (bpf_xdp_adjust_head(ctx, overhead))
		return rx_drop(MRC_R_RX_DECAP_FAIL);

	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;
	if ((void *)(eth + 1) > data_end)
		return rx_drop(MRC_R_RX_DECAP_FAIL);
	__builtin_memcpy(eth->h_dest, dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, smac, ETH_ALEN);
	eth->h_proto = bpf_htons(ETH_P_IP);
	return XDP_PASS;
}

char _license[] SEC("license") = "Dual BSD/GPL";
