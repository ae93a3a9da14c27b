// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * mrc_ctl: the agent's changes to state the datapath owns, carried out in
 * the datapath. The agent decides that a path is to be retired (its plane
 * went down, its probes go unanswered) but must not write mrc_live itself:
 * a whole-entry write from user space would undo whatever the programs
 * wrote since it read the entry (an RTT sample, a recovery). It runs this
 * program by BPF_PROG_TEST_RUN on a frame holding a struct mrc_ctl_req; the
 * program makes the same compare-and-swap transition as the transmit judge,
 * on the live entry in place. Never attached; the agent loads it with the
 * running instance's maps (mrcctl/datapath/objects.py load_ctl).
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "maps.h"

SEC("xdp")
int mrc_ctl(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct mrc_ctl_req *r = data;
	struct mrc_path_live *live;

	if ((void *)(r + 1) > data_end || r->op != MRC_CTL_RETIRE)
		return XDP_ABORTED;
	live = path_live(r->peer, r->path);
	if (!live)
		return XDP_ABORTED;
	if (__sync_val_compare_and_swap(&live->state, MRC_PATH_GOOD,
					MRC_PATH_ASSUMED_BAD) != MRC_PATH_GOOD)
		return XDP_DROP;
	/* No ring event: the agent logs its own reason (link_down,
	 * probe_loss). */
	path_retired(live, bpf_ktime_get_ns());
	return XDP_PASS;
}

char _license[] SEC("license") = "Dual BSD/GPL";
