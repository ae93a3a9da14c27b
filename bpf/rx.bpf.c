// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * mrc_rx: XDP on a plane device; mrc_rx_tc: the same steps at tc ingress
 * (plane[].rx_hook). The tc hook exists because native XDP on a veth turns
 * TSO off on its peer: the sender then segments every unit in software and
 * the receiver handles one wire segment per packet. At tc ingress a whole
 * GSO unit arrives as one skb and leaves decapsulated, still one skb.
 *
 * Frames that are not mrc's leave untouched with XDP_PASS. MRC frames are
 * validated (validate.h: each failure dropped and counted under its enum
 * mrc_reason), counted per path, probes are answered in place with XDP_TX,
 * probe replies and feedback echoes become evidence about our own paths
 * (evidence.h), and DATA is accounted (reorder.h), de-duplicated when hedged
 * (dedup.h) and decapsulated (encap.h): the kernel receives the inner
 * packet on the plane device (XDP_PASS).
 *
 * rx_process is hook-neutral; rx_exit (XDP) and rx_exit_tc carry out its
 * verdict, and rx_count counts it for both.
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "maps.h"
#include "parsing.h"
#include "encap.h"
#include "validate.h"
#include "feedback.h"
#include "evidence.h"
#include "reorder.h"
#include "dedup.h"
#include "epoch.h"
#include "ecn.h"
#include "acl.h"
#include "pmtu.h"

/* A probe reply: an RTT sample and maybe a recovery for our path. */
static __always_inline __u32 rx_probe_reply(const struct mrc_config *cfg,
					    __u32 peer_idx, __u32 path_id,
					    struct mrc_path_live *live,
					    const struct mrc_hdr *mh)
{
	__u64 now;
	__u32 now_us;

	/* Only a reply to a probe we sent changes state. */
	if (!probe_reply_genuine(peer_idx, path_id, mh))
		return RX_V(RX_DROP, MRC_R_RX_BAD_NONCE);
	now = bpf_ktime_get_ns();
	now_us = (__u32)(now / 1000);
	evidence_probe_reply(cfg, peer_idx, path_id, live, bpf_ntohl(mh->psn),
			     now_us - bpf_ntohl(mh->tx_ts), now);
	PCNT_INC(peer_idx, path_id, probes_rx, 1);
	return RX_V(RX_DROP, MRC_R_RX_PROBE_REPLY);
}

/* The inner packet of a DATA frame as the rest of rx_process uses it:
 * scalars, read once right after the parse. Family-dependent packet
 * pointers kept through the rest of the program multiplied the verifier's
 * states (mrc_rx_tc went from 107k to 166k verified instructions). */
struct rx_inner {
	struct l3_flow	fl;	/* addresses, protocol, ports: owner check, MAC */
	__u32	tcp_seq;	/* inner TCP sequence number (host order), if seq_ok */
	__u32	tcp_off;	/* bytes from data to the inner TCP header, if
				 * tcp_end */
	__u32	tcp_end;	/* bytes from data to the end of the inner TCP
				 * header; 0: no whole TCP header in the frame */
	__u16	ipid;		/* inner IPv4 ID (host order); 0 for IPv6 */
	__u8	tos;		/* inner traffic class: DSCP << 2 | ECN */
	__u8	seq_ok;		/* inner TCP with its sequence number in the frame */
};

static __always_inline void rx_inner_of(const struct l3_desc *in, void *data, void *data_end,
					struct rx_inner *ri)
{
	struct tcphdr *tcph = in->l4;

	l3_flow_of(in, data_end, &ri->fl);
	ri->tos = in->tos;
	ri->ipid = in->family == 4 ? bpf_ntohs(in->ip4->id) : 0;
	ri->tcp_seq = 0;
	ri->tcp_off = 0;
	ri->tcp_end = 0;
	ri->seq_ok = 0;
	if (in->proto != IPPROTO_TCP)
		return;
	if ((void *)tcph + 8 <= data_end) {
		ri->tcp_seq = bpf_ntohl(tcph->seq);
		ri->seq_ok = 1;
	}
	if ((void *)(tcph + 1) <= data_end) {
		ri->tcp_off = (void *)tcph - data;
		ri->tcp_end = ri->tcp_off + tcph->doff * 4;
	}
}

