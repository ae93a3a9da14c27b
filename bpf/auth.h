/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Optional authentication of MRC frames: a SipHash-2-4 MAC keyed per peer
 * (mrc_auth, written by the loader only) over the MRC header and the inner
 * headers every GSO segment shares (struct mrc_auth_inner, mrc.h): inner
 * IPv4 or IPv6 addresses, protocol and ports. Without
 * it mrc trusts (plane, source address) as the underlay does; with it a
 * host that can send from a peer's address but has no key cannot inject
 * data, probes or probe replies (docs/hostile-input.md).
 *
 * SipHash because it is a PRF made for short inputs that fits the BPF
 * instruction set (64-bit add, rotate, xor; no tables, no loops beyond the
 * message's six words): 48 bytes cost 6 + 4 rounds of 14 instructions.
 *
 * Writers of the MAC: encap_write (every DATA unit and its hedged copy),
 * the agent (probes, mrcctl/agent/health.py), rx_exit after
 * encap_turn_around (a reply's type differs from its probe's). Reader:
 * auth_verify, before a frame changes any state or is turned around.
 */
#ifndef MRC_AUTH_H
#define MRC_AUTH_H

#include <stdbool.h>
#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <stddef.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "mrc.h"
#include "sizing.h"
#include "parsing.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_N_PEER_ENTRIES);
	__type(key, __u32);
	__type(value, struct mrc_auth_key);
} mrc_auth SEC(".maps");

/* The key toward a peer, or NULL when that peer is not authenticated. */
static __always_inline const struct mrc_auth_key *auth_key(__u32 peer)
{
	struct mrc_auth_key *k = bpf_map_lookup_elem(&mrc_auth, &peer);

	return k && k->on ? k : NULL;
}

#define SIP_ROTL(x, b)	(((x) << (b)) | ((x) >> (64 - (b))))
#define SIP_ROUND(v0, v1, v2, v3) do {					\
	v0 += v1; v1 = SIP_ROTL(v1, 13); v1 ^= v0; v0 = SIP_ROTL(v0, 32);	\
	v2 += v3; v3 = SIP_ROTL(v3, 16); v3 ^= v2;				\
	v0 += v3; v3 = SIP_ROTL(v3, 21); v3 ^= v0;				\
	v2 += v1; v1 = SIP_ROTL(v1, 17); v1 ^= v2; v2 = SIP_ROTL(v2, 32);	\
} while (0)

/*
 * SipHash-2-4 of a message given as little-endian words m[0..nwords) and
 * its final block `last` (the message length << 56 | the 0..7 bytes that
 * do not fill a word). nwords <= 9: the callers hash at most 72 bytes.
 * BPF is little-endian on every host mrc runs on (x86-64, arm64 LE), so a
 * word copied from memory is already SipHash's little-endian load.
 */
static __always_inline __u64 siphash24(__u64 k0, __u64 k1, const __u64 *m,
				       __u32 nwords, __u64 last)
{
	__u64 v0 = 0x736f6d6570736575ULL ^ k0;
	__u64 v1 = 0x646f72616e646f6dULL ^ k1;
	__u64 v2 = 0x6c7967656e657261ULL ^ k0;
	__u64 v3 = 0x7465646279746573ULL ^ k1;
	__u32 i;

	for (i = 0; i < 9; i++) {
		if (i >= nwords)
			break;
		v3 ^= m[i];
		SIP_ROUND(v0, v1, v2, v3);
		SIP_ROUND(v0, v1, v2, v3);
		v0 ^= m[i];
	}
	v3 ^= last;
	SIP_ROUND(v0, v1, v2, v3);
	SIP_ROUND(v0, v1, v2, v3);
	v0 ^= last;
	v2 ^= 0xff;
	SIP_ROUND(v0, v1, v2, v3);
	SIP_ROUND(v0, v1, v2, v3);
	SIP_ROUND(v0, v1, v2, v3);
	SIP_ROUND(v0, v1, v2, v3);
	return v0 ^ v1 ^ v2 ^ v3;
}

/* The inner block (struct mrc_auth_inner) of a flow (parsing.h:
 * l3_flow_of on the parsed inner packet), written at b: what the sender
 * computes before encapsulating and the receiver from the packet behind the
 * MAC, one function for both. Byte copies into the message, no struct
 * stores: the message is read as __u64 words (strict aliasing), and a
 * separate struct would not fit mrc_tx's stack. A packet that is neither
 * IPv4 nor IPv6 has an all-zero block (fl NULL). Returns its length. */
