/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * mrc maps. Both tx.bpf.o and rx.bpf.o include this file; the loader
 * (mrcctl/loader.py load_objects) creates them with the first object and
 * hands the same fds to the second with bpf_map__reuse_fd, which is how the
 * transmit and receive programs share state. Nothing is pinned: later
 * invocations find the maps by id (see mrcctl/state.py for why).
 *
 * Layouts of keys and values: mrc.h.
 */
#ifndef MRC_MAPS_H
#define MRC_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "mrc.h"

#define MRC_N_PATH_ENTRIES	(MRC_MAX_PEERS * MRC_MAX_PATHS)

/* Instance-wide settings, [0] only. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mrc_config);
} mrc_cfg SEC(".maps");

/* Peer table, indexed by peer number. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_MAX_PEERS);
	__type(key, __u32);
	__type(value, struct mrc_peer);
} mrc_peers SEC(".maps");

/* Two spray slot tables per peer (peer * 2 + table): the control plane
 * fills the idle one and flips mrc_peer.table. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_MAX_PEERS * 2);
	__type(key, __u32);
	__type(value, struct mrc_slots);
} mrc_slots SEC(".maps");

/* Path configuration, MRC_PATH_IDX(peer, path). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_N_PATH_ENTRIES);
	__type(key, __u32);
	__type(value, struct mrc_path);
} mrc_paths SEC(".maps");

/* Path liveness, written by the datapath (shared across CPUs). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_N_PATH_ENTRIES);
	__type(key, __u32);
	__type(value, struct mrc_path_live);
} mrc_live SEC(".maps");

/* Per-peer sequence state, updated with atomics. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_MAX_PEERS);
	__type(key, __u32);
	__type(value, struct mrc_peer_seq);
} mrc_peer_seq SEC(".maps");

/* Per-CPU path counters: no atomics on the hot path. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MRC_N_PATH_ENTRIES);
	__type(key, __u32);
	__type(value, struct mrc_path_stats);
} mrc_path_stats SEC(".maps");

/* Per-CPU packet counts by enum mrc_reason. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MRC_R_MAX);
	__type(key, __u32);
	__type(value, __u64);
} mrc_drops SEC(".maps");

/* Overlay IPv4 (network order) -> peer index. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MRC_MAX_PEERS);
	__type(key, __be32);
	__type(value, __u32);
} mrc_peer_ip SEC(".maps");

/* (plane ifindex, family, underlay source) -> peer: the receive-side
 * source check. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MRC_MAX_PEERS * MRC_MAX_PLANES);
	__type(key, struct mrc_rx_key);
	__type(value, struct mrc_rx_peer);
} mrc_rx_peers SEC(".maps");

/* Path events for the control plane (failover work). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} mrc_events SEC(".maps");

/* Receiver reorder window per peer (shared: PSNs of one peer arrive on
 * every CPU), see bpf/reorder.h. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_MAX_PEERS);
	__type(key, __u32);
	__type(value, struct mrc_rx_win);
} mrc_rx_win SEC(".maps");

/* Per-CPU reorder/loss counters and histogram per peer. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MRC_MAX_PEERS);
	__type(key, __u32);
	__type(value, struct mrc_reorder);
} mrc_reorder SEC(".maps");

/* Path delay from fresh feedback echoes (bpf/reorder.h). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_N_PATH_ENTRIES);
	__type(key, __u32);
	__type(value, struct mrc_path_delay);
} mrc_path_delay SEC(".maps");

/* Flowlet spraying: inner flow -> its current slot (bpf/spray.h). LRU, so
 * idle flows age out without the control plane. */
#define MRC_FLOWLETS		65536
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MRC_FLOWLETS);
	__type(key, struct mrc_flowlet_key);
	__type(value, struct mrc_flowlet);
} mrc_flowlets SEC(".maps");

/* Hedged-unit duplicate filter per peer (bpf/health.h). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_MAX_PEERS);
	__type(key, __u32);
	__type(value, struct mrc_dedup);
} mrc_dedup SEC(".maps");

/* Highest TCP sequence sent per inner flow, per peer (bpf/health.h). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_MAX_PEERS);
	__type(key, __u32);
	__type(value, struct mrc_tx_flows);
} mrc_tx_flows SEC(".maps");

/* Per-CPU path health counters, [0] only. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mrc_hstats);
} mrc_hstats SEC(".maps");

#endif /* MRC_MAPS_H */
