/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Path health in the datapath: liveness judgement, ev_min_active, hedging,
 * the duplicate filter, probe-driven recovery and EV events.
 *
 * Who writes a path's state: the datapath moves GOOD <-> ASSUMED_BAD with
 * compare-and-swap on mrc_path_live.state (tx on missing evidence, rx on
 * probe replies), so two CPUs never both report one transition; the agent
 * only forces ASSUMED_BAD when a plane's link goes down. DENIED lives in
 * mrc_path.admin and only the operator sets it.
 *
 * Liveness: see health_judge. live->unacked_ns is the send time of the
 * oldest unit not yet covered by evidence (last_ack_ns is dated by the
 * *send* time of the newest packet known delivered, see rx.bpf.c
 * path_acked). A path nobody sends on is never judged, so an idle
 * connection does not declare its paths dead.
 */
#ifndef MRC_HEALTH_H
#define MRC_HEALTH_H

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include "mrc.h"
#include "maps.h"
#include "stats.h"
#include "encap.h"

/* Evidence delay and gap samples are capped so that a deep queue or a long
 * idle spell does not hide a dead path for long. */
#define HEALTH_GAP_CAP_US	20000

/* A relapse to ASSUMED_BAD within this long of recovering doubles the
 * probes needed next time (up to 2^HEALTH_MAX_FLAPS times recover_probes):
 * a flapping plane settles to ASSUMED_BAD instead of oscillating. */
#define HEALTH_FLAP_WINDOW_NS	(1000ULL * 1000 * 1000)
#define HEALTH_MAX_FLAPS	4

/* Feedback: how many paths after the round-robin cursor to look at for one
 * with a receipt not yet echoed. */
#define HEALTH_ECHO_SCAN	16

/* Hedging partner search: path ids after the suspect one to look at. */
#define HEALTH_HEDGE_SCAN	32

#define HEALTH_FB_FRESH_NS	1000000000ULL

enum health_verdict {
	H_UNUSABLE	= -1,
	H_OK		= 0,
	H_SUSPECT	= 1,
};

static __always_inline struct mrc_hstats *health_stats(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&mrc_hstats, &zero);
}

static __always_inline void health_emit(__u32 peer, __u32 path, __u32 old_state,
					__u32 new_state, __u32 reason,
					__u32 age_us, __u64 now)
{
	struct mrc_event ev = {
		.ts_ns = now, .peer = peer, .path = path,
		.old_state = old_state, .new_state = new_state,
		.reason = reason, .age_us = age_us,
	};
	struct mrc_hstats *hs;

	if (bpf_ringbuf_output(&mrc_events, &ev, sizeof(ev), 0)) {
		hs = health_stats();
		if (hs)
			hs->events_lost += 1;
	}
}

static __always_inline bool health_path_good(__u32 peer_idx, __u32 pid)
{
	__u32 idx = MRC_PATH_IDX(peer_idx, pid);
	struct mrc_path *p = bpf_map_lookup_elem(&mrc_paths, &idx);
	struct mrc_path_live *l = bpf_map_lookup_elem(&mrc_live, &idx);

	return p && l && p->ifindex && p->admin != MRC_PATH_DENIED &&
	       l->state == MRC_PATH_GOOD;
}

/* Are at least `want` paths other than `skip` GOOD? Only runs when a path is
 * about to be declared dead, which is rare. Two CPUs retiring two paths at
 * once may both see the other still GOOD: the guard can then be short by
 * one, and health_fallback still keeps the peer reachable. bpf_loop: the
 * verifier checks the body once instead of once per iteration per call
 * site. */
struct health_count_ctx {
	__u32	peer;
	__u32	skip;
	__u32	want;
	__u32	n;
};

static long health_count_cb(__u32 i, void *arg)
{
	struct health_count_ctx *c = arg;

	if (i == c->skip || i >= MRC_MAX_PATHS)
		return 0;
	if (health_path_good(c->peer, i) && ++c->n >= c->want)
		return 1;
	return 0;
}

static __always_inline bool health_enough_good(__u32 peer_idx, __u32 n_paths,
					       __u32 skip, __u32 want)
{
	struct health_count_ctx c = { .peer = peer_idx, .skip = skip, .want = want };

	if (want == 0)
		return true;
	if (n_paths > MRC_MAX_PATHS)
		n_paths = MRC_MAX_PATHS;
	bpf_loop(n_paths, health_count_cb, &c, 0);
	return c.n >= want;
}