static __always_inline __u32 auth_block(const struct l3_flow *fl, __u8 *b)
{
	const __u32 len4 = MRC_AUTH_MSG_LEN - MRC_HDR_LEN;
	__u8 v6 = 6;

	__builtin_memset(b, 0, sizeof(struct mrc_auth_inner));
	if (!fl)
		return len4;
	b[offsetof(struct mrc_auth_inner, proto)] = fl->proto;
	/* sport, dport: network order, as loaded */
	__builtin_memcpy(b + offsetof(struct mrc_auth_inner, sport), &fl->ports, 4);
	if (fl->family == 4) {
		__builtin_memcpy(b + offsetof(struct mrc_auth_inner, saddr), &fl->saddr[0], 4);
		__builtin_memcpy(b + offsetof(struct mrc_auth_inner, daddr), &fl->daddr[0], 4);
		return len4;
	}
	b[offsetof(struct mrc_auth_inner, v6)] = v6;
	__builtin_memcpy(b + offsetof(struct mrc_auth_inner, saddr), &fl->saddr[3], 4);
	__builtin_memcpy(b + offsetof(struct mrc_auth_inner, daddr), &fl->daddr[3], 4);
	__builtin_memcpy(b + offsetof(struct mrc_auth_inner, saddr6), fl->saddr, 12);
	__builtin_memcpy(b + offsetof(struct mrc_auth_inner, daddr6), fl->daddr, 12);
	return sizeof(struct mrc_auth_inner);
}

struct auth_msg {
	__u64	w[MRC_AUTH_MSG_LEN6 / 8];
};

/* The message is built here, not on a stack: the receive programs reach
 * auth_msg_hash two calls deep and the 512 bytes of stack are shared along
 * the chain. One entry per CPU (a program runs to its end on its CPU);
 * each object has its own (not a shared map). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct auth_msg);
} mrc_auth_msg SEC(".maps");

/* The MAC of message m, whose first sizeof(struct mrc_hdr) bytes the
 * caller filled with a copy of the MRC header (a global function cannot
 * take packet pointers), and of the inner block of flow fl (NULL: an
 * all-zero block, for probes, replies and inner packets that are not IP):
 * SipHash of the header and the block's 20 bytes (MRC_AUTH_MSG_LEN), or all
 * 44 of an IPv6 block (MRC_AUTH_MSG_LEN6). A global function: the verifier
 * checks its rounds once, not again on every path through mrc_tx that signs
 * (inlined, they took the merged program past the 1M-instruction limit). */
__attribute__((noinline)) __u64 auth_msg_hash(__u64 k0, __u64 k1, struct auth_msg *m,
					      const struct l3_flow *fl)
{
	__u32 nwords;

	if (!m)
		return 0;
	nwords = (sizeof(struct mrc_hdr) + auth_block(fl, (__u8 *)m->w + sizeof(struct mrc_hdr))) / 8;
	return siphash24(k0, k1, m->w, nwords, (__u64)(nwords * 8) << 56);
}

/* The MAC of an MRC header (in the packet, bounds-checked by the caller)
 * and the inner block of fl (or NULL). */
static __always_inline __u64 auth_mac(const struct mrc_auth_key *k,
				      const struct mrc_hdr *mh,
				      const struct l3_flow *fl)
{
	__u32 zero = 0;
	struct auth_msg *m = bpf_map_lookup_elem(&mrc_auth_msg, &zero);

	if (!m)
		return 0;
	__builtin_memcpy(m->w, mh, sizeof(*mh));
	return auth_msg_hash(k->k0, k->k1, m, fl);
}

/* Write the MAC behind the header; -1 if it would not lie in the frame.
 * The header's flags must already say MRC_F_AUTH: they are covered. */
static __always_inline int auth_sign(struct mrc_hdr *mh, void *data_end,
				     const struct mrc_auth_key *k,
				     const struct l3_flow *fl)
{
	__u8 *mac = (void *)(mh + 1);
	__u64 h;

	if ((void *)(mac + MRC_AUTH_LEN) > data_end)
		return -1;
	h = auth_mac(k, mh, fl);
	__builtin_memcpy(mac, &h, MRC_AUTH_LEN);
	return 0;
}

/* Receive: 0 when the frame's MAC is right (or auth is off toward the
 * peer and the frame carries none), else the enum mrc_reason to drop it
 * under. fl: the inner packet behind the MAC of a DATA frame (mrc_rx
 * parses it first), NULL for a probe, a reply or a DATA frame whose inner
 * packet is not IP (an all-zero block, as the sender's for it). *kp is the
 * key to re-sign a turned-around probe with. */
static __always_inline __u32 auth_verify(struct mrc_hdr *mh, void *data_end,
					 __u32 udp_len, __u32 peer,
					 const struct l3_flow *fl,
					 const struct mrc_auth_key **kp)
{
	const struct mrc_auth_key *k = auth_key(peer);
	bool flagged = mh->flags & MRC_F_AUTH;
	__u8 *mac = (void *)(mh + 1);
	__u64 got;

	*kp = k;
	if (!k)
		/* A MAC this host has no key for: the two ends disagree
		 * about auth, which the operator must see. */
		return flagged ? MRC_R_RX_BAD_MAC : 0;
	if (!flagged)
		return MRC_R_RX_NO_MAC;
	if ((void *)(mac + MRC_AUTH_LEN) > data_end ||
	    udp_len < sizeof(struct udphdr) + sizeof(*mh) + MRC_AUTH_LEN)
		return MRC_R_RX_TRUNCATED;
	__builtin_memcpy(&got, mac, MRC_AUTH_LEN);
	return got == auth_mac(k, mh, fl) ? 0 : MRC_R_RX_BAD_MAC;
}

#endif /* MRC_AUTH_H */
