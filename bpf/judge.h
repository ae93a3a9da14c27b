/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The transmit-side judge: may the next unit go out on a path, is the path
 * suspect (hedge it, hedge.h), or overdue and to be retired here; and, when
 * no slot near the cursor led anywhere, the fallback.
 *
 * Who writes a path's state: the datapath moves GOOD <-> ASSUMED_BAD with
 * compare-and-swap on mrc_path_live.state (this judge on missing evidence,
 * evidence.h on probe replies), so two CPUs never both report one
 * transition; the agent's retirements (a plane's link down, probes
 * unanswered) go through the same CAS in the mrc_ctl program. DENIED
 * lives in mrc_admin and only the operator sets it.
 *
 * live->unacked_ns is the send time of the oldest unit not yet covered by
 * evidence (last_ack_ns is dated by the *send* time of the newest packet
 * known delivered, see evidence.h path_acked). A path nobody sends on is
 * never judged, so an idle connection does not declare its paths dead.
 */
#ifndef MRC_JUDGE_H
#define MRC_JUDGE_H

#include <stdbool.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "mrc.h"
#include "path.h"
#include "peer.h"
#include "config.h"
#include "stats.h"
#include "events.h"

enum health_verdict {
	H_UNUSABLE	= -1,
	H_OK		= 0,
	H_SUSPECT	= 1,
};

/* Are at least `want` paths other than `skip` usable? Only runs when a path
 * is about to be declared dead, which is rare. Two CPUs retiring two paths
 * at once may both see the other still GOOD: the guard can then be short by
 * one, and judge_fallback still keeps the peer reachable. bpf_loop: the
 * verifier checks the body once instead of once per iteration per call
 * site. */
struct judge_count_ctx {
	__u32	peer;
	__u32	skip;
	__u32	want;
	__u32	n;
};

static long judge_count_cb(__u32 i, void *arg)
{
	struct judge_count_ctx *c = arg;

	if (i == c->skip || i >= MRC_STRIDE)
		return 0;
	if (path_usable_at(c->peer, i) && ++c->n >= c->want)
		return 1;
	return 0;
}

static __always_inline bool judge_enough_usable(__u32 peer_idx, __u32 n_paths,
						__u32 skip, __u32 want)
{
	struct judge_count_ctx c = { .peer = peer_idx, .skip = skip, .want = want };

	if (want == 0)
		return true;
	if (n_paths > MRC_STRIDE)
		n_paths = MRC_STRIDE;
	bpf_loop(n_paths, judge_count_cb, &c, 0);
	return c.n >= want;
}

/* GOOD -> ASSUMED_BAD on missing evidence. Returns false if another CPU
 * did it first (it reports the event). */
static __always_inline bool judge_retire(__u32 peer_idx, __u32 pid,
					 struct mrc_path_live *live,
					 __u64 un, __u64 now)
{
	if (__sync_val_compare_and_swap(&live->state, MRC_PATH_GOOD,
					MRC_PATH_ASSUMED_BAD) != MRC_PATH_GOOD)
		return false;
	path_retired(live, now);
	HSTAT_INC(dead);
	event_emit(peer_idx, pid, MRC_PATH_GOOD, MRC_PATH_ASSUMED_BAD,
		   MRC_EV_DEAD, (__u32)((now - un) / 1000), now);
	return true;
}

/* The peer's coverage peak, a windowed maximum over every path to it
 * (health_threshold takes it beside the path's own; evidence.h adds the
 * samples): the largest sample of the current window of JUDGE_COV_WIN_NS
 * and of the one before. A busy host delays the evidence of random
 * paths: one path's decaying peak forgets a spike within a few dozen
 * samples, and the next spike, landing on a path that had seen none,
 * retired it (1 run in 4 of the busy-host test beside one CPU hog: a GOOD
 * path at 34 ms against dead_after 20). Written only when a window turns
 * or a sample beats the peak: the line stays mostly read. Races across
 * CPUs cost a sample. */
#define JUDGE_COV_WIN_NS	1000000000ULL

static __always_inline void judge_cov_add(struct mrc_peer_seq *seq,
					      __u32 v, __u64 now)
{
	__u64 age = now - seq->cov_win_ns;

	if (age >= JUDGE_COV_WIN_NS) {
		seq->cov_prev_us = age < 2 * JUDGE_COV_WIN_NS ? seq->cov_peak_us : 0;
		seq->cov_peak_us = v;
		seq->cov_win_ns = now;
	} else if (v > seq->cov_peak_us) {
		seq->cov_peak_us = v;
	}
}