/*
 * Judge a configured, not denied path for the next unit. GOOD paths are
 * usable (H_OK or H_SUSPECT); a GOOD path whose evidence is overdue is
 * retired here, unless that would leave fewer than min_active GOOD paths.
 *
 * "Overdue": the path's oldest outstanding unit was sent at unacked_ns, and
 *  - a packet sent more than dead_after later has already been confirmed
 *    on some other path (mrc_peer_seq.ack_max_ns): a peer gone silent
 *    altogether retires nothing, there would be nothing better to move to;
 *  - and it is more than dead_after later than this path's own smoothed
 *    RTT and evidence gap allow: queues differ between planes (measured
 *    here: up to ~8 ms between tbf-shaped planes under one TCP flow), and
 *    feedback reaches each path only every few reverse packets.
 * A path that is merely idle has nothing outstanding.
 */
static __always_inline int health_judge(const struct mrc_config *cfg,
					const struct mrc_peer *peer,
					__u32 peer_idx, __u32 pid,
					struct mrc_path_live *live, __u64 now)
{
	struct mrc_hstats *hs;
	struct mrc_peer_seq *seq;
	__u64 un, ack;
	__s64 lag, late;

	if (live->state != MRC_PATH_GOOD)
		return H_UNUSABLE;
	if (!(cfg->flags & MRC_CFG_LIVENESS) || cfg->dead_after_us == 0)
		return H_OK;

	un = live->unacked_ns;
	ack = live->last_ack_ns;
	if (un == 0 || (__s64)(ack - un) >= 0) {
		/* Everything sent so far is accounted for: this unit is
		 * the oldest outstanding one. */
		live->unacked_ns = now;
		live->strike_ns = 0;
		return H_OK;
	}
	seq = bpf_map_lookup_elem(&mrc_peer_seq, &peer_idx);
	if (!seq)
		return H_OK;
	/* Late relative to the peer's freshest evidence (a peer gone silent
	 * altogether retires nothing), and late against this path's own
	 * smoothed RTT and evidence gap (planes queue differently). */
	lag = (__s64)(seq->ack_max_ns - un);
	late = (__s64)(now - un) - (__s64)live->ev_rtt_us * 1000;
	if (late < lag)
		lag = late;
	if (lag > (__s64)cfg->dead_after_us * 1000) {
		/* Two strikes: one lost unit (a congestion drop, a queue
		 * spike) must not retire a path. The first verdict restarts
		 * the observation with this unit; only if it and what
		 * follows also go unconfirmed is the path dead. */
		if (!live->strike_ns || (__s64)(ack - live->strike_ns) >= 0) {
			live->strike_ns = now;
			live->unacked_ns = now;
			return H_SUSPECT;
		}
		hs = health_stats();
		if (!health_enough_good(peer_idx, peer->n_paths, pid,
					peer->min_active)) {
			if (hs)
				hs->min_active_held += 1;
			return H_SUSPECT;
		}
		if (__sync_val_compare_and_swap(&live->state, MRC_PATH_GOOD,
						MRC_PATH_ASSUMED_BAD) !=
		    MRC_PATH_GOOD)
			return H_UNUSABLE;	/* another CPU did it */
		if (live->good_ns && now - live->good_ns < HEALTH_FLAP_WINDOW_NS) {
			if (live->flaps < HEALTH_MAX_FLAPS)
				live->flaps += 1;
		} else {
			live->flaps = 0;
		}
		live->bad_ns = now;
		live->probe_ok = 0;
		live->strike_ns = 0;
		if (hs)
			hs->dead += 1;
		health_emit(peer_idx, pid, MRC_PATH_GOOD, MRC_PATH_ASSUMED_BAD,
			    MRC_EV_DEAD, (__u32)((now - un) / 1000), now);
		return H_UNUSABLE;
	}
	/* A path with a strike stays suspect until evidence covers a unit
	 * sent after the strike (that clears strike_ns above). The strike
	 * restarted the observation, so `lag` starts again from zero: judged
	 * by lag alone, a dead plane's units went unhedged for hedge_after
	 * after every first strike, and TCP's retransmissions among them
	 * were lost again - a 200 ms RTO stall in 4 of 4 hedged failover
	 * runs (docs/benchmarks/failover.md). */
	if (live->strike_ns)
		return H_SUSPECT;
	if (cfg->hedge_after_us && lag > (__s64)cfg->hedge_after_us * 1000)
		return H_SUSPECT;
	return H_OK;
}

