/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Retransmission steering (transmit side). mrc_tx sends a TCP unit that
 * ends at or below the highest sequence its flow has sent on the path that
 * confirmed delivery most recently (mrc_peer_seq.ack_max_path): these are
 * the packets whose loss costs most. Right after a plane fails, before its
 * paths look suspect (hedge_after plus their evidence delay), TCP
 * retransmits what the plane lost; a retransmission sprayed onto the same
 * plane is lost again, and if nothing is sent after it RACK cannot notice -
 * TCP waits for its 200 ms RTO (seen in 2 of 5 hedged failover runs: the
 * flow's last unacknowledged unit resent onto the dead plane). OCP MRC
 * likewise moves retransmissions to another EV.
 */
#ifndef MRC_RETX_H
#define MRC_RETX_H

#include <stdbool.h>
#include <linux/bpf.h>
#include <linux/ip.h>
#include <bpf/bpf_helpers.h>
#include "mrc.h"
#include "sizing.h"
#include "stats.h"
#include "parsing.h"
#include "path.h"

#define RETX_HASH_SHIFT	26		/* top 6 bits pick one of MRC_TX_FLOWS */

/* Per peer: flow hash << 32 | end of the highest sequence sent. Writer:
 * mrc_tx (retx.h) only. TCP sends a flow from one CPU at a time (socket
 * lock), so plain stores suffice; a slot two flows share only costs a
 * misjudged unit. Made by the first TCP unit toward the peer (a hash
 * without preallocation: idle peers cost nothing). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MRC_N_PEER_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct mrc_tx_flows);
} mrc_tx_flows SEC(".maps");

static struct mrc_tx_flows retx_empty;

/* Is this TCP unit (payload [seq, seq + len)) a retransmission? Records
 * the new high otherwise. */
static __always_inline bool retx_check(__u32 peer_idx, const struct l3_flow *fl,
				       __u32 seq, __u32 len)
{
	struct mrc_tx_flows *f;
	__u32 h, end = seq + len;
	__u64 *slot, v;

	if (len == 0)
		return false;
	f = peer_entry(&mrc_tx_flows, peer_idx, &retx_empty);
	if (!f)
		return false;
	h = l3_flow_hash(fl);
	slot = &f->hi[(h >> RETX_HASH_SHIFT) & (MRC_TX_FLOWS - 1)];
	v = *slot;
	if ((__u32)(v >> 32) == h && (__s32)(end - (__u32)v) <= 0)
		return true;
	*slot = (__u64)h << 32 | end;
	return false;
}

/* The shortest a steered path's oldest outstanding unit must have waited
 * before its silence counts (retx_path_silent). */
#define RETX_SILENT_MIN_NS	1000000ULL

/*
 * Has path `pid` gone silent: a unit outstanding on it for more than twice
 * its recent coverage delay (evidence.h), at least RETX_SILENT_MIN_NS? Then
 * a retransmission is not steered to it even if it confirmed delivery
 * last. A flow stalled in an RTO sends nothing but the retransmission, so
 * no sibling's evidence moves and the judge (relative to the siblings)
 * cannot call that path overdue; steered there every time, each timed-out
 * retransmission was lost again when that path was the one that had died
 * (a fabric failover trial: 5 RTOs in a row, a 420 ms stall, until the
 * agent's probes retired the path). A burst of retransmissions within one
 * round trip still goes to the freshest path: its first is not overdue yet.
 * A global function: verified once.
 */
__attribute__((noinline)) int retx_path_silent(__u32 peer_idx, __u32 pid, __u64 now)
{
	struct mrc_path_live *live = path_live(peer_idx, pid);
	__u64 un, wait;

	if (!live)
		return 1;
	un = path_outstanding_ns(live);
	if (!un)
		return 0;
	wait = (__u64)live->ev_cov_max_us * 2000;
	if (wait < RETX_SILENT_MIN_NS)
		wait = RETX_SILENT_MIN_NS;
	return (__s64)(now - un) > (__s64)wait;
}

#endif /* MRC_RETX_H */
