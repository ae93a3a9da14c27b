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
 * (health) only. The agent probes only paths in use or out of service, so
 * most paths of thousands of idle peers never have an entry: a hash
 * without preallocation (96 bytes per path preallocated: 12 MiB at 4,096
 * peers x 32 paths); no entry means no probe outstanding. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MRC_N_PATH_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
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

/*
 * Probes are answered in place with XDP_TX; without a bound, anyone who can
 * send from a peer's address on a plane makes us transmit at line rate.
 * Per (peer, plane) a GCRA token bucket (one __u64: the theoretical arrival
 * time of the next probe) allows PROBE_RL_BURST probes at once and
 * 1e9 / PROBE_RL_GAP_NS per second after that; the rest is dropped
 * (MRC_R_RX_PROBE_LIMITED). The agent sends one probe per path per
 * health.probe_interval_ms: the default 20 ms leaves room for 160 paths on
 * one plane of a peer. Per plane, so that a flood on one plane does not
 * silence the peer's probes on the others. Plain load and store: two CPUs
 * racing let a probe or two more through, which does not matter.
 */
#define PROBE_RL_GAP_NS		(1000000000ULL / 8192)
#define PROBE_RL_BURST		512

/* Writer: mrc_rx (probe.h) only. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_N_PEER_ENTRIES * MRC_MAX_PLANES);
	__type(key, __u32);
	__type(value, __u64);
} mrc_probe_rl SEC(".maps");

/* May we answer this probe from peer_idx on plane? */
static __always_inline bool probe_allowed(__u32 peer_idx, __u32 plane, __u64 now)
{
	__u32 key = peer_idx * MRC_MAX_PLANES + plane;
	__u64 *tat, t;

	if (plane >= MRC_MAX_PLANES)
		return false;
	tat = bpf_map_lookup_elem(&mrc_probe_rl, &key);
	if (!tat)
		return false;
	t = *tat;
	if (t < now)
		t = now;
	if (t - now > (PROBE_RL_BURST - 1) * PROBE_RL_GAP_NS)
		return false;
	*tat = t + PROBE_RL_GAP_NS;
	return true;
}

#endif /* MRC_PROBE_H */
