/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Every map of the datapath. Each is defined in the header of the concern
 * that owns it, with its writers named there and per field in mrc.h; this
 * file only gathers them.
 *
 * Both tx.bpf.o and rx.bpf.o include this file, so both objects declare
 * every map even where a program uses none of it: the loader
 * (mrcctl load_objects) creates the maps with the first object and hands
 * the same fds to the second with bpf_map__reuse_fd by name, which is how
 * the transmit and receive programs share state. Nothing is pinned: later
 * invocations find the maps by id.
 *
 *   map             owner header
 *   mrc_cfg         config.h
 *   mrc_peers       peer.h
 *   mrc_rx_peers    peer.h
 *   mrc_peer_ip     peer.h
 *   mrc_ovl_owner   peer.h
 *   mrc_peer_seq    peer.h
 *   mrc_paths       path.h
 *   mrc_live        path.h
 *   mrc_admin       path.h
 *   mrc_drops       stats.h
 *   mrc_path_stats  stats.h
 *   mrc_path_cnt    stats.h
 *   mrc_hstats      stats.h
 *   mrc_events      events.h
 *   mrc_slots       spray.h
 *   mrc_flowlets    spray.h
 *   mrc_tx_flows    retx.h
 *   mrc_rx_flows    paws.h
 *   mrc_path_delay  evidence.h
 *   mrc_dedup       dedup.h
 *   mrc_rx_win      reorder.h
 *   mrc_reorder     reorder.h
 *   mrc_rx_epoch    epoch.h
 *   mrc_probe_nonce probe.h
 *   mrc_probe_rl    probe.h
 *   mrc_auth        auth.h
 *   mrc_acl         acl.h
 *   mrc_path_mtu    pmtu.h
 *   mrc_path_cong   congest.h
 *   mrc_path_seq    congest.h
 */
#ifndef MRC_MAPS_H
#define MRC_MAPS_H

#include "config.h"
#include "peer.h"
#include "path.h"
#include "stats.h"
#include "events.h"
#include "spray.h"
#include "retx.h"
#include "paws.h"
#include "evidence.h"
#include "dedup.h"
#include "reorder.h"
#include "epoch.h"
#include "probe.h"
#include "feedback.h"
#include "auth.h"
#include "acl.h"
#include "pmtu.h"
#include "congest.h"

#endif /* MRC_MAPS_H */
