/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Per-EV congestion signals: CE marks and loss.
 *
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
 *
 * Loss per EV, for fabrics that drop rather than mark: every DATA unit
 * carries its path's unit count (mrc_hdr.path_seq), so the receiver sees
 * units that never arrived on that path, and each unit's segments
 * (psn..psn+segs-1, in order on one path), so it sees a unit that arrived
 * in part. Either sets MRC_F_ELOSS on the path's echoes for a while;
 * the sender counts such echoes (loss_echoes), which the agent's per-EV
 * split reads beside the CE marks where weights.loss is on
 * (mrcctl/agent/weights.py). A unit skipped
 * is counted lost one unit later, when it has not come meanwhile: two CPUs
 * sending (or receiving) on one path swap neighbours. The slot walk
 * does not hold a lossy path: a receiver's own drops (a full backlog)
 * hit whatever paths were arriving, which only the split's comparison
 * of siblings tells apart. Reordering within one path by more than one unit
 * reads as loss; on one plane every EV shares that, and the split compares
 * EVs with their siblings.
 */
#ifndef MRC_CONGEST_H
#define MRC_CONGEST_H

#include <stdbool.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "mrc.h"
#include "path.h"
#include "config.h"
#include "stats.h"

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

/* An echo says lossy when its path showed a loss this close before its
 * newest receipt: loss is rarer than marking, and one lost unit should
 * reach the echoes of a few units after it. */
#define CONG_LOSS_ECHO_NS	1000000ULL
/* mrc_path_cong.rx_seq holds a path_seq seen */
#define CONG_SEQ_SEEN		0x100
/* a path_seq this far behind the last is a reordered unit, not 128+ lost */
#define CONG_SEQ_BACK		128

/* Per path, both directions (like mrc_live): the receiver's side for the
 * peer's path toward us, the sender's for ours toward the peer; writers per
 * field in mrc.h struct mrc_path_cong. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_N_PATH_ENTRIES);
	__type(key, __u32);
	__type(value, struct mrc_path_cong);
} mrc_path_cong SEC(".maps");

/* Per path, the next path_seq to send: mrc_tx's alone (mrc.h). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_N_PATH_ENTRIES);
	__type(key, __u32);
	__type(value, __u32);
} mrc_path_seq SEC(".maps");

/* tx: the path_seq of a unit on our path `path`. A hedged unit repeats the
 * last one sent (its copy travels on another path, whose count it would
 * break): the receiver does not count hedged units. */
static __always_inline __u8 cong_tx_seq(__u32 peer, __u32 path, bool hedged)
{
	__u32 *n = path_entry(&mrc_path_seq, peer, path);

	if (!n)
		return 0;
	if (hedged)
		return (__u8)(*n - 1);
	return (__u8)(*n)++;
}

/* a frame this many PSNs or more behind its slot's unit is no late frame */
#define CONG_RX_LATE		(1U << 20)

/* rx: n wire packets of the peer's unit ending at `end`
 * (its PSN + segs) and numbered `seq` on its path: counted in the unit's
 * slot of the path (mrc_path_cong.rx_units, by seq). A unit taking the
 * slot of one sent MRC_RX_UNITS units before it settles that one: its
 * packets not counted were lost. Returns those. Counting, not checking
 * order: the packets of one unit reached the receiver through two CPUs
 * (the receiving process's and ksoftirqd) and two units interleaved (two
 * sending CPUs, two queues of the plane device), which an in-order check
 * read as loss: up to 96 packets per path in a failover, 1,000-3,600 in
 * 4 s under cross traffic, none of which any queue dropped (docs/fabric.md,
 * "Per-EV weights"). */
static __always_inline __u32 cong_rx_count(struct mrc_path_cong *c, __u8 seq, __u32 end,
					   __u32 segs, __u32 n)
{
	__u64 *slot = &c->rx_units[seq & (MRC_RX_UNITS - 1)];
	__u64 old = *(volatile __u64 *)slot, mine;
	__u32 got, had;

	if ((__u32)(old >> 32) == end) {
		__sync_fetch_and_add(slot, n);
		return 0;
	}
	/* a frame of a unit already settled (it came after newer units
	 * took its slot) counts for none; far behind is the peer's PSNs
	 * starting over (its instance came up again): a new unit */
	if (old && (__s32)(end - (__u32)(old >> 32)) < 0 &&
	    (__u32)(old >> 32) - end < CONG_RX_LATE)
		return 0;
	mine = (__u64)end << 32 | (__u64)(segs & 0xffff) << 16 | (n & 0xffff);
	if (__sync_val_compare_and_swap(slot, old, mine) != old) {
		/* another CPU took the slot first, for this unit as a rule */
		if ((__u32)(*(volatile __u64 *)slot >> 32) == end)
			__sync_fetch_and_add(slot, n);
		return 0;
	}
	had = (old >> 16) & 0xffff;
	got = old & 0xffff;
	return old && got < had ? had - got : 0;
}

