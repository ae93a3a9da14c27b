/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Feedback echoes: each DATA unit tells the peer that one of the peer's
 * paths toward us delivered a packet it sent at fb_ts. The receive side
 * records receipts (feedback_receipt), the transmit side picks one to echo
 * (feedback_pick). The peer turns the echo into evidence (evidence.h).
 *
 * Without reverse data (one-way UDP, a TCP sender whose ACKs go another
 * way) nothing carries echoes: mrc_rx_tc then sends feedback frames of its
 * own (feedback_due, feedback_send), MRC_T_FEEDBACK with the echo, back
 * over the path the data came on, at most one per path per
 * FEEDBACK_FRAME_AFTER_NS and FEEDBACK_RL_RATE per peer.
 */
#ifndef MRC_FEEDBACK_H
#define MRC_FEEDBACK_H

#include <stdbool.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "mrc.h"
#include "path.h"
#include "encap.h"
#include "congest.h"
#include "auth.h"
#include "stats.h"
#include "config.h"

/* How many paths after the round-robin cursor to look at for one with a
 * receipt not yet echoed. */
#define FEEDBACK_ECHO_SCAN	16
/* Receipts older than this are not echoed: they say nothing current. */
#define FEEDBACK_FRESH_NS	1000000000ULL
/* A path whose receipts no reverse data and no feedback frame echoed for
 * this long gets a feedback frame with the next DATA unit it delivers. */
#define FEEDBACK_FRAME_AFTER_NS	1000000ULL
/* An echo whose receipt is this old when it leaves says MRC_F_EHELD. The
 * wait is the gap to the next reverse packet (an ACK after a batch, a busy
 * CPU), and an EV that carries little meets it at most of its few echoes:
 * read as delay, it looked like a queue of that EV's own and kept the EV
 * starved (mrcctl/agent/weights.py, standing_queues). */
#define FEEDBACK_HELD_NS	200000ULL
/* Feedback frames per peer: a GCRA bucket (as probe.h's, in
 * mrc_peer_seq.fb_rl_tat: a map of its own would be held by no attached
 * program while the planes use XDP, and vanish) of FEEDBACK_RL_RATE
 * frames/s, FEEDBACK_RL_BURST at once. */
#define FEEDBACK_RL_RATE	4096
#define FEEDBACK_RL_GAP_NS	(1000000000ULL / FEEDBACK_RL_RATE)
#define FEEDBACK_RL_BURST	32

/*
 * rx: a DATA wire packet arrived on the peer's path `live`. Every segment of
 * a unit carries the unit's header (PSN of its first segment, tx_ts,
 * feedback); the first segment of a unit to arrive is the receipt. Returns
 * true for it, with the clock read into *now: the others would only read
 * the clock again (a fifth of mrc_rx's cost in a VM) to record the same.
 */
static __always_inline bool feedback_receipt(struct mrc_path_live *live,
					     __u32 unit, __u32 tx_ts, __u64 *now)
{
	if (unit == live->last_rx_unit && live->last_rx_ns)
		return false;
	*now = bpf_ktime_get_ns();
	live->last_rx_ns = *now;
	live->last_rx_ts = tx_ts;
	live->last_rx_unit = unit;
	return true;
}

/*
 * tx: one of the peer's paths toward us and the tx_ts of the newest packet
 * received on it. Among the paths near the round-robin cursor with a
 * receipt not echoed yet, echo the one echoed *least recently* (else the
 * cursor's path, if fresh). Every path with receipts waits at most one
 * round of the others: when reverse packets are few (pure ACKs, one per
 * GSO unit on a tc plane), ordering by the newest receipt's send time
 * starved the busiest paths, whose newest receipt is always recent - a 3x
 * weighted plane went 20 ms without an echo and was retired in a transfer
 * without a fault. Each echo covers everything the path delivered, so
 * the round also bounds how far the peer's reference (judge.h) can move
 * past a path's delivered but unechoed packets.
 */
