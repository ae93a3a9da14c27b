/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Receiver reorder and loss accounting from the wire PSN of every DATA
 * segment (called by mrc_rx once per wire packet).
 *
 * Per peer, a window of the last MRC_WIN_WORDS * 64 = 4096 PSNs below the
 * highest PSN seen records which have arrived (struct mrc_rx_win, one bit per
 * PSN). A packet
 *  - above the highest: advances the window; every PSN whose word leaves the
 *    window without its bit set is counted lost (a gap not filled within
 *    4096 PSNs: ~3 ms of traffic at 1.3 Mpkt/s, ~100 ms at 40 kpkt/s);
 *  - below it and inside the window, bit clear: out of order, counted in the
 *    log2 histogram of its distance below the highest (per peer 16 buckets,
 *    per path 8, the last bucket open-ended);
 *  - bit already set: duplicate;
 *  - below the window: late (it was counted lost when the window passed, so
 *    net loss is lost - late).
 *
 * Cross-CPU approximation. The counters are per-CPU (summed by the control
 * plane); the window must be shared because one peer's packets arrive on
 * every plane and so on several CPUs. Bits are set with an atomic fetch-or
 * (exact duplicate detection); the highest PSN is advanced with a
 * compare-and-swap so each word entering the window is harvested by exactly
 * one CPU, with an atomic exchange. What stays racy: a packet whose bit
 * lands in a word between another CPU's CAS and its exchange is harvested
 * as belonging to the old word (one PSN counted received there and lost
 * later). veth and most NICs deliver one plane's packets on one CPU at a
 * time, so this needs two planes racing across a word boundary: rare, and it
 * only blurs a statistic, never a forwarding decision.
 */
#ifndef MRC_REORDER_H
#define MRC_REORDER_H

#include <stdbool.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "mrc.h"
#include "sizing.h"
#include "stats.h"

/* Window per peer, shared by all CPUs (PSNs of one peer arrive on every
 * CPU). Writer: mrc_rx (reorder.h) only. Made by the peer's first packet
 * (a hash without preallocation: peers that never send cost nothing). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MRC_N_PEER_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct mrc_rx_win);
} mrc_rx_win SEC(".maps");

static struct mrc_rx_win ro_empty;

/* Per-CPU reorder/loss counters and histogram per peer. Writer: mrc_rx
 * (reorder.h) only. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MRC_N_PEER_ENTRIES);
	__type(key, __u32);
	__type(value, struct mrc_reorder);
} mrc_reorder SEC(".maps");

/* A wire PSN this far from the highest seen is not reordering but a
 * restarted sender: start a fresh window. */
#define RO_RESYNC	(1 << 24)
#define RO_ADVANCE_SPIN	64	/* tries for the top while another CPU moves it */
#define RO_WORD_MASK	((1U << 26) - 1)	/* word numbers of a 32-bit PSN */

enum ro_verdict {
	RO_NEW		= 0,	/* first copy (in order or not) */
	RO_DUP		= 1,	/* already received: dedup may drop it */
	RO_LATE		= 2,	/* too old to tell */
};

/* popcount without a popcnt instruction (BPF has none). */
static __always_inline __u32 ro_popcount(__u64 x)
{
	x = x - ((x >> 1) & 0x5555555555555555ULL);
	x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
	x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
	return (__u32)((x * 0x0101010101010101ULL) >> 56);
}

/* floor(log2(v)) for v >= 1 */
static __always_inline __u32 ro_log2(__u32 v)
{
	__u32 r = 0;

	if (v >> 16) { v >>= 16; r += 16; }
	if (v >> 8) { v >>= 8; r += 8; }
	if (v >> 4) { v >>= 4; r += 4; }
	if (v >> 2) { v >>= 2; r += 2; }
	if (v >> 1) r += 1;
	return r;
}

static __always_inline void ro_reset(struct mrc_rx_win *w, __u32 psn)
{
	__u32 i;

	/* Everything before the first PSN counts as received: a fresh window
	 * must not report the sender's history as loss. */
	for (i = 0; i < MRC_WIN_WORDS; i++)
		w->bits[i] = ~0ULL;
	w->bits[(psn >> 6) & (MRC_WIN_WORDS - 1)] = (2ULL << (psn & 63)) - 1;
	w->max = psn;
	w->started = 1;
}

/* The window's top moves from old to new (new above old): harvest the
 * words that enter it (they held PSNs 4096 lower, now leaving). Returns
 * the PSNs that leave unreceived. */
static __always_inline __u64 ro_advance(struct mrc_rx_win *w, __u32 old, __u32 new)
{
	__u32 ow = old >> 6, n = ((new >> 6) - ow) & RO_WORD_MASK, i;
	__u64 lost = 0;

	if (n > MRC_WIN_WORDS) {
		/* whole words beyond the window never arrived at all */
		lost = (__u64)(n - MRC_WIN_WORDS) * 64;
		ow += n - MRC_WIN_WORDS;
		n = MRC_WIN_WORDS;
	}
	for (i = 0; i < MRC_WIN_WORDS; i++) {
		__u64 bits;

		if (i >= n)
			break;
		bits = __sync_lock_test_and_set(
			&w->bits[(ow + 1 + i) & (MRC_WIN_WORDS - 1)], 0);
		lost += 64 - ro_popcount(bits);
	}
	return lost;
}