/* The inner packet at offset off of the frame (behind the MRC header and
 * the MAC the frame says it has), IPv4 or IPv6 by its version nibble, into
 * ri; 1 if it is either, else 0. Global functions, one per hook (a global
 * takes the context, not packet pointers), so the verifier walks the two
 * families' parsing once, not once per state of the receive path around it. */
#define RX_INNER_OFF_MAX	256	/* bounds off for the verifier: the outer
					 * headers and a MAC are far less */
static __always_inline int rx_inner_parse(void *data, void *data_end, __u32 off,
					  struct rx_inner *ri)
{
	struct hdr_cursor nh;
	struct l3_desc in;

	if (!ri || off > RX_INNER_OFF_MAX)
		return 0;
	nh.pos = data + off;
	if (parse_l3(&nh, data_end, l3_inner_proto(nh.pos, data_end),
		     L3_F_IPV4 | L3_F_IPV6, &in) != L3_OK)
		return 0;
	rx_inner_of(&in, data, data_end, ri);
	return 1;
}

__attribute__((noinline)) int rx_inner_xdp(struct xdp_md *ctx, __u32 off, struct rx_inner *ri)
{
	return rx_inner_parse((void *)(long)ctx->data, (void *)(long)ctx->data_end, off, ri);
}

__attribute__((noinline)) int rx_inner_tc(struct __sk_buff *skb, __u32 off, struct rx_inner *ri)
{
	return rx_inner_parse((void *)(long)skb->data, (void *)(long)skb->data_end, off, ri);
}

/* Wire PSN of this segment: the unit's PSN plus the segment's index,
 * recovered from the inner TCP sequence number (IPv4 or IPv6), or for a
 * non-TCP unit (UDP GSO: no offset in the datagrams) from the inner IPv4
 * ID, which GSO advances by one per segment (an IPv6 one is sent as one
 * PSN, segs 1: mrc.h). */
static __always_inline __u32 rx_wire_psn(const struct mrc_hdr *mh, const struct rx_inner *ri)
{
	__u32 psn = bpf_ntohl(mh->psn), segs = bpf_ntohs(mh->segs);

	if (segs <= 1)
		return psn;
	if (mh->flags & MRC_F_IPID) {
		__u16 i = ri->ipid - (__u16)bpf_ntohl(mh->seq0);

		/* garbage beyond the unit: leave the unit's PSN */
		if (ri->fl.family == 4 && i < segs)
			psn += i;
	} else if (bpf_ntohs(mh->seg_size) > 0 && ri->seq_ok) {
		__u32 off = ri->tcp_seq - bpf_ntohl(mh->seq0);
		__u32 i = off / bpf_ntohs(mh->seg_size);

		if (i < segs)
			psn += i;
	}
	return psn;
}

/* Several wire segments of one unit in one buffer (a GSO skb at tc
 * ingress): every one of their PSNs is accounted as if it had arrived
 * alone. Run by bpf_loop so the verifier walks one segment, not 64. */
struct rx_segs {
	__u32	peer_idx;
	__u32	path_id;
	__u32	psn;		/* the first segment's wire PSN */
	bool	hedged;
	bool	first_seen;	/* dedup_seen() had seen the first segment */
};

/* reorder_account() as a global function: verified once, not once per
 * caller (the loop callback and the single-segment case) and per state of
 * each (its window loops are most of what the verifier walks). */
__attribute__((noinline)) int rx_reorder(__u32 peer_idx, __u32 path_id, __u32 psn)
{
	return reorder_account(peer_idx, path_id, psn, peer_seq(peer_idx));
}