/* The scan of feedback_pick: the path to echo, or -1. One global function
 * with the loop open-coded, not bpf_loop: a callback is a call and a
 * return per step, and on this CPU a return costs tens of ns (SRSO's safe
 * RET; docs/benchmarks/hot-path.md). Global, so the verifier walks the 16
 * steps once, not once per state of mrc_tx (inlined: past its 1M limit). */
__attribute__((noinline)) int feedback_scan(__u32 peer_idx, __u32 n_paths, __u32 start,
					    __u64 now)
{
	struct mrc_path_live *l;
	__u64 pick_ns = 0;
	__u32 i, p;
	int pick = -1, first = -1;

	for (i = 0; i < FEEDBACK_ECHO_SCAN; i++) {
		if (i >= n_paths)
			break;
		p = start + i;	/* start < n_paths and i < n_paths */
		if (p >= n_paths)
			p -= n_paths;
		l = path_live(peer_idx, p);
		if (!l || !l->last_rx_ns ||
		    (__s64)(now - l->last_rx_ns) >= (__s64)FEEDBACK_FRESH_NS)
			continue;
		if (i == 0)
			first = p;
		if (l->fb_echoed != l->last_rx_ts &&
		    (pick < 0 || l->fb_echo_ns < pick_ns)) {
			pick = p;
			pick_ns = l->fb_echo_ns;
		}
	}
	return pick >= 0 ? pick : first;
}

static __always_inline void feedback_pick(struct mrc_peer_seq *seq,
					  __u32 peer_idx, __u32 n_paths,
					  __u64 now, struct mrc_unit *u)
{
	struct mrc_path_live *l;
	__u32 start;
	int p;

	if (n_paths == 0 || n_paths > MRC_STRIDE)
		return;
	/* The cursor only spreads the scan's starting point: a plain
	 * read-modify-write (two CPUs may start at the same path) and a
	 * compare instead of an atomic and a division, ~40 ns per unit
	 * less in this VM (benchmark: mrc_tx per-packet cost). */
	start = seq->fb_cursor < n_paths ? (__u32)seq->fb_cursor : 0;
	seq->fb_cursor = start + 1 < n_paths ? start + 1 : 0;
	p = feedback_scan(peer_idx, n_paths, start, now);
	if (p < 0)
		return;
	l = path_live(peer_idx, p);
	if (!l)
		return;
	u->flags |= MRC_F_FEEDBACK;
	u->flags |= cong_echo_flags(peer_idx, p, l->last_rx_ns);
	if (now - l->last_rx_ns >= FEEDBACK_HELD_NS)
		u->flags |= MRC_F_EHELD;
	u->fb_path = p;
	u->fb_ts = l->last_rx_ts;
	l->fb_echoed = u->fb_ts;
	l->fb_echo_ns = now;
}

/* rx: does the DATA unit just received on the peer's path `live` (its
 * receipt taken at now) call for a feedback frame? Only when the
 * instance sends them, and neither reverse data nor a feedback frame
 * echoed this path for FEEDBACK_FRAME_AFTER_NS. */
static __always_inline bool feedback_due(const struct mrc_config *cfg,
					 const struct mrc_path_live *live, __u64 now)
{
	return (cfg->flags & MRC_CFG_FB_FRAMES) &&
	       now - live->fb_echo_ns > FEEDBACK_FRAME_AFTER_NS &&
	       now - live->fb_frame_ns > FEEDBACK_FRAME_AFTER_NS;
}

/* Swap the frame's MACs and outer addresses (its own inverse; IPv4's
 * checksum does not change). -1 if the headers are not in the buffer. */
static __always_inline int feedback_flip(void *data, void *data_end, __u32 l3_off,
					 __u32 family)
{
	struct ethhdr *eth = data;
	__u8 mac[ETH_ALEN];

	if ((void *)(eth + 1) > data_end)
		return -1;
	if (family == 4) {
		struct iphdr *iph = data + l3_off;
		__be32 a;

		if ((void *)(iph + 1) > data_end)
			return -1;
		a = iph->saddr;
		iph->saddr = iph->daddr;
		iph->daddr = a;
	} else {
		struct ipv6hdr *ip6h = data + l3_off;
		struct in6_addr a;

		if ((void *)(ip6h + 1) > data_end)
			return -1;
		a = ip6h->saddr;
		ip6h->saddr = ip6h->daddr;
		ip6h->daddr = a;
	}
	__builtin_memcpy(mac, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, mac, ETH_ALEN);
	return 0;
}

