/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * mrc wire format and map layouts: the one contract between the datapath
 * (tx.bpf.c, rx.bpf.c) and the control plane (mrcctl/wire.py mirrors every
 * constant and struct here; tests/unit/test_wire.py proves they agree).
 *
 * Everything on the wire is big-endian. Map values are host-endian except
 * addresses, which stay in network order so they can be copied into headers.
 */
#ifndef MRC_H
#define MRC_H

#include <linux/types.h>

#define MRC_VERSION		1
#define MRC_DEFAULT_UDP_PORT	4794	/* unassigned by IANA; configurable */
#define MRC_DEFAULT_EV_BASE	49152	/* first EV (outer UDP source port) */

#define MRC_MAX_PEERS		64
#define MRC_MAX_PATHS		256	/* per peer: planes x EVs */
#define MRC_MAX_PLANES		16
#define MRC_SLOTS		1024	/* spray slot table entries per peer */
#define MRC_PATH_IDX(peer, path) ((peer) * MRC_MAX_PATHS + (path))

/* Packet types (low nibble of ver_type). */
enum mrc_type {
	MRC_T_DATA		= 0,
	MRC_T_PROBE		= 1,	/* EV probe: answered by the peer's XDP program */
	MRC_T_PROBE_REPLY	= 2,
};

/* Header flags. */
#define MRC_F_FEEDBACK	0x01	/* fb_path/fb_ts carry an echo for the receiver */
#define MRC_F_HEDGE	0x02	/* duplicate copy sent for hedging */

/*
 * The MRC header follows the outer UDP header. One header covers one
 * spraying unit (a GSO super-packet): the kernel's UDP-tunnel segmentation
 * copies it into every wire segment, so the receiver derives the wire PSN of
 * segment i as psn + i, with i = (inner TCP seq - seq0) / seg_size.
 */
struct mrc_hdr {
	__u8	ver_type;	/* MRC_VERSION << 4 | enum mrc_type */
	__u8	flags;		/* MRC_F_* */
	__be16	path_id;	/* sender's path index toward this peer */
	__be32	psn;		/* PSN of the unit's first wire packet */
	__be32	tx_ts;		/* sender monotonic clock, microseconds mod 2^32 */
	__be16	segs;		/* wire packets in this unit (>= 1) */
	__be16	seg_size;	/* inner payload bytes per segment (gso_size) or 0 */
	__be32	seq0;		/* inner TCP sequence number of the first segment */
	__be16	fb_path;	/* feedback: a path of the receiver's that delivered */
	__be16	fb_rsvd;
	__be32	fb_ts;		/* feedback: that packet's tx_ts, echoed */
} __attribute__((packed));

#define MRC_HDR_LEN	28
#define MRC_OVERHEAD_V4	(20 + 8 + MRC_HDR_LEN)	/* outer IPv4 + UDP + MRC */
#define MRC_OVERHEAD_V6	(40 + 8 + MRC_HDR_LEN)	/* outer IPv6 + UDP + MRC */

/* Path states, as in OCP MRC. */
enum mrc_path_state {
	MRC_PATH_GOOD		= 0,
	MRC_PATH_ASSUMED_BAD	= 1,	/* set by the datapath / agent */
	MRC_PATH_DENIED		= 2,	/* set only by the operator */
};

/* Drop and verdict reasons, counted per CPU in mrc_drops. */
enum mrc_reason {
	MRC_R_RX_TRUNCATED	= 0,	/* MRC port but headers cut short */
	MRC_R_RX_BAD_VERSION	= 1,
	MRC_R_RX_UNKNOWN_PEER	= 2,	/* source not a configured peer on this plane */
	MRC_R_RX_UNKNOWN_PATH	= 3,	/* path_id beyond the peer's paths */
	MRC_R_RX_BAD_TYPE	= 4,
	MRC_R_RX_FRAGMENT	= 5,	/* outer IP fragment to the MRC port */
	MRC_R_RX_IP_OPTIONS	= 6,	/* outer IPv4 with options to the MRC port */
	MRC_R_RX_BAD_INNER	= 7,	/* inner packet not IPv4 or cut short */
	MRC_R_RX_DUPLICATE	= 8,	/* PSN already delivered (hedging) */
	MRC_R_RX_DECAP_FAIL	= 9,
	MRC_R_TX_NO_PEER	= 10,	/* overlay destination is not a peer */
	MRC_R_TX_NO_PATH	= 11,	/* peer has no usable path */
	MRC_R_TX_NOT_IPV4	= 12,	/* overlay carries IPv4 only */
	MRC_R_TX_ENCAP_FAIL	= 13,
	MRC_R_RX_PROBE_REPLIED	= 14,	/* not a drop: probes answered */
	MRC_R_RX_PROBE_REPLY	= 15,	/* not a drop: replies consumed */
	MRC_R_MAX		= 16,
};

