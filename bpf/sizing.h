/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * How big this datapath's per-peer and per-path maps are (struct
 * mrc_sizing in mrc.h). The loader writes it from the config before load
 * and sizes every map to match (bpf_map__set_max_entries); the section is
 * frozen at load, so the verifier reads both fields as constants and a
 * bound like `pid & (MRC_STRIDE - 1)` costs it nothing. The defaults are
 * what the compiled map definitions say, for an object loaded as it is
 * (helper tests, a loader that sets nothing).
 */
#ifndef MRC_SIZING_H
#define MRC_SIZING_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "mrc.h"

const volatile struct mrc_sizing mrc_sizing SEC(".rodata.sizing") = {
	.peers = MRC_DEFAULT_PEERS,
	.path_shift = MRC_PATH_SHIFT_MAX,
};

/* Per-peer entries: a peer index at or above it is no peer. */
#define MRC_PEERS		(mrc_sizing.peers)
/* Paths per peer in the per-path maps (a power of two <= MRC_MAX_PATHS). */
#define MRC_STRIDE		(1U << mrc_sizing.path_shift)
#define MRC_PATH_IDX(peer, path) (((peer) << mrc_sizing.path_shift) | (path))

/* Compiled-in map sizes (the loader overrides them). */
#define MRC_N_PEER_ENTRIES	MRC_DEFAULT_PEERS
#define MRC_N_PATH_ENTRIES	(MRC_DEFAULT_PEERS * MRC_MAX_PATHS)

/* peer_idx's entry in a per-peer hash map without preallocation, made
 * from `empty` on the peer's first use (a peer that never needs it costs
 * nothing); NULL beyond the sizing or when the map is full. Two CPUs
 * making it at once: BPF_NOEXIST lets one write, both read that one. */
static __always_inline void *peer_entry(void *map, __u32 peer_idx, const void *empty)
{
	void *v = bpf_map_lookup_elem(map, &peer_idx);

	if (v || peer_idx >= MRC_PEERS)
		return v;
	bpf_map_update_elem(map, &peer_idx, empty, BPF_NOEXIST);
	return bpf_map_lookup_elem(map, &peer_idx);
}

#endif /* MRC_SIZING_H */
