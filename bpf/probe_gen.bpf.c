// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * mrc_probe_gen: the agent's EV probes of one round in one system call.
 * The agent fills mrc_probe_out with the round's probes (struct
 * mrc_probe_out, mrc.h) and runs this program by BPF_PROG_TEST_RUN with
 * BPF_F_TEST_XDP_LIVE_FRAMES and repeat = the number of probes, as
 * xdp-trafficgen does: the kernel runs it once per frame of a page pool
 * made for that run and transmits every frame it redirects. Run k sends
 * entry k: its frame, its MRC header completed here (sequence, send
 * time, nonce, MAC) and out of its plane (bpf_redirect to the plane's
 * ndo_xdp_xmit). The wire format is the one the agent's AF_PACKET
 * fallback sends (mrcctl/agent/health.py probe_frame); the nonce was
 * recorded in mrc_probe_nonce by the agent before the run.
 *
 * The input frame is MRC_PROBE_FRAME_MAX bytes of room and a struct
 * mrc_probe_run. The pages are filled from it once per run and then
 * recycled with what this program wrote, so the run record lies behind
 * the room, where the program never writes, and the position inside the
 * run is kept here (gen_seen, gen_next): a test run executes on one CPU
 * with preemption off, and only the agent runs this program.
 * Never attached; loaded with the running instance's mrc_auth
 * (mrcctl/datapath/objects.py load_probe_gen).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "mrc.h"
#include "auth.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_PROBE_BATCH);
	__type(key, __u32);
	__type(value, struct mrc_probe_out);
} mrc_probe_out SEC(".maps");

__u32 gen_seen;
__u32 gen_next;

SEC("xdp")
int mrc_probe_gen(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct mrc_probe_run *run = data + MRC_PROBE_FRAME_MAX;
	const struct mrc_probe_out *e;
	struct mrc_hdr *mh;
	__u32 i, len, off;

	if ((void *)(run + 1) > data_end)
		return XDP_ABORTED;
	if (run->gen != gen_seen) {
		gen_seen = run->gen;
		gen_next = 0;
	}
	i = gen_next++;
	if (i >= run->n)
		return XDP_DROP;
	e = bpf_map_lookup_elem(&mrc_probe_out, &i);
	if (!e)
		return XDP_DROP;
	len = e->len;
	off = e->mrc_off;
	if (len < ETH_HLEN || len > MRC_PROBE_FRAME_MAX ||
	    off > MRC_PROBE_FRAME_MAX - sizeof(*mh) || off + sizeof(*mh) > len)
		return XDP_DROP;
	__builtin_memcpy(data, e->frame, MRC_PROBE_FRAME_MAX);
	mh = data + off;
	if ((void *)(mh + 1) > data_end)
		return XDP_DROP;
	mh->psn = bpf_htonl(e->seq);
	mh->tx_ts = bpf_htonl((__u32)(bpf_ktime_get_ns() / 1000));
	mh->seq0 = bpf_htonl((__u32)(e->nonce >> 32));
	mh->fb_ts = bpf_htonl((__u32)e->nonce);
	if (mh->flags & MRC_F_AUTH) {
		const struct mrc_auth_key *k = auth_key(e->peer);

		if (!k || off + sizeof(*mh) + MRC_AUTH_LEN > len ||
		    auth_sign(mh, data_end, k, NULL))
			return XDP_DROP;
	}
	if (bpf_xdp_adjust_tail(ctx, (int)len - (int)(MRC_PROBE_FRAME_MAX + sizeof(*run))))
		return XDP_DROP;
	return bpf_redirect(e->ifindex, 0);
}

char _license[] SEC("license") = "Dual BSD/GPL";
