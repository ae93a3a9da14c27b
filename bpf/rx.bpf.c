// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * mrc_rx: XDP on every plane device.
 *
 * Frames that are not mrc's leave untouched with XDP_PASS. MRC frames are
 * validated (validate.h: each failure dropped and counted under its enum
 * mrc_reason), counted per path, probes are answered in place with XDP_TX,
 * probe replies and feedback echoes become evidence about our own paths
 * (evidence.h), and DATA is accounted (reorder.h), de-duplicated when hedged
 * (dedup.h) and decapsulated (encap.h): the kernel receives the inner
 * packet on the plane device (XDP_PASS).
 *
 * rx_process is hook-neutral; only rx_exit knows it runs in XDP.
 */
#include <linux/bpf.h>
#include <linux/in.h>
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
					    struct mrc_path_stats *st,
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
	st->probes_rx += 1;
	return RX_V(RX_DROP, MRC_R_RX_PROBE_REPLY);
}

/* Wire PSN of this segment: the unit's PSN plus the segment's index,
 * recovered from the inner TCP sequence number, or for a non-TCP unit
 * (UDP GSO: no offset in the datagrams) from the inner IPv4 ID, which GSO
 * advances by one per segment. */
static __always_inline __u32 rx_wire_psn(const struct mrc_hdr *mh,
					 const struct l3_desc *in, void *data_end)
{
	__u32 psn = bpf_ntohl(mh->psn), segs = bpf_ntohs(mh->segs);

	if (segs <= 1)
		return psn;
	if (mh->flags & MRC_F_IPID) {
		__u16 i = bpf_ntohs(in->ip4->id) - (__u16)bpf_ntohl(mh->seq0);

		/* garbage beyond the unit: leave the unit's PSN */
		if (in->family == 4 && i < segs)
			psn += i;
	} else if (bpf_ntohs(mh->seg_size) > 0 && in->proto == IPPROTO_TCP) {
		struct tcphdr *tcph = in->l4;

		if ((void *)tcph + 8 <= data_end) {
			__u32 off = bpf_ntohl(tcph->seq) - bpf_ntohl(mh->seq0);
			__u32 i = off / bpf_ntohs(mh->seg_size);

			if (i < segs)
				psn += i;
		}
	}
	return psn;
}

static __always_inline __u32 rx_process(void *data, void *data_end, __u32 ifindex,
					struct mrc_frame *f)
{
	struct hdr_cursor nh;
	struct mrc_config *cfg;
	struct mrc_peer *peer;
	struct mrc_path_live *live;
	struct mrc_path_stats *st;
	struct mrc_hdr *mh;
	struct mrc_path *pcfg;
	__u32 peer_idx, path_id, plane, type, psn, v, now_us = 0, ahead;
	__u32 done = RX_NOT_COUNTED;	/* reason a delivered frame counts */
	int ecn;
	__u64 now = 0;
	bool receipt, fresh;

