/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * mrc wire format and map layouts: the one contract between the datapath
 * (tx.bpf.c, rx.bpf.c) and the control plane (mrcctl/datapath/abi.py mirrors every
 * constant and struct here; tests/unit/test_wire.py proves they agree).
 *
 * Everything on the wire is big-endian. Map values are host-endian except
 * addresses, which stay in network order so they can be copied into headers.
 *
 * Every map value field names its writer(s): "agent" is mrcctl (the loader at
 * `up`, the agent's tasks, operator commands), mrc_tx / mrc_rx the programs,
 * with the header that holds the write. A field has one writer, or writers
 * that hand it over by compare-and-swap (mrc_live.state) or in turn (the
 * loader at `up`, which stops the agent first, then the agent); the one
 * exception left is mrc_peers, said there. The maps themselves
 * are defined in the header of the concern that owns them (maps.h lists
 * them).
 */
#ifndef MRC_H
#define MRC_H

#include <linux/types.h>

#define MRC_VERSION		1
#define MRC_DEFAULT_UDP_PORT	4794	/* unassigned by IANA; configurable */
#define MRC_DEFAULT_EV_BASE	49152	/* first EV (outer UDP source port) */

/* Sizes: the per-peer and per-path maps are sized at load time from the
 * config (struct mrc_sizing below); these are the bounds and the objects'
 * compiled-in defaults. */
#define MRC_DEFAULT_PEERS	64	/* per-peer entries unless the loader says */
#define MRC_PEERS_LIMIT		16384	/* most per-peer entries the loader sets */
#define MRC_MAX_PATHS		256	/* per peer: planes x EVs; the largest stride */
#define MRC_PATH_SHIFT_MAX	8	/* log2(MRC_MAX_PATHS) */
#define MRC_MAX_PLANES		16
#define MRC_SLOTS		1024	/* spray slot table entries per peer */
/* receiver reorder accounting, see struct mrc_rx_win */
#define MRC_WIN_WORDS		64	/* window: 4096 PSNs */
#define MRC_HIST_BUCKETS	16	/* per peer reorder histogram */

/*
 * The sizing of one loaded datapath, in each object's .rodata.sizing
 * (bpf/sizing.h): written by the loader (mrcctl/datapath/objects.py, from
 * the config: mrcctl/datapath/abi.py Sizing) before load, frozen after it,
 * so the verifier knows both values as constants. Every per-peer map holds
 * `peers` entries; every per-path map peers << path_shift, path `path` of
 * peer `peer` at MRC_PATH_IDX(peer, path) = peer << path_shift | path
 * (path < 1 << path_shift, the stride). Writer: agent (loader) only.
 */
struct mrc_sizing {
	__u32	peers;		/* 1..MRC_PEERS_LIMIT */
	__u32	path_shift;	/* 0..MRC_PATH_SHIFT_MAX */
};

/* Packet types (low nibble of ver_type). */
enum mrc_type {
	MRC_T_DATA		= 0,
	MRC_T_PROBE		= 1,	/* EV probe: answered by the peer's XDP program */
	MRC_T_PROBE_REPLY	= 2,
	MRC_T_FEEDBACK		= 3,	/* evidence without data: fb_path/fb_ts echo
					 * a DATA unit the sender of this frame
					 * received (bpf/feedback.h) */
	MRC_T_TRACE		= 4,	/* EV trace: sent with a small TTL for the
					 * routers on the EV's way to answer (ICMP
					 * time exceeded names the hop: the agent's
					 * EV map); one that reaches a peer is
					 * dropped there, counted MRC_R_RX_TRACE */
};

/* Header flags. */
#define MRC_F_FEEDBACK	0x01	/* fb_path/fb_ts carry an echo for the receiver */
#define MRC_F_HEDGE	0x02	/* duplicate copy sent for hedging */
#define MRC_F_IPID	0x04	/* non-TCP unit: seq0 holds the inner IPv4 ID of
				 * its first segment, segment i carries ID + i */
#define MRC_F_AUTH	0x08	/* a MRC_AUTH_LEN-byte MAC follows the header (bpf/auth.h) */
#define MRC_F_ECE	0x10	/* with MRC_F_FEEDBACK: the echoed path (fb_path)
				 * brought a CE-marked packet lately (bpf/congest.h) */
#define MRC_F_ELOSS	0x20	/* with MRC_F_FEEDBACK: the echoed path lost wire
				 * packets lately, as its path_seq or its units'
				 * segments showed (bpf/congest.h) */
#define MRC_F_EHELD	0x40	/* with MRC_F_FEEDBACK: the echoed receipt waited
				 * FEEDBACK_HELD_NS or more for a reverse packet
				 * to carry it, so its age is not the path's
				 * delay: the sender takes no delay sample from
				 * it (bpf/feedback.h, evidence.h) */
/* A non-TCP inner IPv6 GSO unit (UDP_SEGMENT) has no field that tells its
 * segments apart (no IPv6 ID; UDP datagrams carry no offset): it is sent
 * with segs = 1 and one PSN, every segment repeating it, and never hedged
 * (the duplicate filter would drop segments 2..n). tx.bpf.c. */

/*
 * The MRC header follows the outer UDP header. One header covers one
 * spraying unit (a GSO super-packet): the kernel's UDP-tunnel segmentation
 * copies it into every wire segment, so the receiver derives the wire PSN of
 * segment i as psn + i, with i = (inner TCP seq - seq0) / seg_size, or, for a
 * non-TCP unit (UDP GSO, MRC_F_IPID), i = inner IPv4 ID - seq0 (mod 2^16):
 * GSO gives segment i of an IPv4 unit the ID of the first plus i.
 */
struct mrc_hdr {
	__u8	ver_type;	/* MRC_VERSION << 4 | enum mrc_type */
	__u8	flags;		/* MRC_F_* */
	__be16	path_id;	/* sender's path index toward this peer */
	__be32	psn;		/* PSN of the unit's first wire packet */
	__be32	tx_ts;		/* sender monotonic clock, microseconds mod 2^32 */
	__be16	segs;		/* wire packets in this unit (>= 1) */
	__be16	seg_size;	/* inner payload bytes per segment (gso_size) or 0 */
	__be32	seq0;		/* inner TCP sequence number of the first segment;
				 * with MRC_F_IPID the first segment's inner IPv4 ID */
	__u8	path_seq;	/* DATA: the sender's count of units on path_id
				 * (mod 2^8; hedged units repeat the last and
				 * are not counted): a gap the receiver sees
				 * is units lost on that path (bpf/congest.h) */
	__u8	fb_path;	/* feedback: a path of the receiver's that
				 * delivered (< MRC_MAX_PATHS) */
	__be16	epoch;		/* the sender's epoch (mrc_config.epoch, new at
				 * every `up`): a receiver seeing a new one
				 * restarts its windows for the peer instead of
				 * judging restarted PSNs as old (bpf/epoch.h) */
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
	MRC_R_RX_BAD_INNER	= 7,	/* inner packet not IPv4 / IPv6 or cut short */
	MRC_R_RX_DUPLICATE	= 8,	/* PSN already delivered (hedging) */
	MRC_R_RX_DECAP_FAIL	= 9,
	MRC_R_TX_NO_PEER	= 10,	/* overlay destination is not a peer */
	MRC_R_TX_NO_PATH	= 11,	/* peer has no usable path */
	MRC_R_TX_NOT_IPV4	= 12,	/* not IPv4 or IPv6 (the overlay carries IP) */
	MRC_R_TX_ENCAP_FAIL	= 13,
	MRC_R_RX_PROBE_REPLIED	= 14,	/* not a drop: probes answered */
	MRC_R_RX_PROBE_REPLY	= 15,	/* not a drop: replies consumed */
	MRC_R_RX_PASS_VLAN	= 16,	/* not a drop: VLAN-tagged, passed untouched */
	MRC_R_RX_PASS_FRAGMENT	= 17,	/* not a drop: non-first UDP fragment, passed */
	MRC_R_RX_INNER_SRC	= 18,	/* inner source not owned by the sending peer */
	MRC_R_RX_INNER_DST	= 19,	/* inner destination not served here */
	MRC_R_RX_WRONG_PLANE	= 20,	/* path id of another plane than the frame's */
	MRC_R_RX_BAD_NONCE	= 21,	/* probe reply without an outstanding probe's nonce */
	MRC_R_RX_ECN_NOT_ECT	= 22,	/* CE outside on a not-ECT inner packet (RFC 6040) */
	MRC_R_RX_HEDGE_AHEAD	= 23,	/* not a drop: hedged, too far ahead to mark */
	MRC_R_RX_PROBE_LIMITED	= 24,	/* probe over its peer's per-plane reply rate */
	MRC_R_TX_VLAN		= 25,	/* VLAN-tagged frame on the overlay device */
	MRC_R_TX_NESTED_GSO	= 26,	/* GSO unit of a tunnel over the overlay */
	MRC_R_RX_NO_MAC		= 27,	/* auth on, frame carries no MAC */
	MRC_R_RX_BAD_MAC	= 28,	/* MAC wrong (forged, other key), or a MAC
					 * while auth is off here */
	MRC_R_RX_UNDERLAY_REFUSED = 29,	/* non-MRC frame not in the plane's
					 * allow_underlay (bpf/acl.h) */
	MRC_R_RX_PMTU		= 30,	/* not a drop: ICMP too-big for one of our paths, recorded */
	MRC_R_RX_PMTU_BAD	= 31,	/* ICMP too-big quoting our port but naming no path of ours */
	MRC_R_TX_TOO_BIG	= 32,	/* unit too big for its path: ICMP frag-needed to the sender */
	MRC_R_TX_TOO_BIG_DROP	= 33,	/* too big for every path, and no ICMP (no DF, or none built) */
	MRC_R_RX_FEEDBACK	= 34,	/* not a drop: feedback frames consumed */
	MRC_R_RX_TRACE		= 35,	/* not a drop: an EV trace that reached us */
	MRC_R_MAX		= 36,
};

/* mrc_cfg: ARRAY[1], instance-wide settings the control plane may change
 * live. Writer of every field: agent (loader, at `up`). */
struct mrc_config {
	__u32	udp_port;	/* host order */
	__u32	overlay_ifindex;
	__u32	dead_after_us;	/* evidence older than this: path not used */
	__u32	flags;		/* MRC_CFG_* */
	/* path health (bpf/judge.h, bpf/hedge.h, bpf/evidence.h) */
	__u32	hedge_after_us;	/* evidence this late: path suspect, hedge */
	__u32	recover_probes;	/* consecutive probe replies to recover */
	__u32	epoch;		/* 1..0xffff, random and new at every `up`,
				 * sent in every header (mrc_hdr.epoch) */
	__u32	cong_hold_us;	/* after an ECE echo, the slot walk passes
				 * the path over this long; 0: never
				 * (bpf/congest.h) */
};
#define MRC_CFG_LIVENESS	0x01	/* judge path liveness in the datapath */
#define MRC_CFG_HEDGE		0x02	/* hedged (duplicate) sending on suspect paths */
#define MRC_CFG_HEDGE_ALL	0x04	/* hedge every unit (duplicate-send mode) */
#define MRC_CFG_FB_FRAMES	0x08	/* mrc_rx_tc sends feedback frames for paths
					 * reverse data leaves unechoed (feedback.h) */
#define MRC_CFG_PAWS_GUARD	0x10	/* lift inner TCP timestamps PAWS would
					 * refuse after reordering (paws.h) */

/* mrc_peers: ARRAY[peers]. n_paths == 0 marks a free entry. Every
 * field: agent; its writers rewrite the whole entry (loader at `up`, slot
 * table flips, `mrcctl spray`, the adaptive flowlet gap). The one entry
 * with two live writers: `mrcctl spray` against the agent's flips and gap,
 * which it outlasts by verifying and repeating its write (admin.set_spray);
 * a lost flip costs the agent one rebuild. */
struct mrc_peer {
	__u32	n_paths;	/* writer: agent (loader) */
	__u32	table;		/* which of the two slot tables is live (0/1);
				 * writer: agent (slot table flips) */
	__u32	spray_mode;	/* enum mrc_spray; writer: agent (loader,
				 * `mrcctl spray`) */
	__u32	min_active;	/* ev_min_active; writer: agent (loader) */
	__be32	overlay;	/* the peer's identity across `up`: its overlay
				 * IPv4 address, or for a peer with IPv6 overlay
				 * addresses only the last 32 bits of the first
				 * (instance/fill.py); writer: agent (loader) */
	__u32	ev_base;	/* writer: agent (loader) */
	__u32	flowlet_gap_us;	/* flowlet mode: idle gap after which a flow
				 * may move to another path (bpf/spray.h);
				 * writer: agent (loader, adaptive gap,
				 * `mrcctl spray`) */
	__u32	epoch;		/* the epoch sent to this peer (mrc_hdr.epoch);
				 * 0: mrc_config.epoch. A peer added to a
				 * running instance gets its own, since its
				 * PSNs start again at 0 while the instance's
				 * epoch stays (bpf/epoch.h); writer: agent
				 * (loader, `mrcctl peer add`) */
};

enum mrc_spray {
	MRC_SPRAY_WEIGHTED	= 0,
	MRC_SPRAY_FLOWLET	= 1,
	MRC_SPRAY_HASH		= 2,
};

/*
 * mrc_slots: ARRAY[peers * 2], index peer * 2 + table. The control
 * plane fills the idle table, then flips mrc_peer.table: spraying never sees
 * a half-written table. Writer: agent (slot table builds) only.
 */
struct mrc_slots {
	__u32	n;		/* slots in use, 1..MRC_SLOTS */
	__u8	slot[MRC_SLOTS];	/* path index */
};

/* mrc_paths: ARRAY[peers << path_shift], written by the control
 * plane only, one writer at a time: the loader at `up` writes every field
 * while no agent runs (up stops it first), then the agent's tasks (one
 * thread) rewrite whole entries for their own field. */
struct mrc_path {
	__u32	ifindex;	/* plane device; writer: agent (loader) */
	__u16	ev;		/* outer UDP source port, host order; writer:
				 * agent (loader, then the EV map task) */
	__u8	family;		/* 4 or 6; writer: agent (loader) */
	__u8	plane;		/* plane index; writer: agent (loader) */
	__u8	smac[6];	/* writer: agent (loader) */
	__u8	dmac[6];	/* writer: agent (loader, then the neighbours
				 * task) */
	__be32	saddr[4];	/* IPv4 uses [0]; writer: agent (loader) */
	__be32	daddr[4];	/* writer: agent (loader) */
	__u32	weight;		/* writer: agent (loader, then adaptive
				 * weights) */
};	/* 56 bytes: an array value is rounded up to 8 (mrc_admin holds the
	 * operator's state, a field of another writer) */

/*
 * mrc_admin: ARRAY[peers << path_shift] of __u32: MRC_PATH_DENIED
 * when the operator denied the path, else MRC_PATH_GOOD. Apart from
 * mrc_paths so that no other writer's whole-entry rewrite can undo a deny.
 * Writer: operator (mrcctl under the instance lock: `path deny/allow`, and
 * `up`, which carries each entry to the index its peer has now).
 */

/*
 * mrc_live: ARRAY[peers << path_shift], written by the datapath,
 * shared by all CPUs. The agent never writes it: a retirement it decides
 * (link down, probe loss) is a request the mrc_ctl program carries out
 * with the same compare-and-swap as the programs (bpf/ctl.bpf.c). The
 * loader at `up` writes a fresh entry only for an index whose path is new
 * (no peer's path had that identity before), and moves a path's entry to
 * the index its peer has now.
 */
struct mrc_path_live {
	/* first cache line: mrc_rx's, written per unit (receipts) and per
	 * echo (evidence); mrc_tx only reads it */
	__u64	last_ack_ns;	/* sender: newest evidence that this path delivers,
				 * dated by the evidence's send time: when the
				 * newest probe/data known delivered was sent
				 * (now - its echoed RTT), never moved back;
				 * writer: mrc_rx (evidence.h) */
	__u64	last_rx_ns;	/* receiver: newest packet received on this
				 * path; writer: mrc_rx (feedback.h) */
	__u64	ev_rx_ns;	/* sender: when new evidence last arrived;
				 * writer: mrc_rx (evidence.h) */
	__u64	ev_ack_ns;	/* sender: last_ack_ns when last looked at;
				 * writer: mrc_rx (evidence.h) */
	__u32	last_rx_ts;	/* receiver: that packet's tx_ts, to echo back;
				 * writer: mrc_rx (feedback.h) */
	__u32	last_rx_unit;	/* receiver: PSN of the unit last_rx_ts came
				 * from (its segments share one header);
				 * writer: mrc_rx (feedback.h) */
	__u32	srtt_us;	/* smoothed RTT from echoes and probes; writer:
				 * mrc_rx (evidence.h) */
	__u32	rtt_us;		/* last RTT sample; writer: mrc_rx (evidence.h) */
	__u32	ev_cov_us;	/* sender: smoothed coverage delay, from sending
				 * the oldest outstanding unit (unacked_ns) to
				 * the evidence that covers it: how long this
				 * path's evidence normally takes, echo
				 * scheduling included (judge.h); writer:
				 * mrc_rx (evidence.h) */
	__u32	ev_rtt_us;	/* sender: smoothed send-to-evidence delay, from
				 * new evidence only (srtt_us also takes repeated
				 * echoes of an old receipt, which a dead path
				 * keeps getting); writer: mrc_rx (evidence.h) */
	__u32	ev_cov_max_us;	/* sender: recent peak of the coverage delay
				 * (jumps to a larger sample, decays by 1/16 per
				 * smaller one): the judge's threshold; writer:
				 * mrc_rx (evidence.h) */
	__u32	probe_seq;	/* sequence number of the newest probe reply;
				 * writer: mrc_rx (evidence.h) */
	/* second cache line: mrc_tx's per-unit writes (judge.h, feedback.h),
	 * and the writers of rare events: state transitions (CAS), recovery,
	 * probe replies while ASSUMED_BAD, feedback frames (<= 1 per ms) */
	__u64	unacked_ns;	/* sender: send time of the oldest unit not yet
				 * covered by evidence; 0 or <= last_ack_ns:
				 * nothing outstanding; writers: mrc_tx
				 * (judge.h), mrc_rx (evidence.h: 0 on
				 * recovery) */
	__u64	strike_ns;	/* sender: send time of the unit a first overdue
				 * verdict found uncovered, waiting for a second
				 * verdict (0: none); evidence covering that unit
				 * clears it; writer: mrc_tx (judge.h), and 0 by
				 * the winner of the CAS to ASSUMED_BAD (path.h
				 * path_retired) */
	__u64	fb_echo_ns;	/* receiver: when reverse data last carried an
				 * echo of this path; writer: mrc_tx
				 * (feedback.h) */
	__u64	bad_ns;		/* when it last left GOOD; writer: whichever
				 * program won the CAS on state to ASSUMED_BAD
				 * (path.h path_retired: one per transition) */
	__u64	good_ns;	/* when it last returned to GOOD; writer:
				 * mrc_rx (evidence.h) */
	__u64	fb_frame_ns;	/* receiver: when a feedback frame for this path
				 * last left; writer: mrc_rx_tc (feedback.h) */
	__u32	state;		/* enum mrc_path_state; writers, one transition
				 * each, by compare-and-swap: mrc_tx (judge.h,
				 * GOOD -> ASSUMED_BAD), mrc_ctl (ctl.bpf.c,
				 * GOOD -> ASSUMED_BAD for the agent: link down,
				 * probe loss), mrc_rx (evidence.h, back to
				 * GOOD) */
	__u32	fb_echoed;	/* receiver: last_rx_ts value already echoed;
				 * writer: mrc_tx (feedback.h) */
	__u32	flaps;		/* quick GOOD -> BAD relapses (damping level);
				 * writer: the winner of the CAS to
				 * ASSUMED_BAD (path.h path_retired: mrc_tx,
				 * mrc_ctl) */
	__u32	probe_ok;	/* consecutive probe replies while ASSUMED_BAD;
				 * writers: mrc_rx (evidence.h), and 0 by the
				 * winner of the CAS to ASSUMED_BAD (judge.h,
				 * ctl.bpf.c), which mrc_rx counts from */
};
/* Two cache lines, one per side: the maps holding it are mmapable, so each
 * value starts on a page and a cache line (path.h). */
_Static_assert(sizeof(struct mrc_path_live) == 128, "mrc_path_live: two cache lines");

/* mrc_peer_seq: ARRAY[peers], shared by all CPUs. Only the datapath
 * writes it: mrc_tx the first cache line, per unit (two atomics), mrc_rx
 * the second, per packet (rx_psn_max): apart, so neither side's writes
 * take the other's line away (the map is mmapable: each value starts on a
 * cache line, peer.h). */
struct mrc_peer_seq {
	__u64	psn;		/* next PSN to send; writer: mrc_tx (encap.h,
				 * atomic) */
	__u64	cursor;		/* spray slot cursor; writer: mrc_tx (spray.h,
				 * atomic) */
	__u64	fb_cursor;	/* which path to echo next; writer: mrc_tx
				 * (feedback.h) */
	__u8	tx_pad[40];	/* the rest of mrc_tx's line; writer: none */
	__u64	rx_psn_max;	/* receiver: highest wire PSN seen (a 32-bit
				 * wire PSN, compared wrap-safe); writer:
				 * mrc_rx (reorder.h) */
	__u64	ack_max_ns;	/* sender: newest last_ack_ns of any path to
				 * this peer; writer: mrc_rx (evidence.h) */
	__u32	ack_max_path;	/* sender: the path that confirmed it; writer:
				 * mrc_rx (evidence.h) */
	__u32	rsvd;
	__u64	fb_rl_tat;	/* receiver: the feedback frames' GCRA bucket
				 * (the next frame's theoretical send time);
				 * writer: mrc_rx_tc (feedback.h) */
	__u32	cov_peak_us;	/* sender: the largest coverage delay (evidence.h
				 * evidence_cov) of any path to this peer in the
				 * window begun at cov_win_ns; writer: mrc_rx
				 * (evidence.h) */
	__u32	cov_prev_us;	/* ... in the window before it (0 if that was
				 * not the one just before); writer: mrc_rx
				 * (evidence.h) */
	__u64	cov_win_ns;	/* when the current window began; writer:
				 * mrc_rx (evidence.h) */
	__u8	rx_pad[16];	/* the rest of mrc_rx's line; writer: none */
};
_Static_assert(sizeof(struct mrc_peer_seq) == 128, "mrc_peer_seq: two cache lines");

/*
 * mrc_path_stats: PERCPU_ARRAY[peers << path_shift], the per-path counters
 * every packet moves: per CPU, so the hot path needs no atomics. Per CPU they cost 8 bytes each per path per
 * possible CPU (4,096 peers x 32 paths on 2 CPUs: 1 MiB a field), which is
 * why the rarer ones live in mrc_path_cnt.
 */
struct mrc_path_stats {
	__u64	tx_packets;	/* wire packets (GSO segments counted); writer:
				 * mrc_tx (tx.bpf.c, hedge.h) */
	__u64	tx_bytes;	/* writer: mrc_tx (tx.bpf.c, hedge.h) */
	__u64	rx_packets;	/* writer: mrc_rx (rx.bpf.c) */
	__u64	rx_bytes;	/* writer: mrc_rx (rx.bpf.c) */
};

/*
 * mrc_path_cnt: ARRAY[peers << path_shift], the per-path counters of rare
 * events, one copy shared by the CPUs (atomic adds): a reordered packet
 * (frequent only while spraying reorders), a probe reply, a duplicate, a
 * late or CE-marked packet, a steered retransmission. The
 * reorder distances are kept per peer (mrc_reorder.hist), not per path.
 */
struct mrc_path_cnt {
	__u64	rx_ooo;		/* arrived below the highest PSN seen; writer:
				 * mrc_rx (reorder.h) */
	__u64	rx_dup;		/* writer: mrc_rx (reorder.h) */
	__u64	probes_rx;	/* replies received; writer: mrc_rx (rx.bpf.c) */
	/* receiver reorder accounting (bpf/reorder.h) */
	__u64	rx_late;	/* older than the reorder window: counted lost
				 * when the window passed, then arrived;
				 * writer: mrc_rx (reorder.h) */
	__u64	tx_steered;	/* of tx_packets: TCP retransmissions sent here
				 * as the freshest path, not by the slot table;
				 * writer: mrc_tx (tx.bpf.c) */
	__u64	rx_ce;		/* arrived with CE in the outer header: the
				 * fabric marked congestion on this path;
				 * writer: mrc_rx (rx.bpf.c, bpf/ecn.h) */
	__u64	tx_hedged;	/* of tx_packets: hedged copies sent here as
				 * the partner of a suspect path, not by the
				 * slot table; writer: mrc_tx (tx.bpf.c) */
	__u64	rx_lost_units;	/* units of the peer's path that never arrived
				 * (gaps in mrc_hdr.path_seq); writer: mrc_rx
				 * (congest.h) */
	__u64	rx_lost_segs;	/* wire packets missing from units that arrived
				 * in part; writer: mrc_rx (congest.h) */
};

/*
 * Receiver reorder/loss accounting (bpf/reorder.h).
 *
 * mrc_rx_win: ARRAY[peers], shared by all CPUs: which of the last
 * MRC_WIN_WORDS * 64 wire PSNs below the highest seen have arrived. Bit
 * (psn % 64) of word (psn / 64) % MRC_WIN_WORDS. A PSN whose word leaves the
 * window without its bit set is counted lost.
 */

struct mrc_rx_win {
	__u64	max;		/* highest wire PSN seen (32-bit, wrap-safe) */
	__u64	started;	/* nonzero once the first packet set the window */
	__u64	advancing;	/* 1 while one CPU moves the top (bpf/reorder.h) */
	__u64	bits[MRC_WIN_WORDS];
};

/* mrc_reorder: PERCPU_ARRAY[peers], per peer. Writer of every
 * field: mrc_rx (reorder.h); mrc_rx_win likewise. */
struct mrc_reorder {
	__u64	rx_packets;	/* data packets accounted */
	__u64	ooo;		/* arrived below the highest PSN seen */
	__u64	dup;		/* PSN already received (within the window) */
	__u64	lost;		/* PSNs that left the window unreceived */
	__u64	late;		/* arrived after leaving the window */
	__u64	resync;		/* sender restarts: a new epoch after another,
				 * or the PSN jumped by > 2^24 */
	__u64	unmarked;	/* received while another CPU held the top: not
				 * marked, so counted in lost when the window
				 * passes them (bpf/reorder.h) */
	__u64	hist[MRC_HIST_BUCKETS];	/* ooo by log2 distance */
};

/*
 * mrc_path_delay: ARRAY[peers << path_shift], sender side: RTT of
 * our path from the peer's feedback echoes, counting only echoes of a newer
 * packet than the last (a re-echo of an old timestamp is no sample). What
 * the adaptive weights (mrcctl/weights.py) steer by. Writer of every field:
 * mrc_rx (evidence.h).
 */
struct mrc_path_delay {
	__u32	samples;	/* fresh echoes taken as samples (wraps:
				 * readers compare it for change, and 0 only
				 * restarts the EWMA) */
	__u32	last_fb_ts;	/* newest echoed tx_ts seen */
	__u32	rtt_us;		/* last fresh sample */
	__u32	ewma_us;	/* EWMA of fresh samples, gain 1/4 */
	__u64	last_ns;	/* when the last fresh echo came (monotonic):
				 * last_fb_ts, 32-bit microseconds, is compared
				 * only while it is this recent (issue #13.5) */
	__u32	held;		/* fresh echoes the peer held (MRC_F_EHELD):
				 * no sample; samples + held is every fresh
				 * echo (wraps) */
	__u32	held_pad;	/* writer: none */
};

/*
 * mrc_probe_nonce: ARRAY[peers << path_shift], the agent's
 * outstanding probes of each path: probe seq (the PROBE's psn) seq[i] was
 * sent with the unpredictable 64-bit nonce nonce[i] (the PROBE's seq0 << 32
 * | fb_ts, echoed by the peer's turn-around), slot i = seq % MRC_PROBE_RING.
 * A PROBE_REPLY changes state only if it echoes the nonce of its sequence
 * (bpf/probe.h). Writer of every field: agent (health: before each probe,
 * whole entry).
 */
#define MRC_PROBE_RING		8
struct mrc_probe_nonce {
	__u64	nonce[MRC_PROBE_RING];	/* 0: slot unused */
	__u32	seq[MRC_PROBE_RING];
};

/* mrc_flowlets: LRU_HASH, flowlet spraying state of one inner flow. Writer
 * of every field: mrc_tx (spray.h). */
struct mrc_flowlet_key {
	__u32	peer;
	__u32	hash;		/* inner 5-tuple hash */
};

struct mrc_flowlet {
	__u64	last_ns;	/* last unit of this flow sent */
	__u32	slot;		/* slot table index the flowlet uses */
	__u32	moves;		/* flowlets started after an idle gap */
};

/*
 * mrc_path_mtu: ARRAY[peers << path_shift], the path MTU an ICMP
 * "fragmentation needed" / "packet too big" reported for one of our paths
 * (bpf/pmtu.h); in force for MRC_PMTU_AGE_S after s. Writer of every
 * field: mrc_rx (pmtu.h). 8 bytes: one per path slot (131,072 at 4,096
 * peers x 32 paths), nearly all of them never written.
 */
struct mrc_path_mtu {
	__u16	mtu;		/* outer L3 MTU of the path; 0: none recorded */
	__u16	icmps;		/* valid ICMPs received for the path (stops
				 * at 65535; a plain add: two CPUs at once
				 * may count one) */
	__u32	s;		/* when the last one arrived: monotonic
				 * seconds (compared modulo 2^32) */
};

/* mrc_drops: PERCPU_ARRAY[MRC_R_MAX] of __u64 packets. Writers: mrc_tx,
 * mrc_rx, each from its one exit (tx_exit, rx_exit). */

/*
 * Two LPM_TRIEs keyed by an overlay prefix of either family (struct
 * mrc_ovl_key), looked up by an inner address (bpf/peer.h ovl_lookup()):
 *  - mrc_peer_ip: inner destination -> the peer mrc_tx sends it to (no
 *    entry: MRC_R_TX_NO_PEER). Every peer's overlay addresses (/32, /128)
 *    and peer[].prefixes.
 *  - mrc_ovl_owner: who owns a prefix, a peer index or MRC_OWNER_LOCAL for
 *    this host; mrc_rx delivers an inner packet only if its source is owned
 *    by the peer the frame came from and its destination by this host. The
 *    same entries as mrc_peer_ip, plus ours and overlay.prefixes as
 *    MRC_OWNER_LOCAL. Two maps because they answer two questions (where
 *    to send, whom to believe), which differ where a host is both ends.
 * The family is the first word of the matched data, so no IPv4 prefix can
 * cover an IPv6 address (nor ::ffff:a.b.c.d an IPv4 one). Writer of both:
 * agent (loader).
 */
#define MRC_OWNER_LOCAL		0xffffffffU
#define MRC_OWNER_NONE		0xfffffffeU	/* no entry (never stored) */
#define MRC_OVL_FAMILY_BITS	32	/* prefixlen = these + the prefix's own length */
#define MRC_OVL_PER_PEER	16	/* owner entries a peer may have (addresses + prefixes) */
struct mrc_ovl_key {
	__u32	prefixlen;	/* MRC_OVL_FAMILY_BITS + 0..32 (IPv4) or 0..128 (IPv6) */
	__u32	family;		/* 4 or 6, host order */
	__be32	addr[4];	/* network order; IPv4 in [0], the rest 0 */
};

/* mrc_rx_peers: HASH, which source may send MRC on which plane. Writer:
 * agent (loader). */
struct mrc_rx_key {
	__u32	ifindex;
	__u32	family;		/* 4 or 6 */
	__be32	addr[4];
};

struct mrc_rx_peer {
	__u32	peer;
	__u32	plane;
};

/*
 * Path health (bpf/judge.h, bpf/evidence.h, mrcctl/agent/health.py).
 *
 * mrc_events: RINGBUF of struct mrc_event, one per path state change made
 * by the datapath (the agent logs its own changes directly).
 */
enum mrc_ev_reason {
	MRC_EV_DEAD		= 1,	/* tx: no evidence for dead_after */
	MRC_EV_RECOVERED	= 2,	/* rx: recover_probes probe replies in a row */
	MRC_EV_LINK_DOWN	= 3,	/* agent: plane lost carrier / went down */
	MRC_EV_LINK_UP		= 4,	/* agent: plane back, probing resumes */
	MRC_EV_DENIED		= 5,	/* operator */
	MRC_EV_ALLOWED		= 6,	/* operator */
	MRC_EV_MIN_ACTIVE	= 7,	/* tx: would be dead, kept for ev_min_active */
};

struct mrc_event {
	__u64	ts_ns;		/* CLOCK_MONOTONIC */
	__u32	peer;
	__u16	path;
	__u8	old_state;	/* enum mrc_path_state */
	__u8	new_state;
	__u32	reason;		/* enum mrc_ev_reason */
	__u32	age_us;		/* DEAD: evidence age; RECOVERED: last RTT */
};

/*
 * mrc_path_cong: ARRAY[peers << path_shift], the per-EV congestion
 * signals (bpf/congest.h): CE marks and loss. Like mrc_live, an entry
 * serves both directions: the receiver's field for the peer's path toward
 * us, the sender's for ours toward the peer (both ends number paths alike).
 */
#define MRC_RX_UNITS		4	/* units per path counted at once (congest.h); a power of two */
struct mrc_path_cong {
	__u64	rx_ce_ns;	/* receiver: newest CE-marked DATA packet on the
				 * peer's path; writer: mrc_rx (congest.h) */
	__u64	ce_ns;		/* sender: newest echo with MRC_F_ECE for our
				 * path; writer: mrc_rx (congest.h) */
	__u64	ce_echoes;	/* sender: echoes with MRC_F_ECE for our path;
				 * writer: mrc_rx (congest.h) */
	__u32	hold_shift;	/* sender: the walk passes the path over for
				 * cong_hold_us << hold_shift; one more for a
				 * mark soon after the last hold ended, 0 at an
				 * unmarked echo; writer: mrc_rx (congest.h) */
	__u32	fb_ts;		/* sender: the echoed tx_ts last taken as news
				 * (a re-echo of the same receipt is none);
				 * writer: mrc_rx (congest.h) */
	__u64	rx_loss_ns;	/* receiver: when the peer's path last showed a
				 * loss; writer: mrc_rx (congest.h) */
	__u64	loss_echoes;	/* sender: echoes with MRC_F_ELOSS for our path;
				 * writer: mrc_rx (congest.h) */
	__u32	rx_seq;		/* receiver: the last path_seq seen, with
				 * CONG_SEQ_SEEN; writer: mrc_rx (congest.h) */
	__u32	rx_hole;	/* receiver: the one path_seq skipped last, with
				 * CONG_SEQ_SEEN, not yet counted lost: two CPUs
				 * swap units; writer: mrc_rx (congest.h) */
	__u64	rx_units[MRC_RX_UNITS];	/* receiver: per unit of the
				 * last MRC_RX_UNITS on the peer's path (by
				 * path_seq), its end PSN << 32 | segs << 16 |
				 * packets counted; writer: mrc_rx (congest.h) */
};

/*
 * mrc_path_seq: ARRAY[peers << path_shift] of __u32, sender side: the
 * next mrc_hdr.path_seq of each of our paths. Apart from mrc_path_cong,
 * whose receiver fields mrc_rx writes per packet: this one mrc_tx writes
 * per unit. A plain increment: two CPUs sending on one path at once may
 * send one number twice, which the receiver takes for no loss. Writer:
 * mrc_tx (congest.h).
 */

/*
 * mrc_dedup: ARRAY[peers], receiver duplicate filter for hedged
 * units (MRC_F_HEDGE on both copies). Word (psn >> 5) % MRC_DEDUP_WORDS
 * holds, in one __u64 updated by compare-and-swap, the tag psn >> 5 in the
 * high 32 bits and a bit per PSN of that block of 32 in the low 32 bits: a
 * test-and-set that is exact across CPUs for the last
 * MRC_DEDUP_WORDS * 32 PSNs. Tags (27 bits) are compared modulo 2^27, so
 * the window works across the 32-bit PSN wrap. Writer: mrc_rx (dedup.h).
 */
#define MRC_DEDUP_WORDS		512	/* window: 16384 wire PSNs */
struct mrc_dedup {
	__u64	w[MRC_DEDUP_WORDS];
};

/*
 * mrc_tx_flows: ARRAY[peers], sender side: per inner TCP flow (hashed
 * into MRC_TX_FLOWS slots) the flow's hash in the high 32 bits and the end
 * of the highest sequence sent in the low 32 bits, one __u64 per slot. A unit
 * that ends at or below it is a retransmission (bpf/retx.h). TCP sends a
 * flow from one CPU at a time (socket lock), so plain stores suffice; a
 * slot two flows share only costs a misjudged unit. Writer: mrc_tx (retx.h).
 */
#define MRC_TX_FLOWS		64
struct mrc_tx_flows {
	__u64	hi[MRC_TX_FLOWS];
};

/*
 * mrc_rx_flows: HASH[peers], receiver side: per inner TCP flow from the
 * peer (hashed into MRC_RX_FLOWS slots) the flow's hash in the high 32
 * bits and the newest TCP timestamp (TSval) delivered in the low 32, one
 * __u64 per slot (bpf/paws.h). Receive CPUs race on a slot; a lost update
 * costs one segment the guard does not lift. Writer: mrc_rx (paws.h).
 */
#define MRC_RX_FLOWS		64
struct mrc_rx_flows {
	__u64	ts[MRC_RX_FLOWS];
};

/* mrc_hstats: PERCPU_ARRAY[1]. */
struct mrc_hstats {
	__u64	hedged;		/* units sent twice; writer: mrc_tx (hedge.h) */
	__u64	hedge_no_path;	/* suspect unit sent without a copy: no usable,
				 * not overdue partner on another plane;
				 * writer: mrc_tx (tx.bpf.c) */
	__u64	dedup_drops;	/* hedged wire packets dropped as duplicates;
				 * writer: mrc_rx (dedup.h) */
	__u64	dead;		/* GOOD -> ASSUMED_BAD by the tx judgement;
				 * writer: mrc_tx (judge.h) */
	__u64	recovered;	/* ASSUMED_BAD -> GOOD by probes; writer:
				 * mrc_rx (evidence.h) */
	__u64	min_active_held;	/* dead paths kept for ev_min_active;
				 * writer: mrc_tx (judge.h) */
	__u64	fallback;	/* units sent on a non-GOOD path (no GOOD one);
				 * writer: mrc_tx (judge.h) */
	__u64	events_lost;	/* ring buffer full; writers: mrc_tx, mrc_rx
				 * (events.h), per CPU */
	__u64	retx_steered;	/* TCP retransmissions sent on the freshest
				 * path; writer: mrc_tx (tx.bpf.c) */
	__u64	rx_gso_units;	/* received skbs holding several wire segments
				 * (GSO units at tc ingress); writer: mrc_rx_tc
				 * (rx.bpf.c) */
	__u64	rx_gso_segs;	/* wire segments in those skbs; writer:
				 * mrc_rx_tc (rx.bpf.c) */
	__u64	ecn_avoided;	/* slots the walk passed over because the peer
				 * echoed CE for their path lately; writer:
				 * mrc_tx (tx.bpf.c) */
	__u64	fb_frames;	/* feedback frames sent; writer: mrc_rx_tc
				 * (feedback.h) */
	__u64	fb_limited;	/* feedback frames the per-peer rate refused;
				 * writer: mrc_rx_tc (feedback.h) */
	__u64	paws_lifted;	/* inner TCP timestamps lifted so that PAWS
				 * keeps a reordered segment; writer: mrc_rx
				 * (paws.h) */
};

/*
 * mrc_rx_epoch: ARRAY[peers], receiver: the epoch the peer sends
 * now and the one before it, each stored as epoch | MRC_EPOCH_SEEN (0: none
 * yet). A DATA frame of a third epoch restarts the peer's reorder window
 * and duplicate filter; one of the previous epoch (in flight across the
 * peer's restart) is delivered without touching them (bpf/epoch.h).
 * Writer: mrc_rx (epoch.h); the loader at `up` moves an entry with its peer.
 */
#define MRC_EPOCH_SEEN		0x10000
struct mrc_rx_epoch {
	__u32	cur;
	__u32	prev;
};

/*
 * mrc_ctl requests: the agent's changes to datapath-owned state, carried
 * out by the mrc_ctl program (bpf/ctl.bpf.c, run by BPF_PROG_TEST_RUN on a
 * frame that starts with this struct) so that every write to mrc_live is a
 * program's, atomic against the others. XDP_PASS: done; XDP_DROP: nothing
 * to do (another writer got there first); XDP_ABORTED: bad request.
 */
/*
 * The probe generator (bpf/probe_gen.bpf.c): the agent's probes of one
 * round, sent by one BPF_PROG_TEST_RUN with BPF_F_TEST_XDP_LIVE_FRAMES.
 * mrc_probe_out (ARRAY[MRC_PROBE_BATCH], the generator's own map, not the
 * datapath's): entry i is the run's i-th probe, a prebuilt frame whose MRC
 * header the generator completes (psn = seq, tx_ts, nonce in seq0/fb_ts,
 * the MAC if the header says MRC_F_AUTH) before redirecting it out of
 * ifindex. Writer of every field: agent (health), before the run.
 */
#define MRC_PROBE_BATCH		256
#define MRC_PROBE_FRAME_MAX	128	/* Ethernet + IPv6 + UDP + MRC + MAC: 98 */
struct mrc_probe_out {
	__u32	ifindex;	/* plane to send it out of */
	__u16	len;		/* frame bytes */
	__u16	mrc_off;	/* where the MRC header starts in frame */
	__u32	peer;		/* peer index: its key in mrc_auth */
	__u32	seq;		/* the probe's sequence number (MRC psn) */
	__u64	nonce;		/* seq0 << 32 | fb_ts (mrc_probe_nonce) */
	__u8	frame[MRC_PROBE_FRAME_MAX];
};

/* Behind MRC_PROBE_FRAME_MAX bytes of room, the run's own input frame
 * ends in this: which run (a run number new each run restarts the
 * generator at entry 0) and how many entries it sends. */
struct mrc_probe_run {
	__u32	gen;
	__u32	n;
};

enum mrc_ctl_op {
	MRC_CTL_RETIRE		= 1,	/* GOOD -> ASSUMED_BAD */
};

struct mrc_ctl_req {
	__u32	op;		/* enum mrc_ctl_op */
	__u32	peer;
	__u32	path;
	__u32	rsvd;
};

/*
 * Authentication (bpf/auth.h), optional: with MRC_F_AUTH set, an 8-byte
 * SipHash-2-4 MAC follows the MRC header. It covers the MRC header (flags
 * included) and struct mrc_auth_inner, the part of the inner headers that
 * every GSO segment of a unit shares (the kernel copies one MRC header and
 * MAC into every segment, so per-segment fields like the inner TCP sequence
 * or IP length cannot be covered). PROBE / PROBE_REPLY: an all-zero block.
 * The MAC is the hash's 64-bit value, little-endian (as SipHash's reference).
 */
#define MRC_AUTH_LEN		8
#define MRC_AUTH_MSG_LEN	48	/* MRC header + the first 20 bytes of
					 * struct mrc_auth_inner: inner IPv4 (and
					 * PROBE / PROBE_REPLY) */
#define MRC_AUTH_MSG_LEN6	72	/* MRC header + all of it: inner IPv6 */
/*
 * The inner block. IPv4 fills the first 20 bytes, exactly as before inner
 * IPv6 existed (so IPv4 MACs did not change); IPv6 puts the last 32 bits of
 * each address where IPv4's address goes and the first 96 bits behind, and
 * the MAC covers all 44 bytes. The lengths differ, and SipHash hashes the
 * length, so an IPv4 and an IPv6 block can never give the same message.
 */
struct mrc_auth_inner {
	__be32	saddr;		/* inner IPv4 source; IPv6: bits 96..127 */
	__be32	daddr;
	__u8	proto;		/* IPv4 protocol; IPv6 next header (not walked) */
	__u8	v6;		/* 0: IPv4 (or none), the first 20 bytes are the
				 * block; 6: IPv6, all 44 */
	__u8	rsvd[2];
	__be16	sport;		/* TCP/UDP ports of an unfragmented or first */
	__be16	dport;		/* fragment, else 0 */
	__u32	rsvd2;
	__be32	saddr6[3];	/* IPv6 only: source bits 0..95 */
	__be32	daddr6[3];	/* IPv6 only: destination bits 0..95 */
};

/* mrc_auth: ARRAY[peers], the key toward each peer (the cluster
 * key, or a peer's own). Writer: agent (loader) only; never logged. */
struct mrc_auth_key {
	__u64	k0;		/* key bytes 0..7, little-endian */
	__u64	k1;		/* key bytes 8..15 */
	__u32	on;		/* 0: this peer is not authenticated */
	__u32	rsvd;
};

/*
 * Underlay access list (bpf/acl.h): mrc_acl, HASH plane ifindex -> struct
 * mrc_acl. A plane without an entry passes every non-MRC frame, as without
 * the list. With one, a non-MRC frame reaches the stack only if it is ARP,
 * IPv6 neighbour discovery, or matches a rule; else it is dropped under
 * MRC_R_RX_UNDERLAY_REFUSED. Writer: agent (loader).
 */
#define MRC_ACL_RULES		16
struct mrc_acl_rule {
	__u8	family;		/* 0 any, 4, 6 */
	__u8	proto;		/* 0 any, else the L4 protocol */
	__u16	port_lo;	/* destination port range, host order; 0-0: any */
	__u16	port_hi;
	__u16	rsvd;
	__be32	addr[4];	/* source prefix (IPv4 in [0]), masked */
	__be32	mask[4];
};

struct mrc_acl {
	__u32	n;		/* rules in use */
	__u32	rsvd;
	struct mrc_acl_rule rule[MRC_ACL_RULES];
};

#endif /* MRC_H */
