/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Receive-side evidence about OUR paths: a probe reply, or a feedback echo
 * of a data packet's tx_ts, says a packet we sent rtt_us ago was delivered.
 * From it: the path's confirmed send time and RTT (what judge.h reads),
 * the peer's freshest evidence, recovery of retired paths, and the delay
 * samples the adaptive weights steer by.
 */
#ifndef MRC_EVIDENCE_H
#define MRC_EVIDENCE_H

#include <stdbool.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "mrc.h"
#include "path.h"
#include "peer.h"
#include "stats.h"
#include "events.h"
#include "judge.h"

/* RTT samples above this are stale echoes or garbage (tx_ts wraps every
 * ~71 minutes): ignore them. */
#define EVIDENCE_RTT_MAX_US	(4U * 1000 * 1000)

/* Evidence delay and coverage samples are capped so that a deep queue or
 * a long idle spell does not hide a dead path for long. */
#define EVIDENCE_GAP_CAP_US	20000
#define EVIDENCE_COV_CAP_US	50000

/* recover_probes when the agent has not set it */
#define EVIDENCE_RECOVER_PROBES	3

/* Sender side: RTT of our path from the peer's fresh feedback echoes (what
 * the adaptive weights in mrcctl steer by). Writer: mrc_rx (evidence.h)
 * only. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MRC_N_PATH_ENTRIES);
	__type(key, __u32);
	__type(value, struct mrc_path_delay);
} mrc_path_delay SEC(".maps");

/* RTT bookkeeping shared by probe replies and feedback echoes: last sample
 * and a smoothed value (EWMA with gain 1/8, as TCP's SRTT). The first
 * sample seeds srtt. Racy across CPUs; a lost update only costs a sample. */
static __always_inline void rtt_sample(struct mrc_path_live *live, __u32 rtt_us)
{
	__u32 srtt = live->srtt_us;

	live->rtt_us = rtt_us;
	if (srtt == 0)
		srtt = rtt_us ? rtt_us : 1;
	else
		srtt = srtt - (srtt >> 3) + (rtt_us >> 3);
	live->srtt_us = srtt;
}

/*
 * Evidence that our path delivered a packet sent rtt_us ago. last_ack_ns
 * records when that packet was *sent* (now - rtt), not when the evidence
 * arrived: an echo may repeat a receive timestamp for a while after the
 * path died, and dating the evidence by its send time keeps
 * now - last_ack_ns the honest age of the newest packet known delivered.
 * Monotonic: older evidence never moves it back (racy across CPUs; a lost
 * race costs one sample).
 */
static __always_inline void path_acked(struct mrc_path_live *live,
				       __u64 now_ns, __u32 rtt_us)
{
	__u64 sent_ns;

	if (rtt_us > EVIDENCE_RTT_MAX_US)
		return;
	sent_ns = now_ns - (__u64)rtt_us * 1000;
	if ((__s64)(sent_ns - live->last_ack_ns) > 0)
		live->last_ack_ns = sent_ns;
	rtt_sample(live, rtt_us);
}

static __always_inline __u32 evidence_ewma(__u32 old, __u64 sample)
{
	__u32 v = sample > EVIDENCE_GAP_CAP_US ? EVIDENCE_GAP_CAP_US : (__u32)sample;

	return old ? old - (old >> 3) + (v >> 3) : v;
}

/* One coverage sample (judge.h reads the result): the oldest outstanding
 * unit, sent at un, is covered by evidence arriving now. Kept twice: a
 * smoothed mean (gain 1/8, for display) and a recent peak, which jumps to
 * any larger sample and decays by 1/16 per smaller one - the judge waits
 * for what this path's evidence has recently taken at worst. Measured on
 * a busy host (issue #11.3: 16 paths sharing one echo per reverse packet,
 * `mrcctl top` running), each path heard back only every 11-16 ms and
 * coverage ages reached 25 ms, while the mean of the samples stayed near
 * 3-7 ms: the distribution has a tail a mean and deviation do not see, and
 * a fixed 20 ms retired healthy paths. */
static __always_inline void evidence_cov(struct mrc_path_live *live,
					 struct mrc_peer_seq *seq,
					 __u64 sample_ns, __u64 now)
{
	__u32 v = sample_ns / 1000 > EVIDENCE_COV_CAP_US ? EVIDENCE_COV_CAP_US
							  : (__u32)(sample_ns / 1000);
	__u32 cov = live->ev_cov_us, peak = live->ev_cov_max_us;

	live->ev_cov_us = cov ? cov - (cov >> 3) + (v >> 3) : (v ? v : 1);
	live->ev_cov_max_us = v >= peak ? v : peak - (peak >> 4);
	judge_cov_add(seq, v, now);
}

/* The path's confirmed send time is live->last_ack_ns. If that moved (an
 * echo may repeat an old receipt for a while after the path died), raise
 * the peer's reference, keep the smoothed delay from sending to evidence,
 * and, if this is the first evidence to cover the oldest outstanding unit,
 * a coverage sample (evidence_cov). Races across CPUs only cost a sample. */
