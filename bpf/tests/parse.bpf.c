// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Helper test (tests/unit/test_bpf_helpers.py): parse_ethhdr + parse_l3 on
 * the frame after a 24-byte test header. In: header[0:4] the L3_F_* flags
 * (host order). Out, written back into the header: the status and the
 * descriptor, offsets counted from the frame's first byte.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "parsing.h"

#define TEST_HDR	24

struct parse_result {
	__u32	flags;		/* in */
	__s8	status;		/* enum l3_status */
	__u8	family;
	__u8	proto;
	__u8	frag;
	__u16	hdr_len;
	__u16	l3_off;
	__u16	l4_off;
	__u8	tos;
	__u8	pad;
	__u32	len;
	__u32	rsvd;
} __attribute__((packed));

_Static_assert(sizeof(struct parse_result) == TEST_HDR, "test header size");

SEC("xdp")
int test_parse(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct parse_result *r = data;
	struct hdr_cursor nh = { .pos = data + TEST_HDR };
	struct l3_desc d = {};
	struct ethhdr *eth;
	void *frame = data + TEST_HDR;

	if ((void *)(r + 1) > data_end)
		return XDP_ABORTED;
	r->status = parse_l3(&nh, data_end, parse_ethhdr(&nh, data_end, &eth),
			     r->flags, &d);
	r->family = d.family;
	r->proto = d.proto;
	r->frag = d.frag;
	r->hdr_len = d.hdr_len;
	r->l3_off = d.hdr ? d.hdr - frame : 0;
	r->l4_off = d.l4 ? d.l4 - frame : 0;
	r->tos = d.tos;
	r->len = d.len;
	return XDP_PASS;
}

char _license[] SEC("license") = "Dual BSD/GPL";