static long rx_seg_account(__u64 i, void *ctx)
{
	struct rx_segs *r = ctx;
	struct mrc_path_stats *st = path_stats(r->peer_idx, r->path_id);

	if (!st)
		return 1;
	rx_reorder(r->peer_idx, r->path_id, r->psn + (__u32)i);
	if (r->hedged) {
		/* every segment is marked; the first one's verdict decides */
		bool seen = dedup_seen(r->peer_idx, r->psn + (__u32)i);

		if (i == 0)
			r->first_seen = seen;
	}
	return 0;
}

/* What the PSN accounting makes of a DATA frame's n wire packets. */
enum rx_acc {
	RX_ACC_NEW	= 0,	/* deliver */
	RX_ACC_DUP	= 1,	/* the second copy of a hedged unit: drop */
	RX_ACC_AHEAD	= 2,	/* hedged, too far ahead to mark: deliver, count */
};
#define RX_ACC_HEDGED	0x10000	/* with the 16-bit epoch in rx_account's last argument */

/*
 * Reordering hints, duplicates and loss of the wire packets psn..psn+n-1,
 * within the sender's current epoch only (bpf/epoch.h); how far ahead of
 * the window a hedged copy was bounds what dedup may mark.
 *
 * A buffer of several segments (tc ingress) is a duplicate if its first
 * PSN was seen: the copy whose compare-and-swap marks that PSN owns the
 * unit. The two copies of a hedged unit are the same buffer, but they
 * arrive on two planes and may be marked on two CPUs at once, their loops
 * interleaved; had each been a duplicate only if all its segments were,
 * both would have been delivered (seen under a busy CPU, see
 * docs/developing-datapath.md). Only buffers cut
 * differently from the same unit (one plane's XDP against another's tc)
 * can lose by this: a copy dropped for its first segment while the rest
 * of the owner's segments are still on a path that then fails, which TCP
 * retransmits.
 *
 * Part of rx_data, which the verifier walks once; the window's own loops
 * are rx_reorder's.
 */
static __always_inline int rx_account(__u32 peer_idx, __u32 path_id, __u32 psn,
					 __u32 n, __u32 epoch_hedged)
{
	struct mrc_path_stats *st = path_stats(peer_idx, path_id);
	bool hedged = epoch_hedged & RX_ACC_HEDGED, mark;
	__u32 ahead = 0;

	if (!st || !epoch_current(peer_idx, (__u16)epoch_hedged))
		return RX_ACC_NEW;
	if (hedged)
		ahead = reorder_ahead(peer_idx, psn);
	mark = hedged && ahead <= DEDUP_AHEAD;
	if (n > 1) {
		struct rx_segs r = {
			.peer_idx = peer_idx, .path_id = path_id, .psn = psn, .hedged = mark,
		};

		bpf_loop(n, rx_seg_account, &r, 0);
		if (mark && r.first_seen)
			return RX_ACC_DUP;
	} else {
		rx_reorder(peer_idx, path_id, psn);
		if (mark && dedup_seen(peer_idx, psn))
			return RX_ACC_DUP;
	}
	return hedged && !mark ? RX_ACC_AHEAD : RX_ACC_NEW;
}

/* evidence_echo() for the peer of peer_idx. */
static __always_inline int rx_echo(__u32 peer_idx, __u32 fb, __u32 fb_ts, __u8 flags,
				   __u64 now)
{
	struct mrc_peer *peer = peer_get(peer_idx);

	if (peer)
		evidence_echo(peer_idx, peer, fb, fb_ts, flags, now, (__u32)(now / 1000));
	return 0;
}

/* How many wire segments a buffer of inner TCP holds: its payload in
 * seg_size pieces, never more than the unit has left from index first. */
static __always_inline __u32 rx_seg_count(const struct mrc_hdr *mh,
					  const struct rx_inner *ri, __u32 len, __u32 first,
					  __u32 *hdrs_out)
{
	__u32 hdrs = ri->tcp_end, payload, n, segs = bpf_ntohs(mh->segs);
	__u16 seg_size = bpf_ntohs(mh->seg_size);

	if (segs <= 1 || !seg_size || !hdrs || first >= segs)
		return 1;
	if (len <= hdrs)
		return 1;
	payload = len - hdrs;
	*hdrs_out = hdrs;
	n = (payload + seg_size - 1) / seg_size;
	if (n > segs - first)
		n = segs - first;
	return n ? n : 1;
}

