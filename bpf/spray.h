/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Where in the peer's slot table a unit starts looking for a path, by the
 * peer's spray mode (enum mrc_spray). mrc_tx then takes that slot's path, or
 * one of the following slots' if it is unusable, and reports the slot it
 * used with spray_used() so a flowlet sticks to the path it really took.
 *
 *  WEIGHTED  every unit (skb; a GSO unit is one) takes the next slot: the
 *            slot table interleaves paths by weight.
 *  HASH      the inner 5-tuple picks the slot: one flow, one path, like an
 *            ECMP router (the baseline).
 *  FLOWLET   a flow keeps its slot while its units follow each other within
 *            flowlet_gap_us; after a longer idle gap it takes the next slot
 *            of the weighted round robin. The gap should exceed the delay
 *            difference between paths, so the flowlet's first packet on the
 *            new path cannot overtake its last on the old one (LetFlow).
 *            The control plane sets it (fixed, or adaptive from path RTTs).
 */
#ifndef MRC_SPRAY_H
#define MRC_SPRAY_H

#include <linux/in.h>
#include "maps.h"
#include "parsing.h"

/* flowlet gap when the control plane has not set one */
#define SPRAY_DEFAULT_GAP_US	500

struct spray_state {
	struct mrc_flowlet *fl;	/* flowlet being continued or started */
};

/* murmur3's finaliser: cheap and mixes every input bit. */
static __always_inline __u32 spray_mix(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/* Hash of the inner flow: addresses, protocol and, for the first fragment
 * or an unfragmented TCP/UDP packet, the ports. Non-first fragments lack
 * ports and hash by addresses only, as routers do. */
static __always_inline __u32 spray_flow_hash(const struct iphdr *iph, void *data_end)
{
	__u32 h = spray_mix(iph->saddr ^ spray_mix(iph->daddr ^ iph->protocol));

	if ((iph->protocol == IPPROTO_TCP || iph->protocol == IPPROTO_UDP) &&
	    !(iph->frag_off & bpf_htons(0x1fff))) {
		__u32 *ports = (void *)iph + iph->ihl * 4;

		if ((void *)(ports + 1) <= data_end)
			h = spray_mix(h ^ *ports);
	}
	return h;
}

static __always_inline __u32 spray_start(struct spray_state *sp,
					 const struct mrc_peer *peer, __u32 peer_idx,
					 struct mrc_peer_seq *seq,
					 const struct iphdr *iph, void *data_end,
					 __u32 n, __u64 now)
{
	struct mrc_flowlet_key key;
	struct mrc_flowlet *fl;
	__u64 gap_ns;

	sp->fl = NULL;
	if (peer->spray_mode == MRC_SPRAY_HASH)
		return spray_flow_hash(iph, data_end) % n;
	if (peer->spray_mode != MRC_SPRAY_FLOWLET)
		/* 32-bit modulo: cheaper than 64-bit; the wrap of the low word
		 * costs at most one out-of-turn slot every 2^32 units. */
		return (__u32)__sync_fetch_and_add(&seq->cursor, 1) % n;

	key.peer = peer_idx;
	key.hash = spray_flow_hash(iph, data_end);
	gap_ns = (__u64)(peer->flowlet_gap_us ? peer->flowlet_gap_us :
						SPRAY_DEFAULT_GAP_US) * 1000;
	fl = bpf_map_lookup_elem(&mrc_flowlets, &key);
	if (fl) {
		sp->fl = fl;
		if (now - fl->last_ns <= gap_ns) {
			fl->last_ns = now;
			return fl->slot % n;
		}
		fl->last_ns = now;
		fl->moves += 1;
	} else {
		struct mrc_flowlet nf = { .last_ns = now };

		bpf_map_update_elem(&mrc_flowlets, &key, &nf, BPF_ANY);
		sp->fl = bpf_map_lookup_elem(&mrc_flowlets, &key);
	}
	return (__u32)__sync_fetch_and_add(&seq->cursor, 1) % n;
}

/* The slot mrc_tx actually used (the start, or a later one when the start's
 * path was unusable): the flowlet continues there. */
static __always_inline void spray_used(struct spray_state *sp, __u32 slot)
{
	if (sp->fl)
		sp->fl->slot = slot;
}

#endif /* MRC_SPRAY_H */