/* mrc_cfg: ARRAY[1], instance-wide settings the control plane may change live. */
struct mrc_config {
	__u32	udp_port;	/* host order */
	__u32	overlay_ifindex;
	__u32	dead_after_us;	/* evidence older than this: path not used */
	__u32	flags;		/* MRC_CFG_* */
};
#define MRC_CFG_LIVENESS	0x01	/* judge path liveness in the datapath */
#define MRC_CFG_HEDGE		0x02	/* hedged (duplicate) sending on suspect paths */

/* mrc_peers: ARRAY[MRC_MAX_PEERS]. n_paths == 0 marks a free entry. */
struct mrc_peer {
	__u32	n_paths;
	__u32	table;		/* which of the two slot tables is live (0/1) */
	__u32	spray_mode;	/* enum mrc_spray */
	__u32	min_active;	/* ev_min_active */
	__be32	overlay;	/* the peer's overlay IPv4 address */
	__u32	ev_base;
};

enum mrc_spray {
	MRC_SPRAY_WEIGHTED	= 0,
	MRC_SPRAY_FLOWLET	= 1,
	MRC_SPRAY_HASH		= 2,
};

/*
 * mrc_slots: ARRAY[MRC_MAX_PEERS * 2], index peer * 2 + table. The control
 * plane fills the idle table, then flips mrc_peer.table: spraying never sees
 * a half-written table.
 */
struct mrc_slots {
	__u32	n;		/* slots in use, 1..MRC_SLOTS */
	__u8	slot[MRC_SLOTS];	/* path index */
};

/* mrc_paths: ARRAY[MRC_MAX_PEERS * MRC_MAX_PATHS], written by the control plane. */
struct mrc_path {
	__u32	ifindex;	/* plane device */
	__u16	ev;		/* outer UDP source port, host order */
	__u8	family;		/* 4 or 6 */
	__u8	plane;		/* plane index */
	__u8	smac[6];
	__u8	dmac[6];
	__be32	saddr[4];	/* IPv4 uses [0] */
	__be32	daddr[4];
	__u32	weight;
	__u32	admin;		/* MRC_PATH_DENIED when the operator denied it */
};

/* mrc_live: ARRAY[MRC_MAX_PEERS * MRC_MAX_PATHS], written by the datapath. */
struct mrc_path_live {
	__u64	last_ack_ns;	/* sender: newest evidence that this path delivers,
				 * dated by the evidence's send time: when the
				 * newest probe/data known delivered was sent
				 * (now - its echoed RTT), never moved back */
	__u64	last_rx_ns;	/* receiver: newest packet received on this path */
	__u32	last_rx_ts;	/* receiver: that packet's tx_ts, to echo back */
	__u32	state;		/* enum mrc_path_state */
	__u32	srtt_us;	/* smoothed RTT from echoes and probes */
	__u32	rtt_us;		/* last RTT sample */
};

/* mrc_peer_seq: ARRAY[MRC_MAX_PEERS], shared by all CPUs, atomically updated. */
struct mrc_peer_seq {
	__u64	psn;		/* next PSN to send */
	__u64	cursor;		/* spray slot cursor */
	__u64	fb_cursor;	/* which path to echo next */
	__u64	rx_psn_max;	/* receiver: highest wire PSN seen (a 32-bit
				 * wire PSN, compared wrap-safe) */
};

/* mrc_path_stats: PERCPU_ARRAY[MRC_MAX_PEERS * MRC_MAX_PATHS]. */
struct mrc_path_stats {
	__u64	tx_packets;	/* wire packets (GSO segments counted) */
	__u64	tx_bytes;
	__u64	rx_packets;
	__u64	rx_bytes;
	__u64	rx_ooo;		/* arrived below the highest PSN seen */
	__u64	rx_dup;
	__u64	probes_tx;
	__u64	probes_rx;	/* replies received */
};

/* mrc_drops: PERCPU_ARRAY[MRC_R_MAX] of __u64 packets. */

/* mrc_peer_ip: HASH overlay IPv4 (network order) -> peer index (__u32). */

/* mrc_rx_peers: HASH, which source may send MRC on which plane. */
struct mrc_rx_key {
	__u32	ifindex;
	__u32	family;		/* 4 or 6 */
	__be32	addr[4];
};

struct mrc_rx_peer {
	__u32	peer;
	__u32	plane;
};

#endif /* MRC_H */
