/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Paths: the agent's configuration of each (peer, path) and the liveness
 * state both programs keep for it, and the one answer to "may a unit go out
 * on this path".
 */
#ifndef MRC_PATH_H
#define MRC_PATH_H

#include <stdbool.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "mrc.h"
#include "sizing.h"

/* Path configuration, MRC_PATH_IDX(peer, path); writers per field in mrc.h
 * struct mrc_path. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_N_PATH_ENTRIES);
	__type(key, __u32);
	__type(value, struct mrc_path);
} mrc_paths SEC(".maps");

/* Path liveness, shared across CPUs; writers per field in mrc.h struct
 * mrc_path_live. Mmapable (nobody maps it) for the layout: the values of
 * such an array start on a page, so each entry's two halves are the two
 * cache lines mrc.h gives them (a plain array's start here, 312 bytes into
 * struct bpf_array, would put both sides' fields in a line). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_N_PATH_ENTRIES);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct mrc_path_live);
} mrc_live SEC(".maps");

/* The operator's admin state per path (struct mrc_path's neighbour: see
 * mrc_admin in mrc.h for why it is a map of its own). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_N_PATH_ENTRIES);
	__type(key, __u32);
	__type(value, __u32);
} mrc_admin SEC(".maps");

/* Map index of path `pid` of peer `peer_idx`, clamped so that a value read
 * from a map can index another map (the verifier wants the bound). */
static __always_inline __u32 path_idx(__u32 peer_idx, __u32 pid)
{
	return MRC_PATH_IDX(peer_idx, pid & (MRC_STRIDE - 1));
}

static __always_inline struct mrc_path *path_cfg(__u32 peer_idx, __u32 pid)
{
	__u32 idx = path_idx(peer_idx, pid);

	return bpf_map_lookup_elem(&mrc_paths, &idx);
}

/* The entry of (peer, path) in a map indexed by MRC_PATH_IDX, or NULL
 * when either index is out of range (they come from the wire). */
static __always_inline void *path_entry(void *map, __u32 peer, __u32 path)
{
	__u32 idx;

	if (peer >= MRC_PEERS || path >= MRC_STRIDE)
		return NULL;
	idx = MRC_PATH_IDX(peer, path);
	return bpf_map_lookup_elem(map, &idx);
}

/* Shared (all-CPU) liveness state of one path, or NULL. */
static __always_inline struct mrc_path_live *path_live(__u32 peer, __u32 path)
{
	return path_entry(&mrc_live, peer, path);
}

/* Configured (a plane device, a family the encapsulation knows) and not
 * denied by the operator: the path may carry units if nothing better is
 * left (the fallback of judge.h). idx: the path's MRC_PATH_IDX. */
static __always_inline bool path_allowed(const struct mrc_path *p, __u32 idx)
{
	__u32 *admin = bpf_map_lookup_elem(&mrc_admin, &idx);

	return p->ifindex && (p->family == 4 || p->family == 6) &&
	       !(admin && *admin == MRC_PATH_DENIED);
}

/* Allowed and GOOD: the predicate the slot walk, the ev_min_active count,
 * the fallback and the hedge partner search all ask. The transmit judge
 * (judge.h) may still find a GOOD path overdue and retire it. */
static __always_inline bool path_usable(const struct mrc_path *p,
					const struct mrc_path_live *l, __u32 idx)
{
	return path_allowed(p, idx) && l->state == MRC_PATH_GOOD;
}

/* path_usable() by index. A global function: the verifier checks it once
 * on its own instead of inline at every loop that asks (with three map
 * lookups each, the inlined copies took mrc_tx past the 1M-instruction
 * verification limit). */
__attribute__((noinline)) int path_usable_at(__u32 peer_idx, __u32 pid)
{
	__u32 idx = path_idx(peer_idx, pid);
	struct mrc_path *p = bpf_map_lookup_elem(&mrc_paths, &idx);
	struct mrc_path_live *l = bpf_map_lookup_elem(&mrc_live, &idx);

	return p && l && path_usable(p, l, idx);
}

/* Send time of the path's oldest unit that no evidence covers yet, or 0
 * when everything sent on it is covered (or nothing was sent). The one
 * reading of unacked_ns against last_ack_ns for the judge, the hedge
 * partner search and retransmission steering. */
static __always_inline __u64 path_outstanding_ns(const struct mrc_path_live *l)
{
	__u64 un = l->unacked_ns;

	return un && (__s64)(l->last_ack_ns - un) < 0 ? un : 0;
}

/* A relapse to ASSUMED_BAD within this long of recovering doubles the
 * probes needed next time (up to 2^HEALTH_MAX_FLAPS times recover_probes):
 * a flapping plane settles to ASSUMED_BAD instead of oscillating. */
#define HEALTH_FLAP_WINDOW_NS	(1000ULL * 1000 * 1000)
#define HEALTH_MAX_FLAPS	4

/* The bookkeeping of a GOOD -> ASSUMED_BAD transition, for whichever
 * program won the compare-and-swap on state (judge.h for the datapath's
 * verdicts, ctl.bpf.c for the agent's): both kinds of retirement date it,
 * restart the recovery count and count toward the damping, or a plane
 * the agent retires on probe loss would recover after recover_probes
 * every time it flaps. */
static __always_inline void path_retired(struct mrc_path_live *live, __u64 now)
{
	if (live->good_ns && now - live->good_ns < HEALTH_FLAP_WINDOW_NS) {
		if (live->flaps < HEALTH_MAX_FLAPS)
			live->flaps += 1;
	} else {
		live->flaps = 0;
	}
	live->bad_ns = now;
	live->probe_ok = 0;
	live->strike_ns = 0;
}

/* An all-zero destination MAC means "resolve through the neighbour table"
 * (routed underlay, next hop not known to the agent). */
static __always_inline bool path_via_neigh(const struct mrc_path *p)
{
	return !(p->dmac[0] | p->dmac[1] | p->dmac[2] |
		 p->dmac[3] | p->dmac[4] | p->dmac[5]);
}

#endif /* MRC_PATH_H */