	f->auth = NULL;
	f->mac_len = 0;
	cfg = cfg_get();
	if (!cfg)
		return RX_PASS_UNCOUNTED;
	v = rx_validate(data, data_end, ifindex, cfg_udp_port(cfg), f,
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
	mh = f->mh;

	/* Auth before anything uses the header: a probe is not turned around
	 * and no state moves for a frame without the peer's MAC (auth.h). */
	v = auth_verify(mh, data_end, bpf_ntohs(f->udp->len), peer_idx, type,
			&f->auth);
	if (v)
		return RX_V(RX_DROP, v);
	f->mac_len = f->auth ? MRC_AUTH_LEN : 0;

	/* Probes are answered whatever their path_id: it names a path of the
	 * prober's and is only echoed back. */
	if (type == MRC_T_PROBE) {
		if (!probe_allowed(peer_idx, plane, bpf_ktime_get_ns()))
			return RX_V(RX_DROP, MRC_R_RX_PROBE_LIMITED);
		return RX_V(RX_TURN_AROUND, MRC_R_RX_PROBE_REPLIED);
	}
	if (type != MRC_T_DATA && type != MRC_T_PROBE_REPLY)
		return RX_V(RX_DROP, MRC_R_RX_BAD_TYPE);

	/* DATA: path_id names the sender's path toward us (both ends are
	 * configured with the same path list); PROBE_REPLY: our own path. */
	path_id = bpf_ntohs(mh->path_id);
	if (path_id >= peer->n_paths || path_id >= MRC_MAX_PATHS)
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
		return rx_probe_reply(cfg, peer_idx, path_id, live, st, mh);

	/* DATA. The inner packet must be IPv4 (inner IPv6: parsing.h, and a
	 * family-keyed owner map). */
	nh.pos = (void *)(mh + 1) + (f->mac_len & MRC_AUTH_LEN);
	if (parse_l3(&nh, data_end, bpf_htons(ETH_P_IP), L3_F_IPV4, &f->inner) != L3_OK)
		return RX_V(RX_DROP, MRC_R_RX_BAD_INNER);
	/* Bound to the peer: its own inner source, our inner destination,
	 * before the frame changes any state. */
	v = rx_inner_bound(&f->inner, peer_idx);
	if (v != RX_CONTINUE_V)
		return v;
	psn = rx_wire_psn(mh, &f->inner, data_end);

	st->rx_packets += 1;
	st->rx_bytes += f->len;

	/* The first segment of a unit to arrive applies its feedback. */
	receipt = feedback_receipt(live, bpf_ntohl(mh->psn), bpf_ntohl(mh->tx_ts),
				   &now);
	if (receipt)
		now_us = (__u32)(now / 1000);

	/* Reordering hints, duplicates and loss, per wire packet, within
	 * the sender's current epoch only (bpf/epoch.h); how far ahead of
	 * the window it was bounds what dedup may mark. */
	fresh = epoch_current(peer_idx, bpf_ntohs(mh->epoch));
	ahead = (fresh && (mh->flags & MRC_F_HEDGE)) ? reorder_ahead(peer_idx, psn) : 0;
	if (fresh)
		reorder_account(peer_idx, psn, st, peer_seq(peer_idx));

	/* Feedback: the peer tells us one of OUR paths delivered a packet
	 * we sent at fb_ts. */
	if (receipt && (mh->flags & MRC_F_FEEDBACK))
		evidence_echo(peer_idx, peer, bpf_ntohs(mh->fb_path),
			      bpf_ntohl(mh->fb_ts), now, now_us);

	/* The second copy of a hedged unit's packet goes no further; it
	 * still counted as evidence above. */
	if (fresh && (mh->flags & MRC_F_HEDGE)) {
		if (ahead > DEDUP_AHEAD)
			done = MRC_R_RX_HEDGE_AHEAD;
		else if (dedup_seen(peer_idx, psn))
			return RX_V(RX_DROP, MRC_R_RX_DUPLICATE);
	}

	/* ECN: the fabric's CE reaches the inner packet (bpf/ecn.h). */
	ecn = ecn_decap(f->l3.tos, f->inner.tos);
	if ((f->l3.tos & IP_ECN_MASK) == ECN_CE)
		st->rx_ce += 1;
	if (ecn < 0)
		return RX_V(RX_DROP, MRC_R_RX_ECN_NOT_ECT);
	if (ecn != (f->inner.tos & IP_ECN_MASK))
		ecn_set(&f->inner, ecn);
	return RX_V(RX_DELIVER, done);
}

/* The one exit: carry out the verdict and count its reason. */
static __always_inline int rx_exit(struct xdp_md *ctx, struct mrc_frame *f, __u32 v)
{
	__u32 action = RX_ACTION(v), reason = RX_REASON(v);
	int ret = XDP_PASS;

	if (action == RX_DELIVER) {
		/* a priority tag goes with the outer headers */
		if (decap_xdp(ctx, f->l2_len - ETH_HLEN + f->l3.hdr_len +
				   sizeof(struct udphdr) + sizeof(struct mrc_hdr) + f->mac_len,
			      l3_ethertype(&f->inner))) {
			reason = MRC_R_RX_DECAP_FAIL;
			ret = XDP_DROP;
		}
	} else if (action == RX_TURN_AROUND) {
		struct mrc_auth_inner ai = {};

		encap_turn_around(f);
		ret = XDP_TX;
		/* The reply's type is covered: sign it anew. auth_verify saw
		 * the MAC in the frame, so this cannot fail. */
		if (f->auth && auth_sign(f->mh, (void *)(long)ctx->data_end,
					 f->auth, &ai))
			ret = XDP_DROP;
	} else if (action == RX_DROP) {
		ret = XDP_DROP;
	}
	if (reason != RX_NOT_COUNTED)
		count_reason(reason);
	return ret;
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

	f.len = bpf_xdp_get_buff_len(ctx);

	return rx_exit(ctx, &f, rx_process(data, data_end, ctx->ingress_ifindex, &f));
}

char _license[] SEC("license") = "Dual BSD/GPL";
