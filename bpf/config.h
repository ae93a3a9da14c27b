/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Instance-wide settings the control plane may change while traffic flows. */
#ifndef MRC_CONFIG_H
#define MRC_CONFIG_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "mrc.h"

/* [0] only; every field: writer agent (mrcctl loader, at `up`). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mrc_config);
} mrc_cfg SEC(".maps");

static __always_inline struct mrc_config *cfg_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&mrc_cfg, &zero);
}

/* The MRC UDP port, host order: 0 in the map means the default. */
static __always_inline __u16 cfg_udp_port(const struct mrc_config *cfg)
{
	return cfg->udp_port ? cfg->udp_port : MRC_DEFAULT_UDP_PORT;
}

#endif /* MRC_CONFIG_H */