/* RFC 6040's ECN into the inner header at ip (IPv4 or IPv6: both write
 * within its first 20 bytes). */
static __always_inline void rx_ecn_set(void *ip, void *data_end, const struct rx_inner *ri,
				       __u8 ecn)
{
	struct l3_desc d = { .hdr = ip, .family = ri->fl.family, .tos = ri->tos };

	if (ip + sizeof(struct iphdr) <= data_end)
		ecn_set(&d, ecn);
}

/* What rx_data needs of a frame rx_validate passed, and what it tells the
 * exit: scalars only (a global function takes no packet pointers, and
 * spilled pointers in memory it is given would be lost to the caller). */
struct rx_data {
	__u32	mh_off;		/* in: bytes from data to the MRC header */
	__u32	len;		/* in: the frame's bytes */
	__u32	peer_idx;	/* in */
	__u32	plane;		/* in: the plane's index for the peer */
	__u16	udp_len;	/* in: the outer UDP length (host order) */
	__u8	type;		/* in: the MRC type */
	__u8	outer_tos;	/* in: the outer traffic class */
	__u8	multi;		/* in: the buffer may hold several wire segments */
	__u8	mac_len;	/* out: 0 or MRC_AUTH_LEN */
	__u8	inner_family;	/* out: DATA's inner family, 4 or 6 */
	__u8	fb_due;		/* out: send a feedback frame for fb_path (tc) */
	__u16	fb_path;	/* out */
	__u8	rsvd[2];
};

/* The outer headers before the MRC header are far less. */
#define RX_MH_OFF_MAX		128

/* Everything after validation: auth, probes, replies, feedback and DATA.
 * multi: the buffer may hold several wire segments of one unit (a GSO skb;
 * constant false for XDP, which then carries none of that code); tc: also
 * that the exit can send a feedback frame besides delivering (XDP cannot). */
static __always_inline __u32 rx_data_body(void *ctx, bool tc, bool multi,
					  const struct mrc_config *cfg, struct mrc_peer *peer,
					  struct rx_data *d)
{
	void *data, *data_end;
	const struct mrc_auth_key *auth;
	struct rx_inner ri;
	struct mrc_path_live *live;
	struct mrc_path_stats *st;
	struct mrc_hdr *mh;
	struct mrc_path *pcfg;
	__u32 peer_idx, path_id, plane, type, len, psn, v;
	__u32 done = RX_NOT_COUNTED;	/* reason a delivered frame counts */
	__u32 n = 1, hdrs = 0;
	int ecn, acc;
	__u64 now = 0;
	bool receipt, inner_ok = false;

	if (tc) {
		data = (void *)(long)((struct __sk_buff *)ctx)->data;
		data_end = (void *)(long)((struct __sk_buff *)ctx)->data_end;
	} else {
		data = (void *)(long)((struct xdp_md *)ctx)->data;
		data_end = (void *)(long)((struct xdp_md *)ctx)->data_end;
	}
	if (!d || !peer || !cfg || d->mh_off > RX_MH_OFF_MAX)
		return RX_V(RX_DROP, MRC_R_RX_TRUNCATED);
	mh = data + d->mh_off;
	if ((void *)(mh + 1) > data_end)
		return RX_V(RX_DROP, MRC_R_RX_TRUNCATED);
	peer_idx = d->peer_idx;
	plane = d->plane;
	type = d->type;
	len = d->len;
	d->mac_len = 0;
	d->inner_family = 4;
	d->fb_due = 0;
	d->fb_path = 0;

