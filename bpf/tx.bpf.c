// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * mrc_tx: tc egress on the overlay device mrc0 (cls_bpf, direct-action).
 *
 * For each inner IPv4 packet to a known peer: pick a path from the peer's
 * spray slot table, reserve PSNs for the unit, grow the packet with
 * bpf_skb_adjust_room() and write outer Ethernet + IPv4/IPv6 + UDP + MRC,
 * then redirect it out of the path's plane device.
 *
 * The spraying unit is the skb. A GSO super-packet (up to ~64 KB) is one
 * unit: adjust_room's encap flags mark it SKB_GSO_UDP_TUNNEL, so the
 * kernel's segmentation copies the outer headers (MRC header included) into
 * every wire segment and fixes their lengths. The MRC header therefore
 * describes the whole unit (psn, segs, seg_size, seq0) and the receiver
 * derives each segment's PSN from its inner TCP sequence number.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/in.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "mrc.h"
#include "maps.h"
#include "parsing.h"
#include "csum.h"
#include "encap.h"
#include "stats.h"
#include "spray.h"
#include "health.h"

/* Bytes we want linear before parsing: inner Ethernet, IPv4 with maximal
 * options, and the first 20 bytes of TCP. */
#define TX_PULL_LEN		(14 + 60 + 20)

/* When the chosen slot's path is unusable, try this many following slots. */
#define TX_PATH_RETRIES		8

static __always_inline int tx_drop(__u32 reason)
{
	count_drop(reason);
	return TC_ACT_SHOT;
}

/*
 * Can the next unit go out on path `pid`: configured, not denied by the
 * operator, and GOOD by the liveness judgement of bpf/health.h, which may
 * retire the path right here (H_UNUSABLE) or call it suspect (H_SUSPECT:
 * usable, hedged if hedging is on). Returns the path, its verdict in
 * *verdict, or NULL.
 */
static __always_inline struct mrc_path *
usable_path(const struct mrc_config *cfg, const struct mrc_peer *peer,
	    __u32 peer_idx, __u32 pid, __u32 n_paths, __u64 now, int *verdict)
{
	__u32 idx = MRC_PATH_IDX(peer_idx, pid & (MRC_MAX_PATHS - 1));
	struct mrc_path *path;
	struct mrc_path_live *live;

	if (pid >= n_paths)
		return NULL;
	path = bpf_map_lookup_elem(&mrc_paths, &idx);
	live = bpf_map_lookup_elem(&mrc_live, &idx);
	if (!path || !live || path->ifindex == 0 ||
	    (path->family != 4 && path->family != 6) ||
	    path->admin == MRC_PATH_DENIED)
		return NULL;
	*verdict = health_judge(cfg, peer, peer_idx, pid, live, now);
	return *verdict >= 0 ? path : NULL;
}

