/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Path state changes the datapath makes, for the agent's event log (the
 * agent logs its own changes directly).
 */
#ifndef MRC_EVENTS_H
#define MRC_EVENTS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "mrc.h"
#include "stats.h"

/* struct mrc_event records. Writers: mrc_tx (judge.h: DEAD), mrc_rx
 * (evidence.h: RECOVERED); reader: agent (mrcctl health). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} mrc_events SEC(".maps");

static __always_inline void event_emit(__u32 peer, __u32 path, __u32 old_state,
				       __u32 new_state, __u32 reason,
				       __u32 age_us, __u64 now)
{
	struct mrc_event ev = {
		.ts_ns = now, .peer = peer, .path = path,
		.old_state = old_state, .new_state = new_state,
		.reason = reason, .age_us = age_us,
	};

	if (bpf_ringbuf_output(&mrc_events, &ev, sizeof(ev), 0))
		HSTAT_INC(events_lost);
}

#endif /* MRC_EVENTS_H */
