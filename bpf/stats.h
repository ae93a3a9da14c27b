/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Counters: per-CPU, so the hot path needs no atomics. */
#ifndef MRC_STATS_H
#define MRC_STATS_H

#include "maps.h"

/* Count one packet against enum mrc_reason (drops and verdicts). */
static __always_inline void count_drop(__u32 reason)
{
	__u64 *c = bpf_map_lookup_elem(&mrc_drops, &reason);

	if (c)
		*c += 1;
}

/* The per-CPU counters of path `path` toward peer `peer`, or NULL. */
static __always_inline struct mrc_path_stats *path_stats(__u32 peer, __u32 path)
{
	__u32 idx;

	if (peer >= MRC_MAX_PEERS || path >= MRC_MAX_PATHS)
		return NULL;
	idx = MRC_PATH_IDX(peer, path);
	return bpf_map_lookup_elem(&mrc_path_stats, &idx);
}

/* Shared (all-CPU) liveness state of one path, or NULL. */
static __always_inline struct mrc_path_live *path_live(__u32 peer, __u32 path)
{
	__u32 idx;

	if (peer >= MRC_MAX_PEERS || path >= MRC_MAX_PATHS)
		return NULL;
	idx = MRC_PATH_IDX(peer, path);
	return bpf_map_lookup_elem(&mrc_live, &idx);
}

/* RTT bookkeeping shared by probe replies and feedback echoes: last sample
 * and a smoothed value (EWMA with gain 1/8, as TCP's SRTT). The first
 * sample seeds srtt. Racy across CPUs; a lost update only costs a sample. */
static __always_inline void rtt_sample(struct mrc_path_live *live, __u32 rtt_us)
{
	__u32 srtt = live->srtt_us;

	live->rtt_us = rtt_us;
	if (srtt == 0)
		srtt = rtt_us ? rtt_us : 1;
	else
		srtt = srtt - (srtt >> 3) + (rtt_us >> 3);
	live->srtt_us = srtt;
}

#endif /* MRC_STATS_H */