/* The peer's coverage peak now: 0 when no sample came for two windows. */
static __always_inline __u32 judge_cov_peak(const struct mrc_peer_seq *seq, __u64 now)
{
	__u64 age = now - seq->cov_win_ns;

	if (age >= 2 * JUDGE_COV_WIN_NS)
		return 0;
	if (age >= JUDGE_COV_WIN_NS)
		return seq->cov_peak_us;
	return seq->cov_peak_us > seq->cov_prev_us ? seq->cov_peak_us : seq->cov_prev_us;
}

/* The most the measured evidence delay may stretch dead_after: beyond
 * that a path that still confirms nothing is retired however slow its
 * evidence usually is (with 8, 50 ms blackholes of a flapping plane went
 * unnoticed at dead_after 10 ms). */
#define HEALTH_THR_MAX_MULT	4

/*
 * How late this path's evidence may be before it is overdue: dead_after,
 * or 2 x the recent peak of coverage delay (evidence.h: from sending the
 * oldest outstanding unit to the evidence covering it), this path's or
 * any sibling's (judge_cov_peak), if that is longer: a busy host, a slow
 * reverse stream or many paths sharing its echoes (with 1.5 x, fresh CI
 * runs on this 2-core VM saw two paths of one plane retired at 23.7 ms
 * under the busy-host test). At most HEALTH_THR_MAX_MULT x dead_after.
 * Nanoseconds.
 */
static __always_inline __s64 health_threshold(const struct mrc_config *cfg,
					      const struct mrc_path_live *live,
					      const struct mrc_peer_seq *seq,
					      __u64 now)
{
	__s64 base = (__s64)cfg->dead_after_us * 1000;
	__u32 peak = live->ev_cov_max_us, peer = judge_cov_peak(seq, now);
	__s64 t = (__s64)(peak > peer ? peak : peer) * 2 * 1000;

	if (t < base)
		return base;
	if (t > base * HEALTH_THR_MAX_MULT)
		return base * HEALTH_THR_MAX_MULT;
	return t;
}

/*
 * Judge an allowed path for the next unit. GOOD paths are usable (H_OK or
 * H_SUSPECT); a GOOD path whose evidence is overdue is retired here, unless
 * that would leave fewer than min_active usable paths.
 *
 * "Overdue" is relative to the path's siblings, in time (RACK, RFC 8985):
 * the path's oldest outstanding unit was sent at unacked_ns, and
 *  - a unit sent more than the threshold LATER on another path to this
 *    peer is already confirmed (mrc_peer_seq.ack_max_ns, the newest send
 *    time any evidence covers). A delay every path shares - this host's
 *    CPU, a queue in front of all planes, a peer gone silent - holds that
 *    reference back as much as this path's evidence and retires nothing:
 *    the agent's probes judge a peer whose paths all went quiet;
 *  - and the unit is older than the path's send-to-evidence delay plus
 *    the threshold (queues differ between planes: up to ~8 ms measured
 *    between tbf-shaped planes under one TCP flow).
 * The threshold is dead_after, stretched to what this path's evidence
 * normally takes (health_threshold). A path that is merely idle has
 * nothing outstanding.
 */
static __always_inline int health_judge(const struct mrc_config *cfg,
					const struct mrc_peer *peer,
					__u32 peer_idx, __u32 pid,
					struct mrc_path_live *live, __u64 now)
{
	struct mrc_peer_seq *seq;
	__u64 un, ack;
	__s64 lag, late, thr;

	if (live->state != MRC_PATH_GOOD)
		return H_UNUSABLE;
	if (!(cfg->flags & MRC_CFG_LIVENESS) || cfg->dead_after_us == 0)
		return H_OK;

