// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Testbed only (mrcctl fabric): an XDP program that passes everything, for
 * the router end of a veth whose host end answers mrc probes with XDP_TX.
 * A veth drops XDP_TX frames sent toward a peer without an XDP program;
 * with GRO-mode NAPI instead its 256-frame ring filled once and then every
 * XDP_TX failed (xdp_tx_errors, kernel 6.18).
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("xdp")
int xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

/* The same for jumbo links: veth refuses XDP without multi-buffer support
 * on a device whose MTU exceeds a page. */
SEC("xdp.frags")
int xdp_pass_frags(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char _license[] SEC("license") = "Dual BSD/GPL";