	/* DATA: the inner packet, IPv4 or IPv6 by its version nibble, parsed
	 * once for the MAC and everything after it (behind the MAC if the
	 * frame says it has one: auth_verify refuses it otherwise). A bad one
	 * is refused below, after the checks that come first. */
	if (type == MRC_T_DATA) {
		__u32 off = d->mh_off + sizeof(*mh) + ((mh->flags & MRC_F_AUTH) ? MRC_AUTH_LEN : 0);

		inner_ok = tc ? rx_inner_tc(ctx, off, &ri) == 1 : rx_inner_xdp(ctx, off, &ri) == 1;
		if (inner_ok)
			d->inner_family = ri.fl.family;
	}

	/* An EV trace went further than its sender's TTL meant (a peer one
	 * router away): it carries nothing to verify and moves no state. */
	if (type == MRC_T_TRACE)
		return RX_V(RX_DROP, MRC_R_RX_TRACE);

	/* Auth before anything uses the header: a probe is not turned around
	 * and no state moves for a frame without the peer's MAC (auth.h). */
	v = auth_verify(mh, data_end, d->udp_len, peer_idx, inner_ok ? &ri.fl : NULL, &auth);
	if (v)
		return RX_V(RX_DROP, v);
	d->mac_len = auth ? MRC_AUTH_LEN : 0;

	/* Probes are answered whatever their path_id: it names a path of the
	 * prober's and is only echoed back. */
	if (type == MRC_T_PROBE) {
		if (!probe_allowed(peer_idx, plane, bpf_ktime_get_ns()))
			return RX_V(RX_DROP, MRC_R_RX_PROBE_LIMITED);
		return RX_V(RX_TURN_AROUND, MRC_R_RX_PROBE_REPLIED);
	}
	if (type != MRC_T_DATA && type != MRC_T_PROBE_REPLY && type != MRC_T_FEEDBACK)
		return RX_V(RX_DROP, MRC_R_RX_BAD_TYPE);

	/* DATA: path_id names the sender's path toward us (both ends are
	 * configured with the same path list); PROBE_REPLY: our own path. */
	path_id = bpf_ntohs(mh->path_id);
	if (path_id >= peer->n_paths || path_id >= MRC_STRIDE)
		return RX_V(RX_DROP, MRC_R_RX_UNKNOWN_PATH);
	live = path_live(peer_idx, path_id);
	st = path_stats(peer_idx, path_id);
	pcfg = path_cfg(peer_idx, path_id);
	if (!live || !st || !pcfg)
		return RX_V(RX_DROP, MRC_R_RX_UNKNOWN_PATH);
	/* A path belongs to one plane: a frame naming another plane's path
	 * (a stray or forged path id) must not move that path's state. */
	if (pcfg->plane != plane)
		return RX_V(RX_DROP, MRC_R_RX_WRONG_PLANE);

	if (type == MRC_T_PROBE_REPLY)
		return rx_probe_reply(cfg, peer_idx, path_id, live, mh);
	/* A feedback frame (the peer has no data for us to carry echoes):
	 * evidence for our path fb_path, as an echo in DATA would be. */
	if (type == MRC_T_FEEDBACK) {
		if (mh->flags & MRC_F_FEEDBACK) {
			now = bpf_ktime_get_ns();
			rx_echo(peer_idx, mh->fb_path, bpf_ntohl(mh->fb_ts), mh->flags, now);
			cong_echoed(peer_idx, mh->fb_path, bpf_ntohl(mh->fb_ts), mh->flags,
				    cfg->cong_hold_us, now);
		}
		return RX_V(RX_DROP, MRC_R_RX_FEEDBACK);
	}

	/* DATA. The inner packet (parsed above) is IPv4 or IPv6, bound to
	 * the peer: its own inner source, our inner destination, before the
	 * frame changes any state. */
	if (!inner_ok)
		return RX_V(RX_DROP, MRC_R_RX_BAD_INNER);
	v = rx_inner_bound(&ri.fl, peer_idx);
	if (v != RX_CONTINUE_V)
		return v;
	psn = rx_wire_psn(mh, &ri);
	if (multi) {
		n = rx_seg_count(mh, &ri, len, psn - bpf_ntohl(mh->psn), &hdrs);
		if (n > 1) {
			struct mrc_hstats *hs = health_stats();

			if (hs) {
				hs->rx_gso_units += 1;
				hs->rx_gso_segs += n;
			}
		}
	}

