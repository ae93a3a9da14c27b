// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Helper test: dedup_seen (dedup.h) for peer frame[0:4], wire PSN
 * frame[4:8] (host order). Returns 1 if the PSN was seen before.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "maps.h"

SEC("xdp")
int test_dedup(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 *in = data;

	if ((void *)(in + 2) > data_end)
		return XDP_ABORTED;
	return dedup_seen(in[0], in[1]);
}

char _license[] SEC("license") = "Dual BSD/GPL";
