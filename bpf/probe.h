/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Probe replies are genuine only if they echo the nonce of a probe the agent
 * sent (issue #13.8): a host that can send from a peer's underlay address
 * but does not see our probes cannot forge the RTT samples and recovery
 * that a reply carries.
 */
#ifndef MRC_PROBE_H
#define MRC_PROBE_H

#include <stdbool.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "mrc.h"
#include "path.h"

/* Outstanding probes per path, see struct mrc_probe_nonce. Writer: agent
 * (health) only. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_N_PATH_ENTRIES);
	__type(key, __u32);
	__type(value, struct mrc_probe_nonce);
} mrc_probe_nonce SEC(".maps");

/* Does this PROBE_REPLY on our path echo the nonce its probe was sent with? */
static __always_inline bool probe_reply_genuine(__u32 peer_idx, __u32 path_id,
						const struct mrc_hdr *mh)
{
	struct mrc_probe_nonce *pn = path_entry(&mrc_probe_nonce, peer_idx, path_id);
	__u32 seq = bpf_ntohl(mh->psn), i = seq & (MRC_PROBE_RING - 1);
	__u64 nonce = (__u64)bpf_ntohl(mh->seq0) << 32 | bpf_ntohl(mh->fb_ts);

	return pn && nonce && pn->seq[i] == seq && pn->nonce[i] == nonce;
}

#endif /* MRC_PROBE_H */
