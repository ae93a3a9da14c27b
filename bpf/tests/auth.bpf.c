// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Helper test: siphash24 (auth.h). The frame holds the key (16 bytes:
 * k0, k1 little-endian), the message length (1 byte, <= 64), 7 bytes of
 * padding and the message (64 bytes, zero beyond its length); the hash is
 * written, little-endian, over the frame's first 8 bytes.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "maps.h"

struct sip_case {
	__u64	k0;
	__u64	k1;
	__u8	len;
	__u8	pad[7];
	__u64	m[8];
};

SEC("xdp")
int test_siphash(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct sip_case *c = data;
	__u64 m[9] = {}, last, h;
	__u32 len, nwords, tail, i;

	if ((void *)(c + 1) > data_end)
		return XDP_ABORTED;
	len = c->len;
	if (len > 64)
		return XDP_ABORTED;
	for (i = 0; i < 8; i++)
		m[i] = c->m[i];
	nwords = len / 8;
	tail = len % 8;
	/* the bytes that do not fill a word; the frame is zero beyond len */
	last = (__u64)len << 56;
	if (tail)
		last |= m[nwords & 7] & ((1ULL << (tail * 8)) - 1);
	h = siphash24(c->k0, c->k1, m, nwords, last);
	__builtin_memcpy(data, &h, 8);
	return XDP_PASS;
}

char _license[] SEC("license") = "Dual BSD/GPL";
