/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * ECN-driven EV avoidance, in the spirit of UET's REPS and Google's PLB: a
 * queue several hops away in the fabric is invisible to the sender, but a
 * switch that marks CE on it tells the receiver which EV crossed it. The
 * receiver says so in its feedback echo (MRC_F_ECE on the echo of that
 * path), and the sender's slot walk prefers other paths for
 * mrc_config.cong_hold_us after each such echo, twice as long each time
 * the first try after a hold comes back marked (up to CONG_MAX_SHIFT
 * doublings), half as long after each unmarked echo: a persistently
 * congested EV is retried ever more rarely, a cleared one comes back
 * within a few holds. Nothing else moves: the
 * path stays GOOD, its weight stays, and the inner TCP still hears of the
 * mark (RFC 6040, ecn.h), so a bottleneck every path shares (the receiver's
 * own link) is left to the transport: once every nearby slot is marked, the
 * walk takes a marked one (CONG_SKIP_SLOTS).
 */
#ifndef MRC_CONGEST_H
#define MRC_CONGEST_H

#include <stdbool.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "mrc.h"
#include "path.h"
#include "config.h"

/* An echo reports the newest receipt of its path (feedback.h); it says
 * "marked" when a CE arrived on that path this close before that receipt,
 * or after it (the unit's later segments): the path's latest traffic
 * crossed a marking queue, whenever the echo itself goes out. */
#define CONG_ECHO_NS		200000ULL
/* Slots of the walk (tx.bpf.c) that may be passed over for a marked path;
 * after these, a marked path is taken like any other. */
#define CONG_SKIP_SLOTS		4
/* The longest hold is cong_hold_us << CONG_MAX_SHIFT. */
#define CONG_MAX_SHIFT		5

/* Per path, both directions (like mrc_live): the receiver's side for the
 * peer's path toward us, the sender's for ours toward the peer; writers per
 * field in mrc.h struct mrc_path_cong. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_N_PATH_ENTRIES);
	__type(key, __u32);
	__type(value, struct mrc_path_cong);
} mrc_path_cong SEC(".maps");

/* rx: a DATA packet of the peer's path `path` arrived CE-marked. */
static __always_inline void cong_rx_ce(__u32 peer, __u32 path, __u64 now)
{
	struct mrc_path_cong *c = path_entry(&mrc_path_cong, peer, path);

	if (c)
		c->rx_ce_ns = now;
}

/* tx: does the echo of the peer's path `path`, whose newest receipt
 * arrived at last_rx_ns, say it was marked? */
static __always_inline bool cong_echo_due(__u32 peer, __u32 path, __u64 last_rx_ns)
{
	struct mrc_path_cong *c = path_entry(&mrc_path_cong, peer, path);

	return c && c->rx_ce_ns && c->rx_ce_ns + CONG_ECHO_NS >= last_rx_ns;
}

/* rx: the peer echoed our path `path`'s packet sent at fb_ts, with
 * MRC_F_ECE (marked) or without. hold_us: mrc_config.cong_hold_us. The
 * peer repeats an echo when it has nothing newer (feedback.h): only the
 * first one is news, or a marked path's re-echoes would read as unmarked. */
static __always_inline void cong_echoed(__u32 peer, __u32 path, __u32 fb_ts,
					bool marked, __u32 hold_us, __u64 now)
{
	struct mrc_path_cong *c = path_entry(&mrc_path_cong, peer, path);
	__u32 shift;

	__u64 held, age;

	if (!c || c->fb_ts == fb_ts)
		return;
	c->fb_ts = fb_ts;
	shift = c->hold_shift & 31;
	/* unmarked: half the hold (one unmarked packet, a retransmission
	 * that is never ECT, does not undo a queue that marks the rest) */
	if (!marked) {
		if (shift)
			c->hold_shift = shift - 1;
		return;
	}
	/* the first try after a hold came back marked: the queue is still
	 * there, wait longer before the next one (echoes of units sent
	 * before the hold only restart it) */
	held = ((__u64)hold_us * 1000) << shift;
	age = now - c->ce_ns;
	if (c->ce_ns && age >= held && age < 4 * held && shift < CONG_MAX_SHIFT)
		c->hold_shift = shift + 1;
	c->ce_ns = now;
	c->ce_echoes += 1;
}

/* tx: should the slot walk pass over path `pid` for a recent mark? A
 * global function, verified once rather than at every slot of the walk. */
__attribute__((noinline)) int cong_marked(__u32 peer_idx, __u32 pid, __u64 now)
{
	struct mrc_config *cfg = cfg_get();
	struct mrc_path_cong *c = path_entry(&mrc_path_cong, peer_idx, pid);

	return cfg && c && cfg->cong_hold_us && c->ce_ns &&
	       now - c->ce_ns < ((__u64)cfg->cong_hold_us * 1000) << (c->hold_shift & 31);
}

#endif /* MRC_CONGEST_H */