	st->rx_packets += n;
	/* what the segments took on the wire: each repeats every header */
	st->rx_bytes += len + (__u64)(n - 1) * hdrs;

	/* The first segment of a unit to arrive applies its feedback. */
	receipt = feedback_receipt(live, bpf_ntohl(mh->psn), bpf_ntohl(mh->tx_ts),
				   &now);
	/* Loss on this path: units skipped, segments missing (congest.h). */
	cong_rx_loss(peer_idx, path_id, bpf_ntohl(mh->psn), bpf_ntohs(mh->segs), n,
		     mh->path_seq, mh->flags & MRC_F_HEDGE, receipt, &now);

	/* Reordering hints, duplicates and loss, per wire packet (rx_account). */
	acc = rx_account(peer_idx, path_id, psn, n, bpf_ntohs(mh->epoch) |
			 ((mh->flags & MRC_F_HEDGE) ? RX_ACC_HEDGED : 0));

	/* Feedback: the peer tells us one of OUR paths delivered a packet
	 * we sent at fb_ts. */
	if (receipt && (mh->flags & MRC_F_FEEDBACK)) {
		rx_echo(peer_idx, mh->fb_path, bpf_ntohl(mh->fb_ts), mh->flags, now);
		cong_echoed(peer_idx, mh->fb_path, bpf_ntohl(mh->fb_ts), mh->flags,
			    cfg->cong_hold_us, now);
	}
	/* No reverse data echoed this path lately: a feedback frame of our
	 * own (tc only, one wire segment: a clone of a GSO skb would carry
	 * the whole unit back). */
	if (tc && receipt && n == 1 && feedback_due(cfg, live, now)) {
		d->fb_due = 1;
		d->fb_path = path_id;
	}

	/* The second copy of a hedged unit's packet goes no further; it
	 * still counted as evidence above. */
	if (acc == RX_ACC_DUP)
		return RX_V(RX_DROP, MRC_R_RX_DUPLICATE);
	if (acc == RX_ACC_AHEAD)
		done = MRC_R_RX_HEDGE_AHEAD;

	/* Reordering across paths must not make TCP's PAWS drop data that
	 * arrived (bpf/paws.h). Not a pure ACK: PAWS lets a disordered one
	 * pass, and a lifted ACK timestamp, echoed back in the data, would
	 * make the data's receiver measure its RTT short (it sizes its
	 * receive window by it). */
	if ((cfg->flags & MRC_CFG_PAWS_GUARD) && ri.tcp_end && len > ri.tcp_end &&
	    ri.tcp_off <= RX_INNER_OFF_MAX + 60) {
		struct tcphdr *tcph = data + ri.tcp_off;

		if ((void *)(tcph + 1) <= data_end &&
		    paws_guard(peer_idx, &ri.fl, tcph, data_end))
			HSTAT_INC(paws_lifted);
	}

	/* ECN: the fabric's CE reaches the inner packet (bpf/ecn.h). */
	ecn = ecn_decap(d->outer_tos, ri.tos);
	if ((d->outer_tos & IP_ECN_MASK) == ECN_CE) {
		PCNT_INC(peer_idx, path_id, rx_ce, 1);
		cong_rx_ce(peer_idx, path_id, now ? now : bpf_ktime_get_ns());
	}
	if (ecn < 0)
		return RX_V(RX_DROP, MRC_R_RX_ECN_NOT_ECT);
	if (ecn != (ri.tos & IP_ECN_MASK))
		rx_ecn_set((void *)(mh + 1) + (d->mac_len & MRC_AUTH_LEN), data_end, &ri, ecn);
	return RX_V(RX_DELIVER, done);
}

/* rx_data_body, verified once per hook whatever state validation left
 * (inlined, each of validation's ~130 outcomes walked all of it again). */
