/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Peers: who a packet is for (transmit: inner destination -> peer) or from
 * (receive: plane + underlay source -> peer), and the per-peer state both
 * programs share.
 */
#ifndef MRC_PEER_H
#define MRC_PEER_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <stdbool.h>
#include "mrc.h"
#include "sizing.h"
#include "parsing.h"

/* Peer table, indexed by peer number; writers in mrc.h struct mrc_peer. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_N_PEER_ENTRIES);
	__type(key, __u32);
	__type(value, struct mrc_peer);
} mrc_peers SEC(".maps");

/* Overlay prefix of either family (mrc.h struct mrc_ovl_key) -> the peer
 * index mrc_tx sends an inner destination to, by longest prefix: each
 * peer's overlay addresses and peer[].prefixes. Writer: agent (mrcctl
 * loader, at `up`). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, MRC_N_PEER_ENTRIES * MRC_OVL_PER_PEER);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct mrc_ovl_key);
	__type(value, __u32);
} mrc_peer_ip SEC(".maps");

/* Overlay prefix of either family -> owner (peer index or
 * MRC_OWNER_LOCAL), see mrc.h struct mrc_ovl_key: the inner addresses'
 * owners on receive. Writer: agent (mrcctl loader, at `up`). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, MRC_N_PEER_ENTRIES * MRC_OVL_PER_PEER + MRC_OVL_PER_PEER);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct mrc_ovl_key);
	__type(value, __u32);
} mrc_ovl_owner SEC(".maps");

/* (plane ifindex, family, underlay source) -> peer: the receive-side
 * source check. Writer: agent (mrcctl loader, at `up`). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MRC_N_PEER_ENTRIES * MRC_MAX_PLANES);
	__type(key, struct mrc_rx_key);
	__type(value, struct mrc_rx_peer);
} mrc_rx_peers SEC(".maps");

/* Per-peer sequence state, shared by all CPUs; writers per field in mrc.h
 * struct mrc_peer_seq. Mmapable for the layout, as mrc_live (path.h): one
 * cache line per side. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, MRC_N_PEER_ENTRIES);
	__type(key, __u32);
	__type(value, struct mrc_peer_seq);
} mrc_peer_seq SEC(".maps");

/* A configured peer (n_paths != 0), or NULL. */
static __always_inline struct mrc_peer *peer_get(__u32 peer_idx)
{
	struct mrc_peer *peer = bpf_map_lookup_elem(&mrc_peers, &peer_idx);

	return peer && peer->n_paths ? peer : NULL;
}

static __always_inline struct mrc_peer_seq *peer_seq(__u32 peer_idx)
{
	return bpf_map_lookup_elem(&mrc_peer_seq, &peer_idx);
}

/* The peer allowed to send MRC from this underlay source on this plane;
 * -1 if none (a spoofed or stray source). *plane: the plane's index. */
static __always_inline int peer_by_source(const struct mrc_rx_key *key, __u32 *plane)
{
	struct mrc_rx_peer *rxp = bpf_map_lookup_elem(&mrc_rx_peers, key);

	/* *plane written on every way out: clang merges the stores, and one
	 * of an unset register is what the verifier refuses */
	*plane = rxp ? rxp->plane : 0;
	if (!rxp || rxp->peer >= MRC_PEERS)
		return -1;
	return rxp->peer;
}

/* The value of overlay address addr (IPv4 in [0]) of a family in an LPM
 * map keyed by struct mrc_ovl_key (mrc_peer_ip, mrc_ovl_owner), by longest
 * prefix; MRC_OWNER_NONE if no prefix holds it. */
static __always_inline __u32 ovl_lookup(void *map, __u32 family, const __be32 *addr)
{
	struct mrc_ovl_key key = {
		.prefixlen = MRC_OVL_FAMILY_BITS + (family == 4 ? 32 : 128),
		.family = family,
	};
	__u32 *v;

	__builtin_memcpy(key.addr, addr, 16);
	v = bpf_map_lookup_elem(map, &key);
	return v ? *v : MRC_OWNER_NONE;
}

/* Who owns an inner packet's source (dst false) or destination: a peer
 * index, MRC_OWNER_LOCAL, or MRC_OWNER_NONE. */
static __always_inline __u32 ovl_owner(const struct l3_flow *fl, bool dst)
{
	return ovl_lookup(&mrc_ovl_owner, fl->family, dst ? fl->daddr : fl->saddr);
}

/* The peer an inner destination is sent to (its overlay address or a
 * prefix behind it); -1 if none. */
static __always_inline int peer_by_overlay(const struct l3_flow *fl)
{
	__u32 peer = ovl_lookup(&mrc_peer_ip, fl->family, fl->daddr);

	return peer < MRC_PEERS ? (int)peer : -1;
}

#endif /* MRC_PEER_H */
