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

#endif /* MRC_CSUM_H */