__attribute__((noinline)) int rx_data_xdp(struct xdp_md *ctx, const struct mrc_config *cfg,
					  struct mrc_peer *peer, struct rx_data *d)
{
	return rx_data_body(ctx, false, false, cfg, peer, d);
}

__attribute__((noinline)) int rx_data_tc(struct __sk_buff *skb, const struct mrc_config *cfg,
					 struct mrc_peer *peer, struct rx_data *d)
{
	return rx_data_body(skb, true, d && d->multi, cfg, peer, d);
}

/* ctx: the hook's context (tc: an skb, else XDP's); len: the frame's
 * bytes (a tc skb's may lie beyond data_end); multi: see rx_data_body. */
static __always_inline __u32 rx_process(void *ctx, bool tc, void *data, void *data_end,
					__u32 ifindex, __u32 len, bool multi, struct mrc_frame *f)
{
	struct mrc_config *cfg;
	struct mrc_peer *peer;
	struct rx_data d = {};
	__u32 peer_idx, plane, type, v;

	f->auth = NULL;
	f->mac_len = 0;
	/* all of them: the compiler keeps f in registers, and one left
	 * undefined on some path is a register the verifier refuses */
	f->fb_due = false;
	f->fb_peer = 0;
	f->fb_path = 0;
	f->inner_family = 4;
	f->len = len;
	cfg = cfg_get();
	if (!cfg)
		return RX_PASS_UNCOUNTED;
	v = rx_validate(data, data_end, len, ifindex, cfg_udp_port(cfg), f,
			&peer_idx, &peer, &plane, &type);
	if (RX_ACTION(v) == RX_ICMP)
		v = pmtu_rx_icmp(f, data_end, ifindex, cfg_udp_port(cfg));
	/* Not mrc's (an ICMP error that is no news about our paths
	 * included): the plane's access list decides whether the stack
	 * sees it (acl.h). */
	if (RX_ACTION(v) == RX_PASS)
		return acl_underlay(data, data_end, ifindex, v);
	if (v != RX_CONTINUE_V)
		return v;

	d.mh_off = (void *)f->mh - data;
	d.len = len;
	d.peer_idx = peer_idx;
	d.plane = plane;
	d.udp_len = bpf_ntohs(f->udp->len);
	d.type = type;
	d.outer_tos = f->l3.tos;
	d.multi = multi;
	v = tc ? rx_data_tc(ctx, cfg, peer, &d) : rx_data_xdp(ctx, cfg, peer, &d);
	f->mac_len = d.mac_len;
	f->inner_family = d.inner_family;
	f->fb_due = d.fb_due;
	f->fb_peer = peer_idx;
	f->fb_path = d.fb_path;
	/* A probe is turned around signed anew with the key auth_verify
	 * checked it with (gone since: refused). */
	if (RX_ACTION(v) == RX_TURN_AROUND && d.mac_len) {
		f->auth = auth_key(peer_idx);
		if (!f->auth)
			return RX_V(RX_DROP, MRC_R_RX_BAD_MAC);
	}
	return v;
}

/* Both exits count a verdict's reason here, once. */
static __always_inline int rx_count(__u32 reason, int ret)
{
	if (reason != RX_NOT_COUNTED)
		count_reason(reason);
	return ret;
}

/* XDP's exit: carry out the verdict. */
static __always_inline int rx_exit(struct xdp_md *ctx, struct mrc_frame *f, __u32 v)
{
	__u32 action = RX_ACTION(v), reason = RX_REASON(v);
	int ret = XDP_PASS;

	if (action == RX_DELIVER) {
		/* a priority tag goes with the outer headers */
		if (decap_xdp(ctx, f->l2_len - ETH_HLEN + f->l3.hdr_len +
				   sizeof(struct udphdr) + sizeof(struct mrc_hdr) + f->mac_len,
			      f->inner_family == 6 ? ETH_P_IPV6 : ETH_P_IP)) {
			reason = MRC_R_RX_DECAP_FAIL;
			ret = XDP_DROP;
		}
	} else if (action == RX_TURN_AROUND) {
		encap_turn_around(f);
		ret = XDP_TX;
		/* The reply's type is covered: sign it anew. auth_verify saw
		 * the MAC in the frame, so this cannot fail. */
		if (f->auth && auth_sign(f->mh, (void *)(long)ctx->data_end,
					 f->auth, NULL))
			ret = XDP_DROP;
	} else if (action == RX_DROP) {
		ret = XDP_DROP;
	}
	return rx_count(reason, ret);
}