static __always_inline void ro_ooo(struct mrc_reorder *ro, __u32 peer_idx, __u32 path_id,
				   __u32 dist)
{
	__u32 b = ro_log2(dist);

	ro->ooo += 1;
	PCNT_INC(peer_idx, path_id, rx_ooo, 1);
	ro->hist[b < MRC_HIST_BUCKETS ? b : MRC_HIST_BUCKETS - 1] += 1;
}

/* How far a wire PSN lies above the highest seen (0 if not above, or no
 * window yet): read before reorder_account() moves the top. */
static __always_inline __u32 reorder_ahead(__u32 peer_idx, __u32 psn)
{
	struct mrc_rx_win *w = bpf_map_lookup_elem(&mrc_rx_win, &peer_idx);
	__s32 d;

	if (!w || !w->started)
		return 0;
	d = (__s32)(psn - (__u32)w->max);
	return d > 0 ? d : 0;
}

/*
 * Account one received wire PSN of peer peer_idx on path path_id. Keeps
 * seq->rx_psn_max (the status view of the highest PSN) in step.
 */
static __always_inline int reorder_account(__u32 peer_idx, __u32 path_id, __u32 psn,
					   struct mrc_peer_seq *seq)
{
	struct mrc_reorder *ro = bpf_map_lookup_elem(&mrc_reorder, &peer_idx);
	/* the peer's first packet makes an empty window (started 0) */
	struct mrc_rx_win *w = ro ? peer_entry(&mrc_rx_win, peer_idx, &ro_empty) : NULL;
	__u64 bit, old;
	__u32 max, i;
	__s32 d;

	if (!w || !ro)
		return RO_NEW;
	ro->rx_packets += 1;
	max = (__u32)w->max;
	d = (__s32)(psn - max);
	if (!w->started || d >= RO_RESYNC || d <= -RO_RESYNC) {
		if (w->started)
			ro->resync += 1;
		ro_reset(w, psn);
		if (seq)
			seq->rx_psn_max = psn;
		return RO_NEW;
	}
	if (d > 0) {
		/* One CPU at a time moves the top, and it clears the words
		 * entering the window *before* it publishes the new top: a CPU
		 * judged against the new top then never sets a bit in a word
		 * still to be cleared (that bit would be lost, and its PSN
		 * counted as loss). Others wait for it, briefly, and are then
		 * judged against the top it left. */
		bool owned = false;

		for (i = 0; i < RO_ADVANCE_SPIN; i++) {
			if (__sync_val_compare_and_swap(&w->advancing, 0, 1) == 0) {
				owned = true;
				break;
			}
		}
		max = (__u32)w->max;
		d = (__s32)(psn - max);
		if (owned) {
			if (d > 0) {
				ro->lost += ro_advance(w, max, psn);
				__sync_lock_test_and_set(&w->max, (__u64)psn);
				if (seq)
					seq->rx_psn_max = psn;
				max = psn;
				d = 0;
			}
			__sync_lock_test_and_set(&w->advancing, 0);
		} else if (d > 0) {
			/* The top stayed taken for the whole wait (the CPU
			 * moving it may itself be interrupted, or its vCPU
			 * descheduled): its word may be about to be cleared,
			 * so the PSN is not marked. The window will count it
			 * lost; unmarked says how many of those did arrive. */
			ro->unmarked += 1;
			return RO_NEW;
		}
	}
	/* Word granularity: the window is the 64 words up to the top's. */
	if (d < 0 && (((max >> 6) - (psn >> 6)) & RO_WORD_MASK) >= MRC_WIN_WORDS) {
		ro->late += 1;
		PCNT_INC(peer_idx, path_id, rx_late, 1);
		return RO_LATE;
	}
	bit = 1ULL << (psn & 63);
	old = __sync_fetch_and_or(&w->bits[(psn >> 6) & (MRC_WIN_WORDS - 1)], bit);
	if (old & bit) {
		ro->dup += 1;
		PCNT_INC(peer_idx, path_id, rx_dup, 1);
		return RO_DUP;
	}
	if (d < 0)
		ro_ooo(ro, peer_idx, path_id, (__u32)-d);
	return RO_NEW;
}

/* The peer restarted (a new epoch, bpf/epoch.h): the next PSN starts a
 * fresh window, as the first one ever did; counted as a resync if the peer
 * had sent before. */
static __always_inline void reorder_restart(__u32 peer_idx, bool counted)
{
	struct mrc_rx_win *w = bpf_map_lookup_elem(&mrc_rx_win, &peer_idx);
	struct mrc_reorder *ro = bpf_map_lookup_elem(&mrc_reorder, &peer_idx);

	if (w)
		__sync_lock_test_and_set(&w->started, 0);
	if (ro && counted)
		ro->resync += 1;
}

#endif /* MRC_REORDER_H */
