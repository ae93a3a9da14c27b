/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Hedging (transmit side): a unit on a suspect path (or every unit, in
 * duplicate-send mode) also goes out on a usable partner path of another
 * plane. Both copies carry MRC_F_HEDGE; the receiver's filter (dedup.h)
 * delivers one.
 */
#ifndef MRC_HEDGE_H
#define MRC_HEDGE_H

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include "mrc.h"
#include "path.h"
#include "config.h"
#include "stats.h"
#include "encap.h"

/* Partner search: path ids after the suspect one to look at. */
#define HEDGE_SCAN	32

/* A usable, not overdue path of the same family on another plane to carry
 * a copy of a unit sent on the suspect path `pid`; -1 if none nearby. */
/* A global function, verified once (see judge_pid); BPF functions take
 * at most five arguments, so the suspect path's family and plane come as
 * HEDGE_FP(family, plane). */
#define HEDGE_FP(family, plane)	((__u32)(family) << 8 | (plane))
__attribute__((noinline)) int hedge_partner(__u32 peer_idx, __u32 n_paths, __u32 pid,
					    __u32 fp, __u64 now)
{
	struct mrc_config *cfg = cfg_get();
	__u32 i, q, idx, family = fp >> 8, plane = fp & 0xff;

	if (!cfg)
		return -1;

	for (i = 1; i <= HEDGE_SCAN; i++) {
		struct mrc_path *p;
		struct mrc_path_live *l;
		__u64 un;

		if (i >= n_paths)
			break;
		q = (pid + i) % n_paths;
		idx = path_idx(peer_idx, q);
		p = bpf_map_lookup_elem(&mrc_paths, &idx);
		l = bpf_map_lookup_elem(&mrc_live, &idx);
		if (!p || !l || !path_usable(p, l, idx))
			continue;
		if (p->family != family || p->plane == plane)
			continue;
		/* a partner that is itself overdue would not help */
		un = path_outstanding_ns(l);
		if (cfg->hedge_after_us && un &&
		    now - un > (__u64)cfg->dead_after_us * 1000)
			continue;
		return q;
	}
	return -1;
}

/*
 * Send the encapsulated unit (headers of path `a`, id u->path_id) out of a
 * as a clone, then rewrite the original's headers for path `b`. Returns the
 * path the caller redirects the original to: b, or a if anything failed
 * (then a gets the unit twice; the receiver's filter drops one).
 * bpf_clone_redirect leaves the original sharing its data with the clone:
 * pulling the headers makes them private before they are rewritten.
 */
static __always_inline struct mrc_path *
hedge_send(struct __sk_buff *skb, __u32 peer_idx, struct mrc_path *a,
	   __u32 b_id, struct mrc_unit *u, __u16 port, __u64 wire_bytes)
{
	struct mrc_path *b;
	struct mrc_path_stats *st;

	/* a clone cannot go through the neighbour table */
	if (path_via_neigh(a))
		return a;
	b = path_cfg(peer_idx, b_id);
	if (!b || b->family != a->family)
		return a;
	/* > 0 is NET_XMIT_DROP/CN from the queue: the clone was handed over */
	if (bpf_clone_redirect(skb, a->ifindex, 0) < 0)
		return a;
	st = path_stats(peer_idx, u->path_id);
	if (st) {
		st->tx_packets += u->segs;
		st->tx_bytes += wire_bytes;
	}
	HSTAT_INC(hedged);
	if (bpf_skb_pull_data(skb, ETH_HLEN + encap_overhead(a->family) +
				   encap_mac_len(u)))
		return a;
	u->path_id = b_id;
	if (encap_write(skb, b, u, port))
		return a;
	return b;
}

#endif /* MRC_HEDGE_H */