static __always_inline bool evidence_new(__u32 peer_idx, __u32 path_id,
					 struct mrc_path_live *live,
					 __u64 now, bool data)
{
	struct mrc_peer_seq *seq;
	__u64 ack_ns = live->last_ack_ns, prev = live->ev_ack_ns, un;

	if (ack_ns == prev)
		return false;
	live->ev_ack_ns = ack_ns;
	/* The reference follows data only: a probe answered while the
	 * reverse stream is starved says nothing about what data is owed. */
	seq = data ? peer_seq(peer_idx) : NULL;
	if (seq && (__s64)(ack_ns - seq->ack_max_ns) > 0) {
		seq->ack_max_ns = ack_ns;
		seq->ack_max_path = path_id;
	}
	live->ev_rtt_us = evidence_ewma(live->ev_rtt_us, (now - ack_ns) / 1000);
	un = live->unacked_ns;
	if (seq && un && (__s64)(ack_ns - un) >= 0 && (__s64)(prev - un) < 0 &&
	    (__s64)(now - un) > 0)
		evidence_cov(live, seq, now - un, now);
	live->ev_rx_ns = now;
	return true;
}

/*
 * Sender side: the peer echoed fb_ts, the send time of the newest packet it
 * received on our path `path`. Only an echo of a newer packet than the last
 * is a sample: the peer may echo the same timestamp again while nothing new
 * arrived, and those ages measure idleness, not delay. The 32-bit
 * microsecond comparison is meaningful only while the last sample is
 * recent (it wraps after ~36 min: an idle of 36-72 min made fresh echoes
 * look old for up to 36 min, issue #13.5); a last sample older than
 * EVIDENCE_RTT_MAX_US cannot be re-echoed as a sample anyway (its RTT would
 * exceed the cap), so it is simply expired. held: the peer held the echo
 * (MRC_F_EHELD), counted as a fresh echo but no sample.
 */
static __always_inline void delay_sample(__u32 peer_idx, __u32 path, __u64 now,
					 __u32 now_us, __u32 fb_ts, bool held)
{
	struct mrc_path_delay *d = path_entry(&mrc_path_delay, peer_idx, path);
	__u32 rtt;

	if (!d)
		return;
	if ((d->samples || d->held) && now - d->last_ns <= (__u64)EVIDENCE_RTT_MAX_US * 1000 &&
	    (__s32)(fb_ts - d->last_fb_ts) <= 0)
		return;
	rtt = now_us - fb_ts;
	if (rtt > EVIDENCE_RTT_MAX_US)
		return;
	d->last_fb_ts = fb_ts;
	d->last_ns = now;
	if (held) {
		d->held += 1;
		return;
	}
	d->rtt_us = rtt;
	d->ewma_us = d->samples ? d->ewma_us - (d->ewma_us >> 2) + (rtt >> 2) : rtt;
	d->samples += 1;
}

/* A feedback echo in a DATA unit from the peer: our path fb delivered the
 * packet we sent at fb_ts. flags: the header's; an echo the peer held
 * (MRC_F_EHELD) is evidence but no delay sample. */
static __always_inline void evidence_echo(__u32 peer_idx, const struct mrc_peer *peer,
					  __u32 fb, __u32 fb_ts, __u8 flags, __u64 now,
					  __u32 now_us)
{
	struct mrc_path_live *fb_live;

	if (fb >= peer->n_paths)
		return;
	fb_live = path_live(peer_idx, fb);
	if (!fb_live)
		return;
	path_acked(fb_live, now, now_us - fb_ts);
	delay_sample(peer_idx, fb, now, now_us, fb_ts, flags & MRC_F_EHELD);
	evidence_new(peer_idx, fb, fb_live, now, true);
}

/*
 * A probe reply on our path. The reply's PSN is the agent's per-path probe
 * sequence number; only replies to probes sent after the path was retired
 * count, and a gap in the sequence (a probe lost) restarts the count, so
 * recovery needs recover_probes consecutive successes, doubled per recent
 * relapse (judge.h).
 */
static __always_inline void evidence_probe_reply(const struct mrc_config *cfg,
						 __u32 peer_idx, __u32 path_id,
						 struct mrc_path_live *live,
						 __u32 probe_seq, __u32 rtt_us,
						 __u64 now)
{
	__u32 prev = live->probe_seq, need, ok;
	__u64 sent = now - (__u64)rtt_us * 1000;

	path_acked(live, now, rtt_us);
	live->probe_seq = probe_seq;
	if (rtt_us > EVIDENCE_RTT_MAX_US)
		return;
	evidence_new(peer_idx, path_id, live, now, false);
	if (live->state != MRC_PATH_ASSUMED_BAD)
		return;
	if ((__s64)(sent - live->bad_ns) < 0)
		return;
	ok = probe_seq == prev + 1 ? live->probe_ok + 1 : 1;
	live->probe_ok = ok;
	need = cfg->recover_probes ? cfg->recover_probes : EVIDENCE_RECOVER_PROBES;
	need <<= live->flaps < HEALTH_MAX_FLAPS ? live->flaps : HEALTH_MAX_FLAPS;
	if (ok < need)
		return;
	if (__sync_val_compare_and_swap(&live->state, MRC_PATH_ASSUMED_BAD,
					MRC_PATH_GOOD) != MRC_PATH_ASSUMED_BAD)
		return;
	live->unacked_ns = 0;
	live->probe_ok = 0;
	live->good_ns = now;
	HSTAT_INC(recovered);
	event_emit(peer_idx, path_id, MRC_PATH_ASSUMED_BAD, MRC_PATH_GOOD,
		   MRC_EV_RECOVERED, rtt_us, now);
}

#endif /* MRC_EVIDENCE_H */
