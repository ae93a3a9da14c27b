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
#include "sizing.h"
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

/* Per peer, see struct mrc_dedup. Writer: mrc_rx (dedup.h) only. Only
 * peers that send hedged units need one (4 KiB each: 16 MiB for 4,096
 * preallocated peers), so an entry is made by the first hedged packet and
 * removed when the peer restarts: a hash without preallocation. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MRC_N_PEER_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct mrc_dedup);
} mrc_dedup SEC(".maps");

/* What a new entry starts as (global data: too big for the stack). */
static struct mrc_dedup dedup_empty;

/* The peer's filter, made on first use; NULL if it cannot be (the map
 * full or out of memory: the packet is then delivered, see dedup_seen). */
static __always_inline struct mrc_dedup *dedup_of(__u32 peer_idx)
{
	return peer_entry(&mrc_dedup, peer_idx, &dedup_empty);
}

/* Has wire PSN `psn` of a hedged unit from this peer been seen? Marks it
 * seen. PSNs older than the window are let through (TCP copes with a rare
 * duplicate; dropping a first copy would cost a retransmission). */
static __always_inline bool dedup_seen(__u32 peer_idx, __u32 psn)
{
	struct mrc_dedup *d = dedup_of(peer_idx);
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

/* The peer restarted (bpf/epoch.h): its new PSNs are no duplicates of the
 * old ones; its next hedged unit starts an empty filter. */
static __always_inline void dedup_restart(__u32 peer_idx)
{
	bpf_map_delete_elem(&mrc_dedup, &peer_idx);
}

#endif /* MRC_DEDUP_H */
