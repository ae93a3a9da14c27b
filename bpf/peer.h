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
#include "mrc.h"

/* Peer table, indexed by peer number; writers in mrc.h struct mrc_peer. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_MAX_PEERS);
	__type(key, __u32);
	__type(value, struct mrc_peer);
} mrc_peers SEC(".maps");

/* Overlay IPv4 (network order) -> peer index. Writer: agent (mrcctl
 * loader, at `up`). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MRC_MAX_PEERS);
	__type(key, __be32);
	__type(value, __u32);
} mrc_peer_ip SEC(".maps");

/* Overlay prefix -> owner (peer index or MRC_OWNER_LOCAL), see mrc.h
 * struct mrc_ovl_key. Writer: agent (mrcctl loader, at `up`). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, MRC_MAX_PEERS * 16 + 16);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct mrc_ovl_key);
	__type(value, __u32);
} mrc_ovl_owner SEC(".maps");

/* (plane ifindex, family, underlay source) -> peer: the receive-side
 * source check. Writer: agent (mrcctl loader, at `up`). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MRC_MAX_PEERS * MRC_MAX_PLANES);
	__type(key, struct mrc_rx_key);
	__type(value, struct mrc_rx_peer);
} mrc_rx_peers SEC(".maps");

/* Per-peer sequence state, shared by all CPUs; writers per field in mrc.h
 * struct mrc_peer_seq. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_MAX_PEERS);
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

/* The peer an inner IPv4 destination belongs to; -1 if none. */
static __always_inline int peer_by_overlay(const __be32 *daddr)
{
	__u32 *pidx = bpf_map_lookup_elem(&mrc_peer_ip, daddr);

	if (!pidx || *pidx >= MRC_MAX_PEERS)
		return -1;
	return *pidx;
}

/* The peer allowed to send MRC from this underlay source on this plane;
 * -1 if none (a spoofed or stray source). *plane: the plane's index. */
static __always_inline int peer_by_source(const struct mrc_rx_key *key, __u32 *plane)
{
	struct mrc_rx_peer *rxp = bpf_map_lookup_elem(&mrc_rx_peers, key);

	if (!rxp || rxp->peer >= MRC_MAX_PEERS)
		return -1;
	*plane = rxp->plane;
	return rxp->peer;
}

/* Who owns overlay IPv4 address `addr` (network order): a peer index,
 * MRC_OWNER_LOCAL, or MRC_OWNER_NONE. */
static __always_inline __u32 ovl_owner(__be32 addr)
{
	struct mrc_ovl_key key = { .prefixlen = 32, .addr = addr };
	__u32 *owner = bpf_map_lookup_elem(&mrc_ovl_owner, &key);

	return owner ? *owner : MRC_OWNER_NONE;
}

#endif /* MRC_PEER_H */
