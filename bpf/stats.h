/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Counters: per-CPU, so the hot path needs no atomics; the agent sums the
 * CPUs when it reads them. Only the datapath writes them.
 */
#ifndef MRC_STATS_H
#define MRC_STATS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "mrc.h"
#include "path.h"

/* Packets by enum mrc_reason. Writer: mrc_tx / mrc_rx, each from its one
 * exit (tx_exit, rx_exit) and nowhere else. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MRC_R_MAX);
	__type(key, __u32);
	__type(value, __u64);
} mrc_drops SEC(".maps");

/* Per path; writers per field in mrc.h struct mrc_path_stats. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MRC_N_PATH_ENTRIES);
	__type(key, __u32);
	__type(value, struct mrc_path_stats);
} mrc_path_stats SEC(".maps");

/* Per path, shared, atomic adds; writers per field in mrc.h struct
 * mrc_path_cnt. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_N_PATH_ENTRIES);
	__type(key, __u32);
	__type(value, struct mrc_path_cnt);
} mrc_path_cnt SEC(".maps");

/* Path health, [0] only; writers per field in mrc.h struct mrc_hstats. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mrc_hstats);
} mrc_hstats SEC(".maps");

/* Count one packet against enum mrc_reason (drops and verdicts). */
static __always_inline void count_reason(__u32 reason)
{
	__u64 *c = bpf_map_lookup_elem(&mrc_drops, &reason);

	if (c)
		*c += 1;
}

/* The per-CPU counters of path `path` toward peer `peer`, or NULL. */
static __always_inline struct mrc_path_stats *path_stats(__u32 peer, __u32 path)
{
	return path_entry(&mrc_path_stats, peer, path);
}

/* The shared rare-event counters of a path, or NULL. */
static __always_inline struct mrc_path_cnt *path_cnt(__u32 peer, __u32 path)
{
	return path_entry(&mrc_path_cnt, peer, path);
}

/* Bump one of them, e.g. PCNT_INC(peer, path, rx_ce). */
#define PCNT_INC(peer, path, field, n)					\
	do {								\
		struct mrc_path_cnt *__pc = path_cnt(peer, path);	\
									\
		if (__pc)						\
			__sync_fetch_and_add(&__pc->field, n);		\
	} while (0)

static __always_inline struct mrc_hstats *health_stats(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&mrc_hstats, &zero);
}

/* Bump one health counter, e.g. HSTAT_INC(hedged). */
#define HSTAT_INC(field)					\
	do {							\
		struct mrc_hstats *__hs = health_stats();	\
								\
		if (__hs)					\
			__hs->field += 1;			\
	} while (0)

#endif /* MRC_STATS_H */
