// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * mrc_tx: tc egress on the overlay device mrc0 (cls_bpf, direct-action).
 *
 * For each inner IPv4 or IPv6 packet to a known peer (its overlay address
 * or a prefix behind it, by longest prefix: peer.h): pick a path from the peer's
 * spray slot table (spray.h, judged by judge.h), reserve PSNs for the unit,
 * encapsulate it in outer Ethernet + IPv4/IPv6 + UDP + MRC (encap.h) and
 * redirect it out of the path's plane device; a suspect path's unit is
 * hedged onto a partner path (hedge.h).
 *
 * The spraying unit is the skb. A GSO super-packet (up to ~64 KB) is one
 * unit: adjust_room's encap flags mark it SKB_GSO_UDP_TUNNEL, so the
 * kernel's segmentation copies the outer headers (MRC header included) into
 * every wire segment and fixes their lengths. The MRC header therefore
 * describes the whole unit (psn, segs, seg_size, seq0) and the receiver
 * derives each segment's PSN from its inner TCP sequence number (a UDP GSO
 * unit: from its inner IPv4 ID, MRC_F_IPID; an inner IPv6 one has no ID and
 * goes out as one PSN, see mrc.h).
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/in.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "maps.h"
#include "parsing.h"
#include "encap.h"
#include "spray.h"
#include "judge.h"
#include "retx.h"
#include "feedback.h"
#include "hedge.h"
#include "pmtu.h"

/* Bytes we want linear before parsing: inner Ethernet, IPv4 with maximal
 * options (more than IPv6's 40 bytes), and the first 20 bytes of TCP. */
#define TX_PULL_LEN		(ETH_HLEN + 60 + 20)

/* When the chosen slot's path is unusable, try this many following slots. */
#define TX_PATH_RETRIES		8

/* tx_process's result when the unit goes out (not an enum mrc_reason). */
#define TX_SENT			MRC_R_MAX

/* Where the unit goes. */
struct tx_out {
	__u32	ifindex;
	bool	neigh;		/* resolve the next hop (path_via_neigh) */
};

/* The inner packet as mrc_tx uses it: scalars only (tx_parse_inner). */
struct tx_inner {
	struct l3_flow	fl;
	__u32	seq;		/* inner TCP: sequence number (host order) */
	__s32	tcp_len;	/* inner TCP header bytes; 0: unfragmented TCP
				 * whose header is cut short; -1: not TCP */
	__u16	hdr_len;	/* inner L3 header */
	__u16	ipid;		/* inner IPv4 ID (host order) */
	__u8	tos;		/* traffic class: DSCP << 2 | ECN */
	__u8	df;		/* may be answered with ICMP too-big: IPv4
				 * with DF, IPv6 (never fragmented on the way) */
	__u8	rsvd[2];
};

/*
 * 1. Inner Ethernet + IPv4 / IPv6, parsed once into scalars. The receiver
 * writes an untagged ethertype: a VLAN device on the overlay (tag in the
 * frame or, offloaded, in the skb) would lose its tag on the way, so it is
 * refused where it can be seen. Returns TX_SENT when the packet can be
 * carried, else the reason. A global function: the verifier walks the two
 * families' parsing once, not once per state of everything after it
 * (inlined, the family-dependent packet pointers took mrc_tx from 120k to
 * 650k verified instructions).
 */