/*
 * rx: a DATA frame of the peer's path `path`: n wire packets of the unit
 * that starts at `unit` with `segs` of them; `first` says it is
 * the first frame of that unit to arrive since another unit's
 * (feedback_receipt). Counts what the path lost: units skipped by path_seq
 * and packets missing from units that arrived in part (cong_rx_count).
 * Hedged units count for neither: they repeat their path's last number,
 * and their copy travels on another path.
 * *now: the clock if read already (0: not), read here only on a loss.
 */
static __always_inline void cong_rx_loss(__u32 peer, __u32 path, __u32 unit, __u32 segs,
					 __u32 n, __u8 seq, bool hedged, bool first,
					 __u64 *now)
{
	struct mrc_path_cong *c = path_entry(&mrc_path_cong, peer, path);
	__u32 segs_lost, units_lost = 0;
	__u8 d;

	if (!c || hedged)
		return;
	if (first) {
		bool seen = c->rx_seq & CONG_SEQ_SEEN;

		d = seq - (__u8)c->rx_seq;
		if (seen && d >= CONG_SEQ_BACK) {
			/* behind the last: the late half of a swap fills the
			 * hole its partner left (or a unit interleaved with
			 * the newer one resumes) */
			if ((c->rx_hole & CONG_SEQ_SEEN) && (__u8)c->rx_hole == seq)
				c->rx_hole = 0;
		} else if (seen && d) {	/* d 0: two sending CPUs took one number */
			/* a hole still open one unit later was a loss; the
			 * newest unit skipped waits for one unit (two sending
			 * or receiving CPUs swap a pair) */
			if (c->rx_hole & CONG_SEQ_SEEN)
				units_lost = 1;
			c->rx_hole = 0;
			if (d >= 2) {
				units_lost += d - 2;
				c->rx_hole = CONG_SEQ_SEEN | (__u8)(seq - 1);
			}
		}
		if (!seen || d < CONG_SEQ_BACK)
			c->rx_seq = CONG_SEQ_SEEN | seq;
	}
	segs_lost = cong_rx_count(c, seq, unit + segs, segs, n);
	if (!segs_lost && !units_lost)
		return;
	if (!*now)
		*now = bpf_ktime_get_ns();
	c->rx_loss_ns = *now;
	if (units_lost)
		PCNT_INC(peer, path, rx_lost_units, units_lost);
	if (segs_lost)
		PCNT_INC(peer, path, rx_lost_segs, segs_lost);
}

/* rx: a DATA packet of the peer's path `path` arrived CE-marked. */
static __always_inline void cong_rx_ce(__u32 peer, __u32 path, __u64 now)
{
	struct mrc_path_cong *c = path_entry(&mrc_path_cong, peer, path);

	if (c)
		c->rx_ce_ns = now;
}

/* tx: what the echo of the peer's path `path`, whose newest receipt
 * arrived at last_rx_ns, says of it: MRC_F_ECE (marked), MRC_F_ELOSS
 * (lossy), both or neither. */
static __always_inline __u8 cong_echo_flags(__u32 peer, __u32 path, __u64 last_rx_ns)
{
	struct mrc_path_cong *c = path_entry(&mrc_path_cong, peer, path);
	__u8 f = 0;

	if (!c)
		return 0;
	if (c->rx_ce_ns && c->rx_ce_ns + CONG_ECHO_NS >= last_rx_ns)
		f |= MRC_F_ECE;
	if (c->rx_loss_ns && c->rx_loss_ns + CONG_LOSS_ECHO_NS >= last_rx_ns)
		f |= MRC_F_ELOSS;
	return f;
}

/* rx: the peer echoed our path `path`'s packet sent at fb_ts; flags: the
 * echo's header flags (MRC_F_ECE: marked, MRC_F_ELOSS: lossy). hold_us:
 * mrc_config.cong_hold_us. The peer repeats an echo when it has nothing
 * newer (feedback.h): only the first one is news, or a marked path's
 * re-echoes would read as unmarked. */
static __always_inline void cong_echoed(__u32 peer, __u32 path, __u32 fb_ts,
					__u8 flags, __u32 hold_us, __u64 now)
{
	struct mrc_path_cong *c = path_entry(&mrc_path_cong, peer, path);
	bool marked = flags & MRC_F_ECE;
	__u32 shift;

	__u64 held, age;

	if (!c || c->fb_ts == fb_ts)
		return;
	c->fb_ts = fb_ts;
	if (flags & MRC_F_ELOSS)
		c->loss_echoes += 1;
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
