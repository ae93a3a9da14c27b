// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Helper tests of encap.h: encap_push on a tc program (path 0 or 1 of peer
 * 0 from mrc_paths, by the frame's first destination MAC byte's low bit; a
 * fixed unit; PSNs from mrc_peer_seq[0]) and decap_xdp on an XDP program
 * (the overhead by the outer ethertype). Both return 0 on success.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include "maps.h"
#include "encap.h"

SEC("tc")
int test_encap(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct mrc_unit u = {
		.tx_ts = 0x11223344, .seq0 = 0x55667788, .fb_ts = 0x99aabbcc,
		.path_id = 1, .segs = 3, .seg_size = 1400, .fb_path = 2,
		.flags = MRC_F_FEEDBACK, .tos = 0xb8,
	};
	struct mrc_peer_seq *seq = peer_seq(0);
	struct mrc_path *path;

	if (data + 1 > data_end || !seq)
		return TC_ACT_SHOT;
	path = path_cfg(0, *(__u8 *)data & 1);
	if (!path)
		return TC_ACT_SHOT;
	return encap_push(skb, path, &u, 4794, &seq->psn) ? TC_ACT_SHOT : TC_ACT_OK;
}

SEC("xdp")
int test_decap(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		return XDP_ABORTED;
	return decap_xdp(ctx, eth->h_proto == bpf_htons(ETH_P_IP) ?
				 MRC_OVERHEAD_V4 : MRC_OVERHEAD_V6,
			 ETH_P_IP) ? XDP_DROP : XDP_PASS;
}

char _license[] SEC("license") = "Dual BSD/GPL";