__attribute__((noinline)) int tx_parse_inner(struct __sk_buff *skb, struct tx_inner *ti)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct hdr_cursor nh = { .pos = data };
	struct ethhdr *eth;
	struct tcphdr *tcph;
	struct l3_desc in;
	int proto, tcp_len;

	if (!ti)
		return MRC_R_TX_NOT_IPV4;
	proto = parse_ethhdr(&nh, data_end, &eth);
	if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD) ||
	    skb->vlan_present)
		return MRC_R_TX_VLAN;
	if (parse_l3(&nh, data_end, proto, L3_F_IPV4 | L3_F_IPV6 | L3_F_WHOLE, &in) != L3_OK)
		return MRC_R_TX_NOT_IPV4;
	l3_flow_of(&in, data_end, &ti->fl);
	ti->hdr_len = in.hdr_len;
	ti->tos = in.tos;
	ti->tcp_len = -1;
	ti->seq = 0;
	ti->ipid = 0;
	ti->df = 1;
	if (in.family == 4) {
		ti->ipid = bpf_ntohs(in.ip4->id);
		ti->df = !!(in.ip4->frag_off & bpf_htons(IPV4_DF));
	}
	if (in.proto == IPPROTO_TCP && in.frag == L3_FRAG_NONE) {
		tcp_len = parse_tcphdr(&nh, data_end, &tcph);
		ti->tcp_len = 0;
		if (tcp_len > 0) {
			ti->tcp_len = tcp_len;
			ti->seq = bpf_ntohl(tcph->seq);
		}
	}
	return TX_SENT;
}

/* Inner L3 bytes of the unit's largest wire segment: what, plus the outer
 * headers, must fit the path MTU (pmtu.h). */
static __always_inline __u32 tx_seg_l3(const struct __sk_buff *skb,
				       const struct tx_inner *ti)
{
	if (skb->gso_size) {
		if (ti->tcp_len > 0)
			return ti->hdr_len + ti->tcp_len + skb->gso_size;
		if (ti->fl.proto == IPPROTO_UDP)
			return ti->hdr_len + sizeof(struct udphdr) + skb->gso_size;
	}
	return skb->len - ETH_HLEN;
}

/* A path the judge accepted may still be too small for this unit: its
 * recorded MTU (pmtu.h) is below the unit's segments. */
static __always_inline bool tx_fits(__u32 peer_idx, __u32 pid,
				    const struct mrc_path *path, __u32 seg_l3,
				    __u64 now)
{
	return pmtu_fits(peer_idx, pid, seg_l3 + encap_overhead(path->family), now);
}

/* The unit does not fit the path it was given: tell the inner sender the
 * size the overlay carries to this peer (pmtu.h), from the overlay
 * device's ingress. */
static __always_inline __u32 tx_too_big(struct __sk_buff *skb,
					const struct mrc_config *cfg,
					__u32 peer_idx, __u32 n_paths, __u64 now,
					__u8 family, struct tx_out *out)
{
	__u32 mtu = pmtu_overlay(peer_idx, n_paths, now);

	if (!mtu || !cfg->overlay_ifindex ||
	    (family == 6 ? tx_icmp6_too_big(skb, mtu) : tx_icmp_too_big(skb, mtu)))
		return MRC_R_TX_TOO_BIG_DROP;
	out->ifindex = cfg->overlay_ifindex;
	out->neigh = false;
	return MRC_R_TX_TOO_BIG;
}

/* The slot walk's question for one slot: judge_pid(), except that while
 * skip_marked a path the peer said crosses a marking queue is passed over
 * (congest.h). A global function: a branch of its own in the walk doubled
 * the states the verifier explores. */
__attribute__((noinline)) int tx_judge_slot(__u32 peer_idx, __u32 pid, __u32 n_paths,
					    __u64 now, __u32 skip_marked)
{
	if (skip_marked && cong_marked(peer_idx, pid, now)) {
		HSTAT_INC(ecn_avoided);
		return H_UNUSABLE;
	}
	return judge_pid(peer_idx, pid, n_paths, now);
}

/* The slot walk (tx_walk): where it starts, what it chose. */
struct tx_pick {
	__u32	n;		/* in: the table's length (spray_table) */
	__u32	slot;		/* in: the first slot to try; out: the slot taken */
	__u32	pid;		/* out: its path */
	__s32	verdict;	/* out: the judge's verdict on it */
};

/* The path of slot pk->slot of the peer's live table `slots`, or of one
 * of the TX_PATH_RETRIES slots after it when that one is unusable: 1 and
 * *pk, or 0 when none is. A global function: the verifier walks the slots
 * once, not once per state of the parsing before it, and what follows
 * once, not once per slot the walk may stop at. */