static __always_inline __u32 health_ewma(__u32 old, __u64 sample)
{
	__u32 v = sample > HEALTH_GAP_CAP_US ? HEALTH_GAP_CAP_US : (__u32)sample;

	return old ? old - (old >> 3) + (v >> 3) : v;
}

/* rx: evidence for one of our paths arrived (a probe reply or an echo):
 * the path's confirmed send time is live->last_ack_ns. If that moved (an
 * echo may repeat an old receipt for a while after the path died), raise
 * the peer's reference and keep two smoothed values (gain 1/8): the delay
 * from sending to evidence, and the gap between new evidence - the
 * feedback covers one path per reverse packet, so with many paths and a
 * slow reverse stream each path hears back only every few ms, and the
 * judgement must allow for that. Races across CPUs only cost a sample. */
static __always_inline bool health_peer_evidence(__u32 peer_idx, __u32 path_id,
						 struct mrc_path_live *live,
						 __u64 now, bool data)
{
	struct mrc_peer_seq *seq;
	__u64 ack_ns = live->last_ack_ns;

	if (ack_ns == live->ev_ack_ns)
		return false;
	live->ev_ack_ns = ack_ns;
	/* The reference follows data only: a probe answered while the
	 * reverse stream is starved says nothing about what data is owed. */
	seq = data ? bpf_map_lookup_elem(&mrc_peer_seq, &peer_idx) : NULL;
	if (seq && (__s64)(ack_ns - seq->ack_max_ns) > 0) {
		seq->ack_max_ns = ack_ns;
		seq->ack_max_path = path_id;
	}
	live->ev_rtt_us = health_ewma(live->ev_rtt_us, (now - ack_ns) / 1000);
	if (live->ev_rx_ns)
		live->ev_gap_us = health_ewma(live->ev_gap_us,
					      (now - live->ev_rx_ns) / 1000);
	live->ev_rx_ns = now;
	return true;
}

/*
 * No slot near the cursor led to a usable path (the agent has not rebuilt
 * the slot table yet, or everything looks bad): any GOOD path, else - so
 * that false positives never black out a peer - with min_active > 0 the
 * first path not denied, whatever its state. -1: nothing to send on.
 */
struct health_fb_ctx {
	__u32	peer;
	__u32	start;
	__u32	n_paths;
	int	good;
	int	any;
};

static long health_fb_cb(__u32 i, void *arg)
{
	struct health_fb_ctx *c = arg;
	struct mrc_path *p;
	__u32 pid, idx;

	if (c->n_paths == 0)
		return 1;
	pid = (c->start + i) % c->n_paths;
	if (pid >= MRC_MAX_PATHS)
		return 1;
	if (health_path_good(c->peer, pid)) {
		c->good = pid;
		return 1;
	}
	if (c->any < 0) {
		idx = MRC_PATH_IDX(c->peer, pid);
		p = bpf_map_lookup_elem(&mrc_paths, &idx);
		if (p && p->ifindex && p->admin != MRC_PATH_DENIED)
			c->any = pid;
	}
	return 0;
}

static __always_inline int health_fallback(__u32 peer_idx, __u32 n_paths,
					   __u32 start, __u32 min_active)
{
	struct health_fb_ctx c = { .peer = peer_idx, .start = start,
				   .n_paths = n_paths, .good = -1, .any = -1 };
	struct mrc_hstats *hs;

	if (n_paths > MRC_MAX_PATHS)
		n_paths = c.n_paths = MRC_MAX_PATHS;
	bpf_loop(n_paths, health_fb_cb, &c, 0);
	if (c.good >= 0)
		return c.good;
	if (!min_active || c.any < 0)
		return -1;
	hs = health_stats();
	if (hs)
		hs->fallback += 1;
	return c.any;
}

