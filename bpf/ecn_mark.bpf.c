// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Testbed only (mrcctl fabric): a congested link that marks instead of
 * dropping, as an ECN-capable switch queue would. This kernel has no
 * RED/CoDel qdisc, so the link's tc egress marks CE on every ECN-capable
 * (ECT) IPv4 or IPv6 packet it sends; not-ECT packets pass unmarked.
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

SEC("tc")
int ecn_mark(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		return TC_ACT_OK;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *iph = (void *)(eth + 1);
		__u16 old, new;

		if ((void *)(iph + 1) > data_end || !(iph->tos & ECN_MASK))
			return TC_ACT_OK;
		old = *(__u16 *)iph;
		iph->tos |= ECN_CE;
		new = *(__u16 *)iph;
		bpf_l3_csum_replace(skb, IPV4_CSUM_OFF, old, new, sizeof(__u16));
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6h = (void *)(eth + 1);

		/* ECN: the low 2 bits of the traffic class, bits 4-5 of flow_lbl[0] */
		if ((void *)(ip6h + 1) > data_end || !(ip6h->flow_lbl[0] & (ECN_MASK << 4)))
			return TC_ACT_OK;
		ip6h->flow_lbl[0] |= ECN_CE << 4;
	}
	return TC_ACT_OK;
}

char _license[] SEC("license") = "Dual BSD/GPL";