/*
 * xdp.frags (BPF_F_XDP_HAS_FRAGS): a plane with an MTU above a page (jumbo,
 * 9000) hands XDP multi-buffer frames, and veth refuses a program without
 * frags support on such a device. data..data_end is then the first buffer
 * only: every header mrc reads lies there (a page holds far more than the
 * outer and inner headers); lengths come from bpf_xdp_get_buff_len.
 */
SEC("xdp.frags")
int mrc_rx(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct mrc_frame f;

	return rx_exit(ctx, &f, rx_process(ctx, false, data, data_end, ctx->ingress_ifindex,
					   bpf_xdp_get_buff_len(ctx), false, &f));
}

/* tc's exit: a probe goes back out of the device it came in on (tc has
 * no XDP_TX; the redirect passes the device's egress qdisc, unlike XDP_TX,
 * so a shaped plane shapes replies too). */
static __always_inline int rx_exit_tc(struct __sk_buff *skb, struct mrc_frame *f, __u32 v)
{
	__u32 action = RX_ACTION(v), reason = RX_REASON(v);
	int ret = TC_ACT_OK;

	if (action == RX_DELIVER && f->fb_due &&
	    feedback_send(skb, f->l2_len, f->l3.family, f->fb_peer, f->fb_path) == -2) {
		reason = MRC_R_RX_DECAP_FAIL;
		ret = TC_ACT_SHOT;
	} else if (action == RX_DELIVER) {
		if (decap_tc(skb, f->l2_len - ETH_HLEN + f->l3.hdr_len + sizeof(struct udphdr) +
				  sizeof(struct mrc_hdr) + f->mac_len,
			      f->inner_family == 6 ? ETH_P_IPV6 : ETH_P_IP)) {
			reason = MRC_R_RX_DECAP_FAIL;
			ret = TC_ACT_SHOT;
		}
	} else if (action == RX_TURN_AROUND) {
		encap_turn_around(f);
		ret = bpf_redirect(skb->ifindex, 0);
		/* re-signed as in XDP's exit */
		if (f->auth && auth_sign(f->mh, (void *)(long)skb->data_end, f->auth, NULL))
			ret = TC_ACT_SHOT;
	} else if (action == RX_DROP) {
		ret = TC_ACT_SHOT;
	}
	return rx_count(reason, ret);
}

/* Headers rx_process reads directly: Ethernet, outer IPv6, UDP, MRC, inner
 * IPv4 with options and TCP with options. */
#define RX_TC_LINEAR	(ETH_HLEN + 40 + 8 + MRC_HDR_LEN + 60 + 60)

SEC("tc")
int mrc_rx_tc(struct __sk_buff *skb)
{
	__u32 want = skb->len < RX_TC_LINEAR ? skb->len : RX_TC_LINEAR;
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct mrc_frame f;

	/* A GSO or paged skb may hold less than the headers in its linear
	 * part; pulling is cheap when it is already there, so only if short. */
	if (data + want > data_end) {
		bpf_skb_pull_data(skb, want);
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
	}
	/* A GSO skb is several wire segments: the sender's encap left
	 * gso_size (FIXED_GSO) and reset gso_segs, so either marks one. A
	 * plain skb is one wire segment, whatever its header claims. */
	return rx_exit_tc(skb, &f, rx_process(skb, true, data, data_end, skb->ifindex, skb->len,
					      skb->gso_size || skb->gso_segs > 1, &f));
}

char _license[] SEC("license") = "Dual BSD/GPL";
