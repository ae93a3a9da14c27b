// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Testbed only (mrcctl fabric): a congested link that marks instead of
 * dropping, as an ECN-capable switch queue would. This kernel has no
 * RED/CoDel qdisc, so the link's tc egress marks CE on ECN-capable (ECT)
 * IPv4 or IPv6 packets; not-ECT packets pass unmarked. Which ones: every
 * one while ecn_cfg.rate_Bps is 0 (a link that is always congested), else
 * those that find more than ecn_cfg.queue_bytes in a phantom queue that
 * drains at rate_Bps: a link of that rate under more load than it carries
 * marks, one under less does not (HULL's phantom queues, Alizadeh et al.,
 * NSDI 2012), and the marks track the load as it comes and goes.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define ECN_MASK	0x03
#define ECN_CE		0x03
#define IPV4_TOS_OFF	(ETH_HLEN + 1)
#define IPV4_CSUM_OFF	(ETH_HLEN + 10)

struct ecn_cfg {
	__u64	rate_Bps;	/* phantom queue's drain rate, bytes/s; 0: mark all */
	__u64	queue_bytes;	/* mark above this backlog */
};

struct ecn_state {
	__u64	backlog;	/* bytes in the phantom queue at last_ns */
	__u64	last_ns;
	__u64	marked;		/* wire packets marked (a GSO skb's segments each) */
	__u64	seen;		/* wire packets seen (every one fills the queue) */
};

/* Written by the testbed (mrcctl/lab/fabric.py) once, at attach. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ecn_cfg);
} ecn_cfg SEC(".maps");

/* Shared by the CPUs sending on the link: plain updates, a race costs an
 * approximate backlog, which a testbed's congestion signal tolerates. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ecn_state);
} ecn_state SEC(".maps");

static __always_inline int congested(__u32 len, __u32 segs)
{
	__u32 zero = 0;
	struct ecn_cfg *cfg = bpf_map_lookup_elem(&ecn_cfg, &zero);
	struct ecn_state *st = bpf_map_lookup_elem(&ecn_state, &zero);
	__u64 now, drained;

	if (!cfg || !st)
		return 1;
	st->seen += segs;
	if (!cfg->rate_Bps)
		return 1;
	now = bpf_ktime_get_ns();
	drained = st->last_ns ? (now - st->last_ns) * cfg->rate_Bps / 1000000000ULL : 0;
	st->last_ns = now;
	st->backlog = (st->backlog > drained ? st->backlog - drained : 0) + len;
	return st->backlog > cfg->queue_bytes;
}

static __always_inline void count_mark(__u32 segs)
{
	__u32 zero = 0;
	struct ecn_state *st = bpf_map_lookup_elem(&ecn_state, &zero);

	if (st)
		st->marked += segs;
}

SEC("tc")
int ecn_mark(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	__u32 segs = skb->gso_segs ? skb->gso_segs : 1;

	if ((void *)(eth + 1) > data_end)
		return TC_ACT_OK;
	/* every packet fills the queue; only ECN-capable ones can be marked */
	if (!congested(skb->len, segs))
		return TC_ACT_OK;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *iph = (void *)(eth + 1);
		__u16 old, new;

		if ((void *)(iph + 1) > data_end || !(iph->tos & ECN_MASK))
			return TC_ACT_OK;
		count_mark(segs);
		old = *(__u16 *)iph;
		iph->tos |= ECN_CE;
		new = *(__u16 *)iph;
		bpf_l3_csum_replace(skb, IPV4_CSUM_OFF, old, new, sizeof(__u16));
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6h = (void *)(eth + 1);

		/* ECN: the low 2 bits of the traffic class, bits 4-5 of flow_lbl[0] */
		if ((void *)(ip6h + 1) > data_end || !(ip6h->flow_lbl[0] & (ECN_MASK << 4)))
			return TC_ACT_OK;
		count_mark(segs);
		ip6h->flow_lbl[0] |= ECN_CE << 4;
	}
	return TC_ACT_OK;
}

char _license[] SEC("license") = "Dual BSD/GPL";
