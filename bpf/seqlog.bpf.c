// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Testbed only (scripts/bench_failover.py --seqlog): which inner TCP
 * sequence ranges left the sender on which path, and when they reached the
 * receiver, so that a stall can be traced to the data behind it (was the
 * hole ever resent? on which EV?) instead of guessed at from TCP's own
 * counters. seqlog_tx runs on the sending host's plane egress and reads
 * MRC frames (outer IPv4, inner IPv4 TCP; a GSO unit is one record);
 * seqlog_rx runs on the receiving host's plane ingress, after mrc_rx has
 * decapsulated, and reads the inner TCP segments. Both only record and
 * always pass the packet on. Records go round a ring of SEQLOG_N entries;
 * seqlog_n counts them (0: tx, 1: rx) and is reset by the reader.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <linux/tcp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "mrc.h"

#define SEQLOG_N	(1U << 20)	/* records per direction: ~3 s of 1 Gbit/s */

struct seqlog_tx_rec {
	__u64	ts_ns;		/* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
	__u32	seq;		/* inner TCP sequence of the first byte */
	__u32	len;		/* inner TCP payload bytes (the whole unit) */
	__u32	psn;
	__u32	ifindex;	/* the plane device */
	__u16	ev;		/* outer UDP source port */
	__u8	flags;		/* MRC_F_* */
	__u8	pad[5];
};

struct seqlog_rx_rec {
	__u64	ts_ns;
	__u32	seq;
	__u32	len;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SEQLOG_N);
	__type(key, __u32);
	__type(value, struct seqlog_tx_rec);
} seqlog_tx SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SEQLOG_N);
	__type(key, __u32);
	__type(value, struct seqlog_rx_rec);
} seqlog_rx SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} seqlog_n SEC(".maps");

/* The next ring slot of direction `dir`, or NULL. */
static __always_inline void *seqlog_slot(void *ring, __u32 dir)
{
	__u64 *n = bpf_map_lookup_elem(&seqlog_n, &dir);
	__u32 i;

	if (!n)
		return NULL;
	i = (__u32)__sync_fetch_and_add(n, 1) & (SEQLOG_N - 1);
	return bpf_map_lookup_elem(ring, &i);
}

/* The TCP header of an IPv4 packet at `l3` and its payload length given
 * the bytes from l3 to the packet's end, or NULL. */
static __always_inline struct tcphdr *seqlog_tcp(void *l3, void *end, __u32 l3_len,
						  __u32 *plen)
{
	struct iphdr *ip = l3;
	struct tcphdr *th;
	__u32 hl;

	if ((void *)(ip + 1) > end || ip->version != 4 || ip->protocol != IPPROTO_TCP)
		return NULL;
	th = l3 + ip->ihl * 4;
	if ((void *)(th + 1) > end)
		return NULL;
	hl = ip->ihl * 4 + th->doff * 4;
	if (l3_len <= hl)
		return NULL;		/* no payload: an ACK */
	*plen = l3_len - hl;
	return th;
}

SEC("tc")
int seqlog_tx_prog(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct udphdr *uh;
	struct mrc_hdr *m;
	struct tcphdr *th;
	struct seqlog_tx_rec *r;
	__u32 inner, plen;

	if ((void *)(ip + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP) ||
	    ip->protocol != IPPROTO_UDP || ip->ihl != 5)
		return TC_ACT_UNSPEC;
	uh = (void *)(ip + 1);
	m = (void *)(uh + 1);
	if ((void *)(m + 1) > end || (m->ver_type & 0x0f) != MRC_T_DATA)
		return TC_ACT_UNSPEC;
	inner = sizeof(*eth) + sizeof(*ip) + sizeof(*uh) + MRC_HDR_LEN +
		((m->flags & MRC_F_AUTH) ? MRC_AUTH_LEN : 0);
	if (inner > 256 || skb->len <= inner)
		return TC_ACT_UNSPEC;
	th = seqlog_tcp(data + inner, end, skb->len - inner, &plen);
	if (!th)
		return TC_ACT_UNSPEC;
	r = seqlog_slot(&seqlog_tx, 0);
	if (!r)
		return TC_ACT_UNSPEC;
	r->ts_ns = bpf_ktime_get_ns();
	r->seq = bpf_ntohl(th->seq);
	r->len = plen;
	r->psn = bpf_ntohl(m->psn);
	r->ifindex = skb->ifindex;
	r->ev = bpf_ntohs(uh->source);
	r->flags = m->flags;
	return TC_ACT_UNSPEC;
}

SEC("tc")
int seqlog_rx_prog(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct seqlog_rx_rec *r;
	struct tcphdr *th;
	__u32 plen;

	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return TC_ACT_UNSPEC;
	th = seqlog_tcp(eth + 1, end, skb->len - sizeof(*eth), &plen);
	if (!th)
		return TC_ACT_UNSPEC;
	r = seqlog_slot(&seqlog_rx, 1);
	if (!r)
		return TC_ACT_UNSPEC;
	r->ts_ns = bpf_ktime_get_ns();
	r->seq = bpf_ntohl(th->seq);
	r->len = plen;
	return TC_ACT_UNSPEC;
}

char _license[] SEC("license") = "Dual BSD/GPL";
