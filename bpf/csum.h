/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Internet checksum helpers (RFC 1071). */
#ifndef MRC_CSUM_H
#define MRC_CSUM_H

#include <linux/types.h>
#include <linux/ip.h>
#include <bpf/bpf_helpers.h>

/* Fold a 32-bit one's complement sum to 16 bits and complement it. Two
 * folds suffice for any sum of up to 2^16 16-bit words. */
static __always_inline __u16 csum_fold(__u32 csum)
{
	csum = (csum & 0xffff) + (csum >> 16);
	csum = (csum & 0xffff) + (csum >> 16);
	return (__u16)~csum;
}

/* Set the checksum of an option-less IPv4 header. The caller has checked
 * that all 20 bytes lie inside the packet. Works on the raw 16-bit words,
 * so the result is already in network order. */
static __always_inline void ipv4_csum_set(struct iphdr *iph)
{
	__u16 *w = (__u16 *)iph;
	__u32 sum = 0;
	int i;

	iph->check = 0;
#pragma clang loop unroll(full)
	for (i = 0; i < (int)(sizeof(*iph) >> 1); i++)
		sum += w[i];
	iph->check = csum_fold(sum);
}

/* RFC 1624's incremental update, HC' = ~(~HC + ~m + m'), of the checksum
 * at check for a 32-bit field changed from `from` to `to` (both as loaded
 * from the packet): the one's complement sum over the covered bytes is
 * unchanged, so a full checksum stays right and so does an skb's
 * CHECKSUM_COMPLETE sum. */
static __always_inline void csum_replace4(__u16 *check, __u32 from, __u32 to)
{
	__u32 sum = (__u16)~*check;

	sum += (__u16)~from + (__u16)~(from >> 16) + (__u16)to + (__u16)(to >> 16);
	*check = csum_fold(sum);
}

#endif /* MRC_CSUM_H */