	un = path_outstanding_ns(live);
	ack = live->last_ack_ns;
	if (!un) {
		/* Everything sent so far is accounted for: this unit is
		 * the oldest outstanding one. */
		live->unacked_ns = now;
		live->strike_ns = 0;
		return H_OK;
	}
	seq = peer_seq(peer_idx);
	if (!seq)
		return H_OK;
	lag = (__s64)(seq->ack_max_ns - un);
	late = (__s64)(now - un) - (__s64)live->ev_rtt_us * 1000;
	if (late < lag)
		lag = late;
	thr = health_threshold(cfg, live, seq, now);
	if (lag > thr) {
		/* Two strikes: one lost unit (a congestion drop, a queue
		 * spike) must not retire a path. The first verdict remembers
		 * the unit it found uncovered and restarts the observation
		 * with this one; only if the first is still uncovered when
		 * the new one is overdue too is the path dead. Evidence that
		 * covers the first unit only after the verdict means it was
		 * late, not lost (the busy host's evidence often arrived
		 * just after a strike; cleared only by a unit sent after
		 * the strike, it retired healthy paths). */
		if (!live->strike_ns || (__s64)(ack - live->strike_ns) >= 0) {
			live->strike_ns = un;
			live->unacked_ns = now;
			return H_SUSPECT;
		}
		if (!judge_enough_usable(peer_idx, peer->n_paths, pid,
					 peer->min_active)) {
			HSTAT_INC(min_active_held);
			return H_SUSPECT;
		}
		judge_retire(peer_idx, pid, live, un, now);
		return H_UNUSABLE;
	}
	/* A path with a strike stays suspect until evidence covers the unit
	 * the strike found uncovered (that clears strike_ns above). The strike
	 * restarted the observation, so `lag` starts again from zero: judged
	 * by lag alone, a dead plane's units went unhedged for hedge_after
	 * after every first strike, and TCP's retransmissions among them
	 * were lost again - a 200 ms RTO stall in 4 of 4 hedged failover
	 * runs (docs/benchmarks/failover.md). */
	if (live->strike_ns)
		return H_SUSPECT;
	/* Suspect at the same fraction of the threshold as hedge_after is
	 * of dead_after: a busy host's slow evidence is not hedged for. */
	if (cfg->hedge_after_us &&
	    lag > (__s64)((__u64)cfg->hedge_after_us * (__u64)thr / cfg->dead_after_us))
		return H_SUSPECT;
	return H_OK;
}

/*
 * Can the next unit go out on path `pid`: allowed (path.h) and GOOD by the
 * judgement above, which may retire the path right here (H_UNUSABLE) or
 * call it suspect (H_SUSPECT: usable, hedged if hedging is on). Returns the
 * path, its verdict in *verdict, or NULL.
 */
/* The verdict of judge_path() (H_UNUSABLE when the path may not carry the
 * unit). A global function: the verifier checks the judgement once, not
 * once per slot of the walk and per state reaching it (inlined, the walk
 * took mrc_tx past the 1M-instruction verification limit). */
__attribute__((noinline)) int judge_pid(__u32 peer_idx, __u32 pid, __u32 n_paths, __u64 now)
{
	__u32 idx = path_idx(peer_idx, pid);
	struct mrc_config *cfg = cfg_get();
	struct mrc_peer *peer = peer_get(peer_idx);
	struct mrc_path *path;
	struct mrc_path_live *live;

	if (!cfg || !peer || pid >= n_paths)
		return H_UNUSABLE;
	path = bpf_map_lookup_elem(&mrc_paths, &idx);
	live = bpf_map_lookup_elem(&mrc_live, &idx);
	if (!path || !live || !path_allowed(path, idx))
		return H_UNUSABLE;
	return health_judge(cfg, peer, peer_idx, pid, live, now);
}

static __always_inline struct mrc_path *
judge_path(__u32 peer_idx, __u32 pid, __u32 n_paths, __u64 now, int *verdict)
{
	*verdict = judge_pid(peer_idx, pid, n_paths, now);
	return *verdict >= 0 ? path_cfg(peer_idx, pid) : NULL;
}

/*
 * No slot near the cursor led to a usable path (the agent has not rebuilt
 * the slot table yet, or everything looks bad): any usable path, else - so
 * that false positives never black out a peer - with min_active > 0 the
 * first allowed path, whatever its state. -1: nothing to send on.
 */
struct judge_fb_ctx {
	__u32	peer;
	__u32	start;
	__u32	n_paths;
	int	good;
	int	any;
};

static long judge_fb_cb(__u32 i, void *arg)
{
	struct judge_fb_ctx *c = arg;
	struct mrc_path *p;
	__u32 pid, idx;

	if (c->n_paths == 0)
		return 1;
	pid = (c->start + i) % c->n_paths;
	if (pid >= MRC_STRIDE)
		return 1;
	if (path_usable_at(c->peer, pid)) {
		c->good = pid;
		return 1;
	}
	if (c->any < 0) {
		idx = path_idx(c->peer, pid);
		p = bpf_map_lookup_elem(&mrc_paths, &idx);
		if (p && path_allowed(p, idx))
			c->any = pid;
	}
	return 0;
}

static __always_inline int judge_fallback(__u32 peer_idx, __u32 n_paths,
					  __u32 start, __u32 min_active)
{
	struct judge_fb_ctx c = { .peer = peer_idx, .start = start,
				  .n_paths = n_paths, .good = -1, .any = -1 };

	if (n_paths > MRC_STRIDE)
		n_paths = c.n_paths = MRC_STRIDE;
	bpf_loop(n_paths, judge_fb_cb, &c, 0);
	if (c.good >= 0)
		return c.good;
	if (!min_active || c.any < 0)
		return -1;
	HSTAT_INC(fallback);
	return c.any;
}

#endif /* MRC_JUDGE_H */