__attribute__((noinline)) int tx_walk(__u32 peer_idx, __u32 n_paths, __u64 now,
				      const struct mrc_slots *slots, struct tx_pick *pk)
{
	__u32 i, n;

	if (!slots || !pk)
		return 0;
	n = pk->n;
	if (n < 1 || n > MRC_SLOTS)
		return 0;
	for (i = 0; i <= TX_PATH_RETRIES; i++) {
		__u32 s = (pk->slot + i) % n;
		__u32 pid = slots->slot[s & (MRC_SLOTS - 1)];
		int verdict = tx_judge_slot(peer_idx, pid, n_paths, now, i < CONG_SKIP_SLOTS);

		if (verdict >= 0 && path_cfg(peer_idx, pid)) {
			pk->slot = s;
			pk->pid = pid;
			pk->verdict = verdict;
			return 1;
		}
	}
	return 0;
}

/* Headers of locally generated packets are linear; forwarded ones may not
 * be. Pull only when short, pulling is not free. */
static __always_inline void tx_pull(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;

	if (data + TX_PULL_LEN > data_end && data_end - data < skb->len)
		bpf_skb_pull_data(skb, skb->len < TX_PULL_LEN ?
					   skb->len : TX_PULL_LEN);
}

static __always_inline __u32 tx_process(struct __sk_buff *skb, struct tx_out *out)
{
	struct tx_inner ti;
	struct mrc_config *cfg;
	struct mrc_peer *peer;
	struct mrc_peer_seq *seq;
	struct mrc_slots *slots;
	struct mrc_path *path = NULL;
	struct mrc_path_stats *st;
	struct mrc_unit u = {};
	const struct mrc_auth_key *akey;
	struct spray_state sp;
	struct tx_pick pk;
	__u32 peer_idx, n_paths, n, start, inner_hdrs, len, seg_l3, wire_segs = 1;
	__u64 now, wire_bytes;
	__u16 port;
	int pidx, err, verdict = H_UNUSABLE, hedge = -1;
	bool tcp, retx = false, steered = false;

	tx_pull(skb);
	/* 1. The inner packet (tx_parse_inner), its destination peer: the
	 * peer owning the address or the longest prefix holding it (peer.h). */
	err = tx_parse_inner(skb, &ti);
	if (err != TX_SENT)	/* the verifier knows a global's result as any value */
		return err == MRC_R_TX_VLAN ? MRC_R_TX_VLAN : MRC_R_TX_NOT_IPV4;
	pidx = peer_by_overlay(&ti.fl);
	if (pidx < 0)
		return MRC_R_TX_NO_PEER;
	peer_idx = pidx;
	cfg = cfg_get();
	peer = peer_get(peer_idx);
	seq = peer_seq(peer_idx);
	if (!cfg || !peer || !seq)
		return MRC_R_TX_NO_PEER;
	n_paths = peer->n_paths;
	if (n_paths > MRC_STRIDE)
		n_paths = MRC_STRIDE;

	/* Inner TCP: where the unit starts in the flow's sequence space, and
	 * whether it is a retransmission (retx.h). */
	inner_hdrs = ti.hdr_len;
	len = 0;	/* TCP payload of the unit */
	tcp = ti.tcp_len >= 0;
	if (ti.tcp_len > 0) {
		u.seq0 = ti.seq;
		inner_hdrs += ti.tcp_len;
		len = skb->len - ETH_HLEN - inner_hdrs;
		retx = retx_check(peer_idx, &ti.fl, u.seq0, len);
	}

	/* What must fit the path MTU (pmtu.h); whether the sender may be
	 * told to send smaller is ti.df. */
	seg_l3 = tx_seg_l3(skb, &ti);

	/* 2. Pick a path: the next slot of the live table, or one of the
	 * following slots if that path is not usable. */
	slots = spray_table(peer_idx, peer, &n);
	if (!slots)
		return MRC_R_TX_NO_PATH;
	now = bpf_ktime_get_ns();
	start = spray_start(&sp, peer, peer_idx, seq, &ti.fl, n, now);
	/* A retransmission goes out on the path that confirmed delivery
	 * most recently, if usable: a resend sprayed onto a plane that has
	 * just failed would be lost again (retx.h). */
	if (retx && seq->ack_max_ns) {
		/* read once: receive CPUs rewrite it meanwhile, and a second
		 * read could name another plane's path than the one judged
		 * (the receiver drops such a frame as MRC_R_RX_WRONG_PLANE) */
		__u32 fresh = *(volatile __u32 *)&seq->ack_max_path;

		path = retx_path_silent(peer_idx, fresh, now) ? NULL :
			judge_path(peer_idx, fresh, n_paths, now, &verdict);
		if (path) {
			u.path_id = fresh;	/* no slot walk below */
			steered = true;
			HSTAT_INC(retx_steered);
		}
	}
	pk.n = n;
	pk.slot = start;
	if (!path && tx_walk(peer_idx, n_paths, now, slots, &pk)) {
		u.path_id = pk.pid;
		verdict = pk.verdict;
		path = path_cfg(peer_idx, pk.pid);
		if (path)
			spray_used(&sp, pk.slot);
	}
	if (!path) {
		int fb = judge_fallback(peer_idx, n_paths, start,
					peer->min_active);

		if (fb < 0)
			return MRC_R_TX_NO_PATH;
		u.path_id = fb;
		path = path_cfg(peer_idx, fb);
		if (!path)
			return MRC_R_TX_NO_PATH;
		verdict = H_OK;
	}
	/* The path MTU (pmtu.h), checked once for the chosen path: a check
	 * inside the slot walk multiplied the verifier's states past its
	 * limit. */
	if (!tx_fits(peer_idx, u.path_id, path, seg_l3, now)) {
		if (!ti.df)
			return MRC_R_TX_TOO_BIG_DROP;
		return tx_too_big(skb, cfg, peer_idx, n_paths, now, ti.fl.family, out);
	}

	/* 3. The unit: how many wire packets (PSNs) it takes, and what the
	 * receiver needs to number the segments (inner TCP seq of the first
	 * one). Read gso_segs now: adjust_room resets it. */
	u.segs = skb->gso_segs ? skb->gso_segs : 1;
	u.seg_size = skb->gso_size;
	u.tos = ti.tos;	/* DSCP and ECN: RFC 6040 normal mode (bpf/ecn.h) */
	if (!tcp) {
		/* A UDP GSO unit's datagrams carry no offset; GSO gives
		 * segment i the inner IPv4 ID of the first plus i, so the
		 * receiver numbers them by it (without a distinct PSN each,
		 * hedged segments 2..n would be dropped as duplicates). */
		if (!skb->gso_segs && u.seg_size && ti.fl.proto == IPPROTO_UDP) {
			len = skb->len - ETH_HLEN - ti.hdr_len - sizeof(struct udphdr);
			u.segs = (len + u.seg_size - 1) / u.seg_size;
			if (u.segs < 1)
				u.segs = 1;
		}
		if (ti.fl.proto == IPPROTO_UDP)
			inner_hdrs += sizeof(struct udphdr);	/* repeated per segment */
		if (u.segs > 1 && ti.fl.family == 4) {
			u.seq0 = ti.ipid;
			u.flags |= MRC_F_IPID;
		} else if (u.segs > 1) {
			/* IPv6: no ID, nothing tells the segments apart; one
			 * PSN for the unit, never hedged (mrc.h) */
			wire_segs = u.segs;
			u.segs = 1;
		}
	} else if (ti.tcp_len > 0 && !skb->gso_segs && u.seg_size) {
		/* gso_segs may be unset on packets the stack marked for
		 * re-validation: derive it. */
		u.segs = (len + u.seg_size - 1) / u.seg_size;
		if (u.segs < 1)
			u.segs = 1;
	}
	u.tx_ts = (__u32)(now / 1000);
	u.epoch = (__u16)(peer->epoch ? peer->epoch : cfg->epoch);
	/* Auth: the inner block is read now, before adjust_room moves it. */
	akey = auth_key(peer_idx);
	if (akey) {
		u.key = *akey;
		u.flags |= MRC_F_AUTH;
		u.fl = ti.fl;
	}

	/* 4. Feedback for the peer (feedback.h), and hedging: a unit on a
	 * suspect path (or every unit, in duplicate-send mode) also goes
	 * out on a usable partner path. */
	feedback_pick(seq, peer_idx, n_paths, now, &u);
	if (wire_segs == 1 && ((cfg->flags & MRC_CFG_HEDGE_ALL) ||
	    (verdict == H_SUSPECT && (cfg->flags & MRC_CFG_HEDGE)))) {
		hedge = hedge_partner(peer_idx, n_paths, u.path_id,
				      HEDGE_FP(path->family, path->plane), now);
		/* a copy too big for the partner's recorded MTU would only
		 * bring another ICMP: no copy */
		if (hedge >= 0) {
			struct mrc_path *hp = path_cfg(peer_idx, hedge);

			if (!hp || !tx_fits(peer_idx, hedge, hp, seg_l3, now))
				hedge = -1;
		}
		if (hedge >= 0)
			u.flags |= MRC_F_HEDGE;
		else if (verdict == H_SUSPECT)
			HSTAT_INC(hedge_no_path);
	}
	u.path_seq = cong_tx_seq(peer_idx, u.path_id, u.flags & MRC_F_HEDGE);

	/* 5. Encapsulate; every wire segment repeats Ethernet, outer headers
	 * and inner IP/TCP headers. */
	port = cfg_udp_port(cfg);
	err = encap_push(skb, path, &u, port, &seq->psn);
	if (err == ENCAP_NESTED_GSO)
		return MRC_R_TX_NESTED_GSO;
	if (err)
		return MRC_R_TX_ENCAP_FAIL;
	if (wire_segs == 1)
		wire_segs = u.segs;
	wire_bytes = skb->len + (__u64)(wire_segs - 1) *
				(ETH_HLEN + encap_overhead(path->family) +
				 encap_mac_len(&u) + inner_hdrs);
	if (hedge >= 0)
		path = hedge_send(skb, peer_idx, path, hedge, &u, port, wire_bytes);

	/* 6. Count what goes on the wire. */
	st = path_stats(peer_idx, u.path_id);
	if (st) {
		st->tx_packets += wire_segs;
		if (steered)
			PCNT_INC(peer_idx, u.path_id, tx_steered, wire_segs);
		/* hedge_send moved the original to the partner: this is the copy */
		if (hedge >= 0 && u.path_id == (__u32)hedge)
			PCNT_INC(peer_idx, u.path_id, tx_hedged, wire_segs);
		st->tx_bytes += wire_bytes;
	}
	out->ifindex = path->ifindex;
	out->neigh = path_via_neigh(path);
	return TX_SENT;
}

/* The one exit: count a refusal under its reason, or send. A unit turned
 * into an ICMP for its sender is counted and goes back up the overlay. */
static __always_inline int tx_exit(__u32 reason, const struct tx_out *out)
{
	if (reason == MRC_R_TX_TOO_BIG) {
		count_reason(reason);
		return bpf_redirect(out->ifindex, BPF_F_INGRESS);
	}
	if (reason != TX_SENT) {
		count_reason(reason);
		return TC_ACT_SHOT;
	}
	if (out->neigh)
		return bpf_redirect_neigh(out->ifindex, NULL, 0, 0);
	return bpf_redirect(out->ifindex, 0);
}

SEC("tc")
int mrc_tx(struct __sk_buff *skb)
{
	struct tx_out out;

	return tx_exit(tx_process(skb, &out), &out);
}

char _license[] SEC("license") = "Dual BSD/GPL";