SEC("tc")
int mrc_tx(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct hdr_cursor nh;
	struct ethhdr *eth;
	struct iphdr *iph;
	struct tcphdr *tcph;
	struct mrc_config *cfg;
	struct mrc_peer *peer;
	struct mrc_peer_seq *seq;
	struct mrc_slots *slots;
	struct mrc_path *path = NULL;
	struct mrc_path_stats *st;
	struct mrc_unit u = {};
	struct spray_state sp;
	__u32 zero = 0, peer_idx, n_paths, n, start, idx, i;
	__u32 inner_hdrs, overhead, port, len;
	__u64 now, flags;
	__u32 *pidx;
	int proto, tcp_len = -1, verdict = H_UNUSABLE, hedge = -1;
	bool tcp, retx = false, steered = false;

	/* Headers of locally generated packets are linear; forwarded ones
	 * may not be. Pull only when short, pulling is not free. */
	if (data + TX_PULL_LEN > data_end && data_end - data < skb->len) {
		bpf_skb_pull_data(skb, skb->len < TX_PULL_LEN ?
					   skb->len : TX_PULL_LEN);
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
	}

	/* 1. Inner Ethernet + IPv4, destination peer. */
	nh.pos = data;
	if (parse_ethhdr(&nh, data_end, &eth) != bpf_htons(ETH_P_IP))
		return tx_drop(MRC_R_TX_NOT_IPV4);
	proto = parse_iphdr(&nh, data_end, &iph);
	if (proto < 0)
		return tx_drop(MRC_R_TX_NOT_IPV4);

	pidx = bpf_map_lookup_elem(&mrc_peer_ip, &iph->daddr);
	if (!pidx)
		return tx_drop(MRC_R_TX_NO_PEER);
	peer_idx = *pidx;
	if (peer_idx >= MRC_MAX_PEERS)
		return tx_drop(MRC_R_TX_NO_PEER);

	cfg = bpf_map_lookup_elem(&mrc_cfg, &zero);
	peer = bpf_map_lookup_elem(&mrc_peers, &peer_idx);
	seq = bpf_map_lookup_elem(&mrc_peer_seq, &peer_idx);
	if (!cfg || !peer || !seq || peer->n_paths == 0)
		return tx_drop(MRC_R_TX_NO_PEER);
	n_paths = peer->n_paths;
	if (n_paths > MRC_MAX_PATHS)
		n_paths = MRC_MAX_PATHS;

	/* Inner TCP: where the unit starts in the flow's sequence space, and
	 * whether it is a retransmission (bpf/health.h). */
	inner_hdrs = iph->ihl * 4;
	len = 0;	/* TCP payload of the unit */
	tcp = proto == IPPROTO_TCP && !(iph->frag_off & bpf_htons(0x3fff));
	if (tcp)
		tcp_len = parse_tcphdr(&nh, data_end, &tcph);
	if (tcp_len > 0) {
		u.seq0 = bpf_ntohl(tcph->seq);
		inner_hdrs += tcp_len;
		len = skb->len - ETH_HLEN - inner_hdrs;
		retx = health_tcp_retx(peer_idx, iph, tcph, u.seq0, len);
	}

	/* 2. Pick a path: the next slot of the live table, or one of the
	 * following slots if that path is not usable. */
	idx = peer_idx * 2 + (peer->table & 1);
	slots = bpf_map_lookup_elem(&mrc_slots, &idx);
	if (!slots)
		return tx_drop(MRC_R_TX_NO_PATH);
	n = slots->n;
	if (n < 1)
		n = 1;
	if (n > MRC_SLOTS)
		n = MRC_SLOTS;

	now = bpf_ktime_get_ns();
	/* The starting slot depends on the spray mode: bpf/spray.h. */
	start = spray_start(&sp, peer, peer_idx, seq, iph, data_end, n, now);
	/* A retransmission goes out on the path that confirmed delivery
	 * most recently, if usable: a resend sprayed onto a plane that has
	 * just failed would be lost again (bpf/health.h). */
	if (retx && seq->ack_max_ns) {
		path = usable_path(cfg, peer, peer_idx, seq->ack_max_path,
				   n_paths, now, &verdict);
		if (path) {
			u.path_id = seq->ack_max_path;	/* no slot walk below */
			steered = true;
			health_count_retx();
		}
	}
	for (i = path ? TX_PATH_RETRIES + 1 : 0; i <= TX_PATH_RETRIES; i++) {
		__u32 s = (start + i) % n;
		__u32 pid = slots->slot[s & (MRC_SLOTS - 1)];

		path = usable_path(cfg, peer, peer_idx, pid, n_paths, now,
				   &verdict);
		if (path) {
			u.path_id = pid;
			spray_used(&sp, s);
			break;
		}
	}
	if (!path) {
		/* Nothing usable near the cursor: bpf/health.h. */
		int fb = health_fallback(peer_idx, n_paths, start,
					 peer->min_active);

		if (fb < 0)
			return tx_drop(MRC_R_TX_NO_PATH);
		u.path_id = fb;
		idx = MRC_PATH_IDX(peer_idx, fb & (MRC_MAX_PATHS - 1));
		path = bpf_map_lookup_elem(&mrc_paths, &idx);
		if (!path)
			return tx_drop(MRC_R_TX_NO_PATH);
		verdict = H_OK;
	}

	/* 3. The unit: how many wire packets (PSNs) it takes, and what the
	 * receiver needs to number the segments (inner TCP seq of the first
	 * one). Read gso_segs now: adjust_room resets it. */
	u.segs = skb->gso_segs ? skb->gso_segs : 1;
	u.seg_size = skb->gso_size;
	u.tos = iph->tos & 0xfc;	/* DSCP only: we do not propagate ECN */
	if (!tcp) {
		u.seg_size = 0;	/* receiver numbers TCP segments only */
	} else if (tcp_len > 0 && !skb->gso_segs && u.seg_size) {
		/* gso_segs may be unset on packets the stack marked for
		 * re-validation: derive it. */
		u.segs = (len + u.seg_size - 1) / u.seg_size;
		if (u.segs < 1)
			u.segs = 1;
	}
	u.tx_ts = (__u32)(now / 1000);

	/* 4. Feedback: echo the newest receive timestamp of one of the
	 * peer's paths toward us, oldest unechoed receipt first. */
	health_pick_echo(seq, peer_idx, n_paths, now, &u);

	/* Hedging: a unit on a suspect path (or every unit, in
	 * duplicate-send mode) also goes out on a GOOD partner path. */
	if ((cfg->flags & MRC_CFG_HEDGE_ALL) ||
	    (verdict == H_SUSPECT && (cfg->flags & MRC_CFG_HEDGE))) {
		hedge = health_hedge_partner(cfg, peer_idx, n_paths, u.path_id,
					     path, now);
		if (hedge >= 0)
			u.flags |= MRC_F_HEDGE;
	}

	/* 5. Encapsulate. FIXED_GSO keeps gso_size (the overlay MTU already
	 * leaves room for the overhead); ENCAP_* tell the GSO layer where the
	 * outer L3/L4 and our "L2" (the MRC header) are, so segmentation
	 * replicates them. */
	port = cfg->udp_port ? cfg->udp_port : MRC_DEFAULT_UDP_PORT;
	flags = BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L4_UDP |
		BPF_F_ADJ_ROOM_ENCAP_L2(MRC_HDR_LEN);
	if (path->family == 4) {
		overhead = MRC_OVERHEAD_V4;
		flags |= BPF_F_ADJ_ROOM_ENCAP_L3_IPV4;
	} else {
		overhead = MRC_OVERHEAD_V6;
		flags |= BPF_F_ADJ_ROOM_ENCAP_L3_IPV6;
	}
	if (bpf_skb_adjust_room(skb, overhead, BPF_ADJ_ROOM_MAC, flags))
		return tx_drop(MRC_R_TX_ENCAP_FAIL);

	/* Reserve the unit's PSNs only now that it will be sent: a PSN
	 * burnt on a failed encap would look like loss to the receiver. */
	u.psn = __sync_fetch_and_add(&seq->psn, u.segs);

	/* adjust_room invalidated every packet pointer: start over. */
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	len = skb->len;
	eth = data;
	if (path->family == 4) {
		struct iphdr *oip = (void *)(eth + 1);
		struct udphdr *udp = (void *)(oip + 1);
		struct mrc_hdr *mh = (void *)(udp + 1);

		if ((void *)(mh + 1) > data_end)
			return tx_drop(MRC_R_TX_ENCAP_FAIL);
		write_eth(eth, path, ETH_P_IP);
		write_ipv4(oip, path, len - ETH_HLEN, &u);
		write_udp(udp, path->ev, port,
			  len - ETH_HLEN - sizeof(*oip));
		write_mrc(mh, MRC_T_DATA, &u);
	} else {
		struct ipv6hdr *oip6 = (void *)(eth + 1);
		struct udphdr *udp = (void *)(oip6 + 1);
		struct mrc_hdr *mh = (void *)(udp + 1);

		if ((void *)(mh + 1) > data_end)
			return tx_drop(MRC_R_TX_ENCAP_FAIL);
		write_eth(eth, path, ETH_P_IPV6);
		write_ipv6(oip6, path, len - ETH_HLEN - sizeof(*oip6), &u);
		write_udp(udp, path->ev, port,
			  len - ETH_HLEN - sizeof(*oip6));
		write_mrc(mh, MRC_T_DATA, &u);
	}

	if (hedge >= 0)
		path = health_hedge(skb, peer_idx, path, hedge, &u, port,
				    len + (__u64)(u.segs - 1) *
					  (ETH_HLEN + overhead + inner_hdrs));

	/* 6. Count what goes on the wire: every segment repeats Ethernet,
	 * outer headers and inner IP/TCP headers. */
	st = path_stats(peer_idx, u.path_id);
	if (st) {
		st->tx_packets += u.segs;
		if (steered)
			st->tx_steered += u.segs;
		st->tx_bytes += len + (__u64)(u.segs - 1) *
					      (ETH_HLEN + overhead + inner_hdrs);
	}

	/* An all-zero destination MAC means "resolve through the neighbour
	 * table" (routed underlay, next hop not known to the agent). */
	if (!(path->dmac[0] | path->dmac[1] | path->dmac[2] |
	      path->dmac[3] | path->dmac[4] | path->dmac[5]))
		return bpf_redirect_neigh(path->ifindex, NULL, 0, 0);
	return bpf_redirect(path->ifindex, 0);
}

char _license[] SEC("license") = "Dual BSD/GPL";
