/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Feedback echoes: each DATA unit tells the peer that one of the peer's
 * paths toward us delivered a packet it sent at fb_ts. The receive side
 * records receipts (feedback_receipt), the transmit side picks one to echo
 * (feedback_pick). The peer turns the echo into evidence (evidence.h).
 */
#ifndef MRC_FEEDBACK_H
#define MRC_FEEDBACK_H

#include <stdbool.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "mrc.h"
#include "path.h"
#include "encap.h"

/* How many paths after the round-robin cursor to look at for one with a
 * receipt not yet echoed. */
#define FEEDBACK_ECHO_SCAN	16
/* Receipts older than this are not echoed: they say nothing current. */
#define FEEDBACK_FRESH_NS	1000000000ULL

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
 * received on it. Among the paths near the round-robin cursor whose newest
 * receipt was not echoed yet, echo the *oldest* one (else the cursor's path,
 * if fresh). Echoing in send order matters to the peer's judgement
 * (judge.h): if a later receipt on another path were echoed first, the peer
 * would see its reference move past a packet that did arrive, only not yet
 * said so - a false "dead" whenever reverse packets are few (pure ACKs,
 * delayed ACKs).
 */
struct feedback_ctx {
	__u64	now;
	__u32	peer;
	__u32	n;
	__u32	start;
	int	pick;		/* oldest unechoed receipt */
	__u32	pick_ts;
	int	first;		/* the cursor's path, if fresh */
};

static long feedback_cb(__u32 i, void *arg)
{
	struct feedback_ctx *c = arg;
	struct mrc_path_live *l;
	__u32 p;

	if (c->n == 0)
		return 1;
	p = c->start + i;	/* start < n and i < n */
	if (p >= c->n)
		p -= c->n;
	l = path_live(c->peer, p);
	if (!l || !l->last_rx_ns ||
	    (__s64)(c->now - l->last_rx_ns) >= (__s64)FEEDBACK_FRESH_NS)
		return 0;
	if (i == 0)
		c->first = p;
	if (l->fb_echoed != l->last_rx_ts &&
	    (c->pick < 0 || (__s32)(l->last_rx_ts - c->pick_ts) < 0)) {
		c->pick = p;
		c->pick_ts = l->last_rx_ts;
	}
	return 0;
}

static __always_inline void feedback_pick(struct mrc_peer_seq *seq,
					  __u32 peer_idx, __u32 n_paths,
					  __u64 now, struct mrc_unit *u)
{
	struct feedback_ctx c = { .now = now, .peer = peer_idx,
				  .n = n_paths, .pick = -1, .first = -1 };
	struct mrc_path_live *l;
	int p;

	if (n_paths == 0 || n_paths > MRC_MAX_PATHS)
		return;
	/* The cursor only spreads the scan's starting point: a plain
	 * read-modify-write (two CPUs may start at the same path) and a
	 * compare instead of an atomic and a division, ~40 ns per unit
	 * less in this VM (benchmark: mrc_tx per-packet cost). */
	c.start = seq->fb_cursor < n_paths ? (__u32)seq->fb_cursor : 0;
	seq->fb_cursor = c.start + 1 < n_paths ? c.start + 1 : 0;
	bpf_loop(n_paths < FEEDBACK_ECHO_SCAN ? n_paths : FEEDBACK_ECHO_SCAN,
		 feedback_cb, &c, 0);
	p = c.pick >= 0 ? c.pick : c.first;
	if (p < 0)
		return;
	l = path_live(peer_idx, p);
	if (!l)
		return;
	u->flags |= MRC_F_FEEDBACK;
	u->fb_path = p;
	u->fb_ts = l->last_rx_ts;
	l->fb_echoed = u->fb_ts;
}

#endif /* MRC_FEEDBACK_H */
