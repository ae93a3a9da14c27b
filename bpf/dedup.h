/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Receive-side duplicate filter for hedged units (MRC_F_HEDGE on both
 * copies): the second copy of a wire PSN goes no further.
 */
#ifndef MRC_DEDUP_H
#define MRC_DEDUP_H

#include <stdbool.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "mrc.h"
#include "stats.h"

/* PSNs per word: the low 32 bits of a word are one bit per PSN of a block,
 * the high 32 bits tag the block (psn >> DEDUP_BLOCK_SHIFT). */
#define DEDUP_BLOCK_SHIFT	5
#define DEDUP_BLOCK_MASK	((1U << DEDUP_BLOCK_SHIFT) - 1)

/* Is block tag a newer than block tag b? Tags are psn >> DEDUP_BLOCK_SHIFT,
 * 27 bits that wrap with the PSN: compared modulo 2^27 (shifted back into
 * the top bits, a signed 32-bit difference), so the window keeps working
 * after 2^32 PSNs (issue #13.1). */
static __always_inline bool dedup_tag_newer(__u32 a, __u32 b)
{
	return (__s32)((a - b) << DEDUP_BLOCK_SHIFT) > 0;
}

/* A hedged copy further than this above the highest PSN seen is not
 * marked (MRC_R_RX_HEDGE_AHEAD): a forged frame from a peer's address must
 * not pre-set the bit of a PSN the peer has yet to send, which would drop
 * the genuine packet later. Genuine first copies lead the top by the
 * packets still in flight on slower paths; beyond the reorder window
 * (4096 PSNs) those would be counted lost anyway. A false refusal costs a
 * duplicate delivered, not a loss. */
#define DEDUP_AHEAD		(MRC_WIN_WORDS * 64)

/* Bounded compare-and-swap retries; losing them all (four other CPUs
 * changed the word meanwhile) delivers the packet. */
#define DEDUP_RETRIES		4

/* Per peer, see struct mrc_dedup. Writer: mrc_rx (dedup.h) only. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_MAX_PEERS);
	__type(key, __u32);
	__type(value, struct mrc_dedup);
} mrc_dedup SEC(".maps");

/* Has wire PSN `psn` of a hedged unit from this peer been seen? Marks it
 * seen. PSNs older than the window are let through (TCP copes with a rare
 * duplicate; dropping a first copy would cost a retransmission). */
static __always_inline bool dedup_seen(__u32 peer_idx, __u32 psn)
{
	struct mrc_dedup *d = bpf_map_lookup_elem(&mrc_dedup, &peer_idx);
	__u32 tag = psn >> DEDUP_BLOCK_SHIFT, i;
	__u64 bit = 1ULL << (psn & DEDUP_BLOCK_MASK), *w, old, new;

	if (!d)
		return false;
	w = &d->w[tag & (MRC_DEDUP_WORDS - 1)];
	for (i = 0; i < DEDUP_RETRIES; i++) {
		old = *w;
		if ((__u32)(old >> 32) == tag) {
			if (old & bit) {
				HSTAT_INC(dedup_drops);
				return true;
			}
			new = old | bit;
		} else if (dedup_tag_newer(tag, (__u32)(old >> 32)) || old == 0) {
			new = ((__u64)tag << 32) | bit;
		} else {
			return false;	/* older than the window */
		}
		if (__sync_val_compare_and_swap(w, old, new) == old)
			return false;
	}
	return false;
}

static long dedup_clear_cb(__u32 i, void *arg)
{
	struct mrc_dedup *d = bpf_map_lookup_elem(&mrc_dedup, arg);

	if (!d || i >= MRC_DEDUP_WORDS)
		return 1;
	d->w[i] = 0;
	return 0;
}

/* The peer restarted (bpf/epoch.h): its new PSNs are no duplicates of the
 * old ones. bpf_loop (its context must be on the stack, hence the lookup
 * per word): the verifier checks the body once. */
static __always_inline void dedup_restart(__u32 peer_idx)
{
	bpf_loop(MRC_DEDUP_WORDS, dedup_clear_cb, &peer_idx, 0);
}

#endif /* MRC_DEDUP_H */