/*
 * Is this TCP unit (payload [seq, seq + len)) a retransmission: does it end
 * at or below the highest sequence its flow has sent? Records the new high
 * otherwise. mrc_tx sends retransmissions on the path that confirmed
 * delivery most recently (mrc_peer_seq.ack_max_path): they are the packets
 * whose loss costs most. Right after a plane fails, before its paths look
 * suspect (hedge_after plus their evidence delay), TCP retransmits what the
 * plane lost; a retransmission sprayed onto the same plane is lost again,
 * and if nothing is sent after it RACK cannot notice - TCP waits for its
 * 200 ms RTO (seen in 2 of 5 hedged failover runs: the flow's last
 * unacknowledged unit resent onto the dead plane). OCP MRC likewise moves
 * retransmissions to another EV.
 */
static __always_inline bool health_tcp_retx(__u32 peer_idx,
					    const struct iphdr *iph,
					    const struct tcphdr *th,
					    __u32 seq, __u32 len)
{
	struct mrc_tx_flows *f;
	__u32 h, end = seq + len;
	__u64 *slot, v;

	if (len == 0)
		return false;
	f = bpf_map_lookup_elem(&mrc_tx_flows, &peer_idx);
	if (!f)
		return false;
	h = (iph->saddr ^ iph->daddr ^ ((__u32)th->source << 16 | th->dest)) *
	    0x9E3779B1u;
	slot = &f->hi[(h >> 26) & (MRC_TX_FLOWS - 1)];
	v = *slot;
	if ((__u32)(v >> 32) == h && (__s32)(end - (__u32)v) <= 0)
		return true;
	*slot = (__u64)h << 32 | end;
	return false;
}

static __always_inline void health_count_retx(void)
{
	struct mrc_hstats *hs = health_stats();

	if (hs)
		hs->retx_steered += 1;
}

/* A GOOD, not suspect path of the same family on another plane to carry a
 * copy of a unit sent on the suspect path `pid`; -1 if none nearby. */
static __always_inline int health_hedge_partner(const struct mrc_config *cfg,
						__u32 peer_idx, __u32 n_paths,
						__u32 pid,
						const struct mrc_path *sus,
						__u64 now)
{
	__u32 i, q, idx;

	for (i = 1; i <= HEALTH_HEDGE_SCAN; i++) {
		struct mrc_path *p;
		struct mrc_path_live *l;

		if (i >= n_paths)
			break;
		q = (pid + i) % n_paths;
		idx = MRC_PATH_IDX(peer_idx, q & (MRC_MAX_PATHS - 1));
		p = bpf_map_lookup_elem(&mrc_paths, &idx);
		l = bpf_map_lookup_elem(&mrc_live, &idx);
		if (!p || !l || !p->ifindex || p->admin == MRC_PATH_DENIED ||
		    l->state != MRC_PATH_GOOD)
			continue;
		if (p->family != sus->family || p->plane == sus->plane)
			continue;
		/* a partner that is itself overdue would not help */
		if (cfg->hedge_after_us && l->unacked_ns &&
		    (__s64)(l->last_ack_ns - l->unacked_ns) < 0 &&
		    now - l->unacked_ns > (__u64)cfg->dead_after_us * 1000)
			continue;
		return q;
	}
	return -1;
}

/*
 * Send the encapsulated unit (headers of path `a`, id u->path_id) out of a
 * as a clone, then rewrite the original's headers for path `b`. Returns the
 * path the caller redirects the original to: b, or a if anything failed
 * (then a gets the unit twice; the receiver's filter drops one). Both copies
 * carry MRC_F_HEDGE (set by the caller) so the receiver filters duplicates.
 * bpf_clone_redirect leaves the original sharing its data with the clone:
 * pulling the headers makes them private before they are rewritten.
 */