/*
 * tc ingress: send a feedback frame for the DATA frame in skb, received on
 * the peer's path path_id, then leave skb as it was for delivery. The
 * frame is the received one turned around (MACs and addresses swapped,
 * ports kept, so it leaves as our own frame on that path would: source
 * port the EV, to the MRC port), typed MRC_T_FEEDBACK and echoing the
 * unit's tx_ts for path_id; bpf_clone_redirect sends a copy out of the plane (and leaves our head
 * private), then the headers are put back. The copy carries the unit's
 * payload as trailing bytes the peer never reads: a clone cannot be
 * shortened, and the direction it travels is the one one-way traffic
 * leaves idle. Not toward an authenticated peer: the frame would need a
 * new MAC, and the SipHash state does not fit the stack left to a function
 * called from mrc_rx_tc (512 bytes in all); such a peer's one-way flows
 * keep relying on the agent's probes. l3_off: the outer IP header (IPv4 without options:
 * validate.h refuses them), then UDP and the MRC header. 0 if sent, else
 * < 0; -2: the frame could not be put back, the caller drops it. A global
 * function: verified once.
 */
__attribute__((noinline)) int feedback_send(struct __sk_buff *skb, __u32 l3_off,
					    __u32 family, __u32 peer_idx, __u32 path_id)
{
	struct mrc_path_live *live = path_live(peer_idx, path_id);
	struct mrc_hstats *hs = health_stats();
	struct mrc_hdr *mh;
	void *data, *data_end;
	struct mrc_peer_seq *seq;
	__u64 now = bpf_ktime_get_ns(), t;
	__u32 mh_off = l3_off + (family == 4 ? 20 : 40) + sizeof(struct udphdr);
	__be32 tx_ts, fb_ts;
	__be16 pid;
	__u8 ver_type, flags, fb_path;
	int ret = -1;

	if (l3_off > ETH_HLEN + 4 || !live || auth_key(peer_idx))
		return -1;
	seq = peer_seq(peer_idx);
	if (!seq)
		return -1;
	t = seq->fb_rl_tat < now ? now : seq->fb_rl_tat;
	if (t - now > (FEEDBACK_RL_BURST - 1) * FEEDBACK_RL_GAP_NS) {
		if (hs)
			hs->fb_limited += 1;
		return -1;
	}
	seq->fb_rl_tat = t + FEEDBACK_RL_GAP_NS;
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	mh = data + mh_off;
	if ((void *)(mh + 1) > data_end || feedback_flip(data, data_end, l3_off, family))
		return -1;
	/* what the frame said, put back after the copy left */
	ver_type = mh->ver_type;
	flags = mh->flags;
	pid = mh->path_id;
	tx_ts = mh->tx_ts;
	fb_path = mh->fb_path;
	fb_ts = mh->fb_ts;

	mh->ver_type = (MRC_VERSION << MRCH_VERSION_SHIFT) | MRC_T_FEEDBACK;
	mh->flags = MRC_F_FEEDBACK | cong_echo_flags(peer_idx, path_id, live->last_rx_ns);
	mh->fb_path = (__u8)bpf_ntohs(pid);
	mh->fb_ts = tx_ts;
	mh->tx_ts = bpf_htonl((__u32)(now / 1000));
	if (bpf_clone_redirect(skb, skb->ifindex, 0) >= 0) {
		live->fb_frame_ns = now;
		if (hs)
			hs->fb_frames += 1;
		ret = 0;
	}
	/* put the frame back (the clone made our head private) */
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	mh = data + mh_off;
	if ((void *)(mh + 1) > data_end || feedback_flip(data, data_end, l3_off, family))
		return -2;
	mh->ver_type = ver_type;
	mh->flags = flags;
	mh->fb_path = fb_path;
	mh->fb_ts = fb_ts;
	mh->tx_ts = tx_ts;
	return ret;
}

#endif /* MRC_FEEDBACK_H */
