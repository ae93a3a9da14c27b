/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * PAWS guard (receive side). RFC 7323's PAWS check drops a TCP segment
 * whose timestamp (TSval) is older than the newest one the receiver has
 * recorded at the left edge of its window (ts_recent) by more than one
 * tick: Linux ticks in milliseconds. Spraying a flow over paths whose
 * queues differ by a millisecond or two is enough: a retransmission that
 * fills a hole on a short queue moves ts_recent past the timestamps of new
 * data still queued on a longer path, and that data is dropped on
 * arrival as if lost (hundreds of TCP_RFC7323_PAWS drops per 3 s transfer
 * over 4 tbf-shaped planes; when the dropped segment is the one the
 * window waits for, nothing reveals it but TCP's 200 ms RTO - 3 of 5
 * RTOs in 30 failover trials, one of them with no fault at all).
 *
 * So the receiver keeps, per inner flow, the newest TSval it delivered
 * and lifts a data segment's older one to one tick below it (the checksum
 * follows, csum_replace4; the caller leaves pure ACKs alone, rx.bpf.c). PAWS still refuses what it exists for - segments a
 * full sequence wrap old: PAWS_GUARD_TICKS bounds how far back a
 * timestamp is lifted. Only the layout Linux and most stacks send is
 * recognised (NOP, NOP, timestamps first among the options).
 */
#ifndef MRC_PAWS_H
#define MRC_PAWS_H

#include <linux/bpf.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "mrc.h"
#include "sizing.h"
#include "parsing.h"
#include "csum.h"

#define PAWS_HASH_SHIFT		26	/* top 6 bits pick one of MRC_RX_FLOWS */
#define PAWS_GUARD_TICKS	1000	/* 1 s at Linux's millisecond ticks */
#define PAWS_OPT_NOP_NOP_TS	0x0101080aU	/* NOP, NOP, kind 8, length 10 */

/* Made by the first timestamped TCP segment from the peer (a hash
 * without preallocation: peers that send us no TCP cost nothing). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MRC_N_PEER_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct mrc_rx_flows);
} mrc_rx_flows SEC(".maps");

static struct mrc_rx_flows paws_empty;

/* The TCP header at tcph (its options within data_end checked here) of
 * a segment from peer_idx about to be delivered. Returns 1 if its TSval
 * was lifted. */
static __always_inline int paws_guard(__u32 peer_idx, const struct l3_flow *fl,
				      struct tcphdr *tcph, void *data_end)
{
	__u32 *opt = (__u32 *)(tcph + 1);
	struct mrc_rx_flows *f;
	__u32 h, ts, newest, lifted;
	__u64 *slot, v;
	__s32 behind;

	if (tcph->doff < 8 || (void *)(opt + 3) > data_end ||
	    opt[0] != bpf_htonl(PAWS_OPT_NOP_NOP_TS))
		return 0;
	f = peer_entry(&mrc_rx_flows, peer_idx, &paws_empty);
	if (!f)
		return 0;
	ts = bpf_ntohl(opt[1]);
	h = l3_flow_hash(fl);
	slot = &f->ts[(h >> PAWS_HASH_SHIFT) & (MRC_RX_FLOWS - 1)];
	v = *slot;
	newest = (__u32)v;
	behind = (__s32)(newest - ts);
	if ((__u32)(v >> 32) != h || behind < 0) {
		*slot = (__u64)h << 32 | ts;
		return 0;
	}
	if (behind <= 1 || behind > PAWS_GUARD_TICKS)
		return 0;
	lifted = bpf_htonl(newest - 1);
	csum_replace4(&tcph->check, opt[1], lifted);
	opt[1] = lifted;
	return 1;
}

#endif /* MRC_PAWS_H */