static __always_inline struct mrc_path *
health_hedge(struct __sk_buff *skb, __u32 peer_idx, struct mrc_path *a,
	     __u32 b_id, struct mrc_unit *u, __u32 port, __u64 wire_bytes)
{
	void *data, *data_end;
	struct ethhdr *eth;
	struct mrc_path *b;
	struct mrc_path_stats *st;
	struct mrc_hstats *hs;
	__u32 idx, len, l3 = a->family == 4 ? 20 : 40;

	/* a clone cannot go through the neighbour table */
	if (!(a->dmac[0] | a->dmac[1] | a->dmac[2] | a->dmac[3] |
	      a->dmac[4] | a->dmac[5]))
		return a;
	idx = MRC_PATH_IDX(peer_idx, b_id & (MRC_MAX_PATHS - 1));
	b = bpf_map_lookup_elem(&mrc_paths, &idx);
	if (!b || b->family != a->family)
		return a;
	/* > 0 is NET_XMIT_DROP/CN from the queue: the clone was handed over */
	if (bpf_clone_redirect(skb, a->ifindex, 0) < 0)
		return a;
	st = path_stats(peer_idx, u->path_id);
	if (st) {
		st->tx_packets += u->segs;
		st->tx_bytes += wire_bytes;
	}
	hs = health_stats();
	if (hs)
		hs->hedged += 1;
	if (bpf_skb_pull_data(skb, ETH_HLEN + l3 + 8 + MRC_HDR_LEN))
		return a;
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	len = skb->len;
	eth = data;
	u->path_id = b_id;
	if (a->family == 4) {
		struct iphdr *oip = (void *)(eth + 1);
		struct udphdr *udp = (void *)(oip + 1);
		struct mrc_hdr *mh = (void *)(udp + 1);

		if ((void *)(mh + 1) > data_end)
			return a;
		write_eth(eth, b, ETH_P_IP);
		write_ipv4(oip, b, len - ETH_HLEN, u);
		write_udp(udp, b->ev, port, len - ETH_HLEN - sizeof(*oip));
		write_mrc(mh, MRC_T_DATA, u);
	} else {
		struct ipv6hdr *oip6 = (void *)(eth + 1);
		struct udphdr *udp = (void *)(oip6 + 1);
		struct mrc_hdr *mh = (void *)(udp + 1);

		if ((void *)(mh + 1) > data_end)
			return a;
		write_eth(eth, b, ETH_P_IPV6);
		write_ipv6(oip6, b, len - ETH_HLEN - sizeof(*oip6), u);
		write_udp(udp, b->ev, port, len - ETH_HLEN - sizeof(*oip6));
		write_mrc(mh, MRC_T_DATA, u);
	}
	return b;
}

/*
 * Feedback for the peer: one of the peer's paths toward us and the tx_ts of
 * the newest packet received on it. Among the paths near the round-robin
 * cursor whose newest receipt was not echoed yet, echo the *oldest* one
 * (else the cursor's path, if fresh). Echoing in send order matters to the
 * peer's judgement (health_judge): if a later receipt on another path were
 * echoed first, the peer would see its reference move past a packet that
 * did arrive, only not yet said so - a false "dead" whenever reverse
 * packets are few (pure ACKs, delayed ACKs).
 */
struct health_echo_ctx {
	__u64	now;
	__u32	peer;
	__u32	n;
	__u32	start;
	int	pick;		/* oldest unechoed receipt */
	__u32	pick_ts;
	int	first;		/* the cursor's path, if fresh */
};

static long health_echo_cb(__u32 i, void *arg)
{
	struct health_echo_ctx *c = arg;
	struct mrc_path_live *l;
	__u32 p;

	if (c->n == 0)
		return 1;
	p = c->start + i;	/* start < n and i < n */
	if (p >= c->n)
		p -= c->n;
	l = path_live(c->peer, p);
	if (!l || !l->last_rx_ns ||
	    (__s64)(c->now - l->last_rx_ns) >= (__s64)HEALTH_FB_FRESH_NS)
		return 0;
	if (i == 0)
		c->first = p;
	if (l->fb_echoed != l->last_rx_ts &&
	    (c->pick < 0 || (__s32)(l->last_rx_ts - c->pick_ts) < 0)) {
		c->pick = p;
		c->pick_ts = l->last_rx_ts;
	}
	return 0;
}

