// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Helper test: path_allowed / path_usable (path.h) on path `pid` of peer
 * 0 as the test wrote it into mrc_paths / mrc_live. In: frame[0:4] pid.
 * Returns allowed | usable << 1 | via_neigh << 2, or 0xff when the map
 * entry is missing.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "maps.h"

SEC("xdp")
int test_path(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct mrc_path *p;
	struct mrc_path_live *l;
	__u32 pid;

	if (data + 4 > data_end)
		return XDP_ABORTED;
	pid = *(__u32 *)data;
	p = path_cfg(0, pid);
	l = path_live(0, pid);
	if (!p || !l)
		return 0xff;
	return path_allowed(p, path_idx(0, pid)) |
	       path_usable(p, l, path_idx(0, pid)) << 1 |
	       path_usable_at(0, pid & (MRC_STRIDE - 1)) << 3 |
	       path_via_neigh(p) << 2;
}

char _license[] SEC("license") = "Dual BSD/GPL";
