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

#include <linux/bpf.h>
#include <linux/in.h>
#include "mrc.h"
#include "sizing.h"
#include "parsing.h"

/* Two slot tables per peer (peer * 2 + table). Writer: agent (mrcctl
 * loader / weights): it fills the idle one and flips mrc_peer.table, so
 * spraying never sees a half-written table. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_N_PEER_ENTRIES * 2);
	__type(key, __u32);
	__type(value, struct mrc_slots);
} mrc_slots SEC(".maps");

/* Flowlet spraying: inner flow -> its current slot. LRU, so idle flows age
 * out without the control plane. Writer: mrc_tx (spray.h) only. */
#define MRC_FLOWLETS		16384	/* flows in flowlet mode at once, all peers:
					 * preallocated (LRU), 88 bytes each */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MRC_FLOWLETS);
	__type(key, struct mrc_flowlet_key);
	__type(value, struct mrc_flowlet);
} mrc_flowlets SEC(".maps");

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
 * ports and hash by addresses only, as routers do. IPv6 addresses are
 * folded to 32 bits (l3_fold). */
static __always_inline __u32 spray_flow_hash(const struct l3_flow *fl)
{
	__u32 h = spray_mix(l3_fold(fl->saddr) ^ spray_mix(l3_fold(fl->daddr) ^ fl->proto));

	if (fl->has_ports)
		h = spray_mix(h ^ fl->ports);
	return h;
}

/* The peer's live slot table and its length clamped to 1..MRC_SLOTS. */
static __always_inline struct mrc_slots *spray_table(__u32 peer_idx,
						     const struct mrc_peer *peer,
						     __u32 *n)
{
	__u32 idx = peer_idx * 2 + (peer->table & 1);
	struct mrc_slots *slots = bpf_map_lookup_elem(&mrc_slots, &idx);

	if (!slots)
		return NULL;
	*n = slots->n;
	if (*n < 1)
		*n = 1;
	if (*n > MRC_SLOTS)
		*n = MRC_SLOTS;
	return slots;
}

static __always_inline __u32 spray_start(struct spray_state *sp,
					 const struct mrc_peer *peer, __u32 peer_idx,
					 struct mrc_peer_seq *seq,
					 const struct l3_flow *flow, __u32 n, __u64 now)
{
	struct mrc_flowlet_key key;
	struct mrc_flowlet *fl;
	__u64 gap_ns;

	sp->fl = NULL;
	if (peer->spray_mode == MRC_SPRAY_HASH)
		return spray_flow_hash(flow) % n;
	if (peer->spray_mode != MRC_SPRAY_FLOWLET)
		/* 32-bit modulo: cheaper than 64-bit; the wrap of the low word
		 * costs at most one out-of-turn slot every 2^32 units. */
		return (__u32)__sync_fetch_and_add(&seq->cursor, 1) % n;

	key.peer = peer_idx;
	key.hash = spray_flow_hash(flow);
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