static __always_inline void health_pick_echo(struct mrc_peer_seq *seq,
					     __u32 peer_idx, __u32 n_paths,
					     __u64 now, struct mrc_unit *u)
{
	struct health_echo_ctx c = { .now = now, .peer = peer_idx,
				     .n = n_paths, .pick = -1, .first = -1 };
	struct mrc_path_live *l;
	int p;

	if (n_paths == 0 || n_paths > MRC_MAX_PATHS)
		return;
	/* The cursor only spreads the scan's starting point: a plain
	 * read-modify-write (two CPUs may start at the same path) and a
	 * compare instead of an atomic and a division, ~40 ns per unit
	 * less in this VM (benchmark: mrc_tx per-packet cost). */
	c.start = seq->fb_cursor < n_paths ? (__u32)seq->fb_cursor : 0;
	seq->fb_cursor = c.start + 1 < n_paths ? c.start + 1 : 0;
	bpf_loop(n_paths < HEALTH_ECHO_SCAN ? n_paths : HEALTH_ECHO_SCAN,
		 health_echo_cb, &c, 0);
	p = c.pick >= 0 ? c.pick : c.first;
	if (p < 0)
		return;
	l = path_live(peer_idx, p);
	if (!l)
		return;
	u->flags |= MRC_F_FEEDBACK;
	u->fb_path = p;
	u->fb_ts = l->last_rx_ts;
	l->fb_echoed = u->fb_ts;
}

/*
 * rx: a probe reply on our path. The reply's PSN is the agent's per-path
 * probe sequence number; only replies to probes sent after the path was
 * retired count, and a gap in the sequence (a probe lost) restarts the
 * count, so recovery needs recover_probes consecutive successes, doubled
 * per recent relapse.
 */
static __always_inline void health_probe_reply(const struct mrc_config *cfg,
					       __u32 peer_idx, __u32 path_id,
					       struct mrc_path_live *live,
					       __u32 probe_seq, __u32 rtt_us,
					       __u64 now)
{
	struct mrc_hstats *hs;
	__u32 prev = live->probe_seq, need, ok;
	__u64 sent = now - (__u64)rtt_us * 1000;

	live->probe_seq = probe_seq;
	if (rtt_us > 4U * 1000 * 1000)	/* stale or garbage */
		return;
	health_peer_evidence(peer_idx, path_id, live, now, false);
	if (live->state != MRC_PATH_ASSUMED_BAD)
		return;
	if ((__s64)(sent - live->bad_ns) < 0)
		return;
	ok = probe_seq == prev + 1 ? live->probe_ok + 1 : 1;
	live->probe_ok = ok;
	need = cfg->recover_probes ? cfg->recover_probes : 3;
	need <<= live->flaps < HEALTH_MAX_FLAPS ? live->flaps : HEALTH_MAX_FLAPS;
	if (ok < need)
		return;
	if (__sync_val_compare_and_swap(&live->state, MRC_PATH_ASSUMED_BAD,
					MRC_PATH_GOOD) != MRC_PATH_ASSUMED_BAD)
		return;
	live->unacked_ns = 0;
	live->probe_ok = 0;
	live->good_ns = now;
	hs = health_stats();
	if (hs)
		hs->recovered += 1;
	health_emit(peer_idx, path_id, MRC_PATH_ASSUMED_BAD, MRC_PATH_GOOD,
		    MRC_EV_RECOVERED, rtt_us, now);
}

/* Bounded compare-and-swap retries of the duplicate filter; losing them all
 * (four other CPUs changed the word meanwhile) delivers the packet. */
#define HEALTH_DEDUP_RETRIES	4

/* rx: has wire PSN `psn` of a hedged unit from this peer been seen? Marks
 * it seen. PSNs older than the window are let through (TCP copes with a
 * rare duplicate; dropping a first copy would cost a retransmission). */
static __always_inline bool health_dedup(__u32 peer_idx, __u32 psn)
{
	struct mrc_dedup *d = bpf_map_lookup_elem(&mrc_dedup, &peer_idx);
	__u32 tag = psn >> 5, i;
	__u64 bit = 1ULL << (psn & 31), *w, old, new;
	struct mrc_hstats *hs;

	if (!d)
		return false;
	w = &d->w[tag & (MRC_DEDUP_WORDS - 1)];
	for (i = 0; i < HEALTH_DEDUP_RETRIES; i++) {
		old = *w;
		if ((__u32)(old >> 32) == tag) {
			if (old & bit) {
				hs = health_stats();
				if (hs)
					hs->dedup_drops += 1;
				return true;
			}
			new = old | bit;
		} else if ((__s32)(tag - (__u32)(old >> 32)) > 0 || old == 0) {
			new = ((__u64)tag << 32) | bit;
		} else {
			return false;	/* older than the window */
		}
		if (__sync_val_compare_and_swap(w, old, new) == old)
			return false;
	}
	return false;
}

#endif /* MRC_HEALTH_H */
