// SPDX-License-Identifier: GPL-2.0-only
/* Which sessions are reported: decided here, so that the ones the sampler drops cost no ring-buffer record
 * and no work in user space. Error sessions are all reported unless sampling.errors (a probability) or
 * sampling.errors_rate_per_s (a rate per error origin) is set; they are counted by origin (stats.bpf.h)
 * before this decision either way. Part of retsnoop.bpf.c; capture/sampling.py turns the configuration
 * into the constants below.
 *
 * By probability (OTel probability sampling): a 56-bit random value R is drawn when the session
 * starts, and a success is kept when R >= success_threshold; R travels with the session end record,
 * where user space makes it the low 56 bits of the trace id. Drawn at the start, so that a success
 * that will not be kept skips the deeper-chain captures (-S) on the way.
 * By rate: at most one success per success_interval_ns per entry function, with a burst of
 * success_burst_ns / success_interval_ns + 1 (a token bucket written as GCRA: one timestamp per
 * entry function, the theoretical arrival time of the next success). One CPU at a time moves an entry
 * function's timestamp, which it claims by inserting the function into rate_busy: a hash map's insert is
 * atomic on every kernel, where BPF's compare-and-swap needs 5.12 (and 5.10 refuses a program holding one,
 * reachable or not). A success that finds the claim taken is dropped: contention never over-admits.
 * Error sessions: by probability as successes (the same R when the start drew one, so a trace has one
 * randomness), drawn at the end otherwise, so a success pays nothing for it; by rate, one bucket per error
 * origin (the chain's deepest function, known only at the end): a rare origin keeps its own budget however
 * often another one fails. */

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);	/* resized to the number of traced functions when sampling by rate */
	__type(key, __u32);
	__type(value, __u64);
} rate_tat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);	/* resized with rate_tat */
	__type(key, __u32);
	__type(value, __u8);
} rate_busy SEC(".maps");

/* The same per error origin (keyed by the origin's function id), sized when error sessions are sampled by rate. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} err_rate_tat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u8);
} err_rate_busy SEC(".maps");

#define RANDOM_MASK ((1ULL << 56) - 1)

static __always_inline void sample_at_start(struct session *s)
{
	if (!capture_success)
		return;
	if (success_interval_ns) {
		s->want_success = 1;	/* the rate decides at the end */
		return;
	}
	s->randomness = (((__u64)bpf_get_prandom_u32() << 32) | bpf_get_prandom_u32()) & RANDOM_MASK;
	s->want_success = s->randomness >= success_threshold;
}

/* One token of key's bucket (GCRA, see above): 1 when taken. */
static __always_inline __u8 take_token(void *tat_map, void *busy_map, __u32 key, __u64 now, __u64 interval,
				       __u64 burst)
{
	__u64 *slot, tat;
	__u8 kept = 0;

	slot = bpf_map_lookup_elem(tat_map, &key);
	if (!slot || bpf_map_update_elem(busy_map, &key, &kept, BPF_NOEXIST))
		return 0;
	tat = *slot;
	if (tat < now)
		tat = now;
	if (tat - now <= burst) {
		*slot = tat + interval;
		kept = 1;
	}
	bpf_map_delete_elem(busy_map, &key);
	return kept;
}

/* A success at its end: the sampling flags it is reported with, or 0 when the sampler drops it. */
static __always_inline __u8 sample_success(struct session *s, __u32 entry_id, __u64 now)
{
	if (!s->want_success)
		return 0;
	if (!success_interval_ns)
		return SAMPLED_PROBABILITY;
	return take_token(&rate_tat, &rate_busy, entry_id, now, success_interval_ns, success_burst_ns) ?
	       SAMPLED_RATE : 0;
}

/* A failure at its end, when error sessions are sampled: the sampling flags it is reported with, or 0. */
static __always_inline __u8 sample_error(struct session *s, __u64 now)
{
	int d = s->chain_depth - 1;

	if (error_interval_ns) {
		if (d < 0)	/* no origin to charge */
			return SAMPLED_RATE;
		return take_token(&err_rate_tat, &err_rate_busy, s->chain_ids[lvl(d)], now, error_interval_ns,
				  error_burst_ns) ? SAMPLED_RATE : 0;
	}
	if (!capture_success || success_interval_ns)	/* no R drawn at the start */
		s->randomness = (((__u64)bpf_get_prandom_u32() << 32) | bpf_get_prandom_u32()) & RANDOM_MASK;
	return s->randomness >= error_threshold ? SAMPLED_PROBABILITY : 0;
}
