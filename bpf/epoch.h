/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Receiver: which of a peer's restarts a DATA frame belongs to.
 *
 * A sender's PSNs start again at 0 when its maps are new (a `down` and
 * `up`), and an index may name another peer after an `up`. Without a
 * marker the receiver would judge the new PSNs against the old window:
 * reordering, late and duplicate counts that are not, and hedged units
 * dropped as duplicates of packets sent before the restart. Every header
 * carries the sender's epoch (mrc_hdr.epoch, random and new at every
 * `up`); the first frame of a new epoch restarts the peer's window and
 * duplicate filter.
 *
 * Around the switch, frames of the previous epoch are still in flight
 * (other planes, hedged copies). They are delivered but not accounted:
 * marking their PSNs in the restarted window or filter would make a
 * new-epoch packet of the same PSN look like a duplicate, and judging them
 * as a third epoch would restart the windows back and forth. The price is
 * that a hedged pair straddling the switch may deliver both copies, which
 * TCP takes as a duplicate segment.
 */
#ifndef MRC_EPOCH_H
#define MRC_EPOCH_H

#include <stdbool.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "mrc.h"
#include "sizing.h"
#include "dedup.h"
#include "reorder.h"

/* Per peer, see struct mrc_rx_epoch. Writer: mrc_rx (epoch.h). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_N_PEER_ENTRIES);
	__type(key, __u32);
	__type(value, struct mrc_rx_epoch);
} mrc_rx_epoch SEC(".maps");

/* Should a DATA frame of `epoch` from this peer be accounted (reorder
 * window, duplicate filter)? False only for the previous epoch's
 * stragglers. A new epoch restarts the peer's receive windows once: the
 * CPU whose compare-and-swap installs it does it. */
static __always_inline bool epoch_current(__u32 peer_idx, __u16 epoch)
{
	struct mrc_rx_epoch *e = bpf_map_lookup_elem(&mrc_rx_epoch, &peer_idx);
	__u32 want = (__u32)epoch | MRC_EPOCH_SEEN, cur;

	if (!e)
		return true;
	cur = e->cur;
	if (cur == want)
		return true;
	if (e->prev == want)
		return false;
	if (__sync_val_compare_and_swap(&e->cur, cur, want) != cur)
		return true;	/* another CPU installed an epoch just now */
	e->prev = cur;
	reorder_restart(peer_idx, cur != 0);
	dedup_restart(peer_idx);
	return true;
}

#endif /* MRC_EPOCH_H */
