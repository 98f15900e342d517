// SPDX-License-Identifier: GPL-2.0-only
/* Per-call records (mode calls, -T): the session start record, entries and exits. Part of retsnoop.bpf.c.
 *
 * A session's first CALL_BUF_RECS records wait in call_bufs until its end, where a reported session
 * (an error, or a success the sampler keeps) sends them as one REC_FUNC_BATCH after its
 * REC_SESSION_START, and a dropped one sends nothing. A session that outgrows the buffer sends what
 * it holds at once and streams the rest (its outcome is not known yet): nothing of an error session
 * is ever lost to sampling. With -A (arguments, too large to hold) sessions stream from the start. */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);	/* resized in mode calls; a session that finds it full streams */
	__type(key, __u32);
	__type(value, struct rec_func_batch);
} call_bufs SEC(".maps");

static const struct rec_func_batch empty_batch = {};

/* Room per-call records leave free for session end records (two, with their 8-byte headers): when
 * calls flood the ring buffer, the session still arrives, with its gap counted, instead of vanishing. */
#define END_RECORD_HEADROOM (2 * (sizeof(struct rec_session_end) + 8))

/* `avail`: bpf_ringbuf_query(RB_AVAIL_DATA), queried once per record and reused for its wakeup flag */
static __always_inline bool room_for_call_records(__u64 avail, __u64 size)
{
	return avail + size + 8 + END_RECORD_HEADROOM <= rb_bytes;
}

static __always_inline void lost_records(struct session *s, __u32 n)
{
	struct capture_stats *cs = cstats();

	if (!cs)
		return;
	if (!s->dropped_records)
		cs->incomplete_sessions++;
	cs->dropped_records += n;
	s->dropped_records += n;
}

/* Called when the session starts: hold its records back, or (no buffer) stream them from now on. */
static __always_inline void hold_calls(struct session *s, __u32 key)
{
	s->streaming = capture_args || bpf_map_update_elem(&call_bufs, &key, &empty_batch, BPF_ANY);
}

static __always_inline bool emit_start(struct session *s)
{
	struct rec_session_start *r = bpf_ringbuf_reserve(&rb, sizeof(*r), 0);

	if (!r)
		return false;
	r->type = REC_SESSION_START;
	r->tid = s->tid;
	r->tgid = s->tgid;
	r->cpu = s->cpu;
	r->start_ts = s->start_ts;
	read_names(r->comm, r->proc_comm, s->tid, s->tgid);
	bpf_ringbuf_submit(r, rb_wakeup(sizeof(*r)));
	return true;
}

/* The start record and the held records go out; false when not even the start record fit. */
static __always_inline bool release_calls(struct session *s, __u32 key)
{
	__u64 avail;
	struct rec_func_batch *b = bpf_map_lookup_elem(&call_bufs, &key);
	__u32 n = b ? b->cnt : 0;
	__u64 size;

	if (n > CALL_BUF_RECS)
		n = CALL_BUF_RECS;
	if (!emit_start(s)) {
		if (n)
			lost_records(s, n);	/* an end record that follows shows the gap */
		return false;
	}
	if (!b || !n)
		return true;
	b->type = REC_FUNC_BATCH;
	b->tid = s->tid;
	b->start_ts = s->start_ts;
	size = sizeof(*b) - sizeof(b->recs) + n * sizeof(b->recs[0]);
	/* hidden from the compiler, so that the bound it already knows stays in the code: 6.1's verifier
	 * otherwise sees the size recomputed from an unbounded spill of `n` */
	asm volatile("" : "+r"(size));
	if (size > sizeof(*b))
		size = sizeof(*b);
	avail = bpf_ringbuf_query(&rb, RB_AVAIL_DATA);
	if (!room_for_call_records(avail, size) || bpf_ringbuf_output(&rb, b, size, rb_wakeup_at(avail, size)))
		lost_records(s, n);
	b->cnt = 0;
	return true;
}

static __always_inline void fill_trace(struct rec_func_trace *r, __u32 type, __u32 tid, __u64 ts, __u32 seq,
				       int depth, __u32 func_id, __u64 lat, __s64 res)
{
	r->type = type;
	r->tid = tid;
	r->ts = ts;
	r->seq = seq;
	r->depth = depth;
	r->func_id = func_id;
	r->lat = lat;
	r->res = res;
}

static __always_inline void emit_trace(struct session *s, __u32 key, __u32 type, __u32 tid, __u64 ts, int depth,
				       __u32 func_id, __u64 lat, __s64 res)
{
	struct rec_func_trace *r;
	struct rec_func_batch *b;
	__u64 avail;
	__u32 n;

	if (!s->streaming) {
		b = bpf_map_lookup_elem(&call_bufs, &key);
		if (b) {
			n = b->cnt;
			if (n < CALL_BUF_RECS) {
				fill_trace(&b->recs[n & (CALL_BUF_RECS - 1)], type, tid, ts, s->next_seq++, depth, func_id,
					   lat, res);
				b->cnt = n + 1;
				return;
			}
		}
		/* outgrown (or lost) buffer: what it holds goes out now, the rest of the session streams */
		s->streaming = 1;
		if (!release_calls(s, key)) {
			struct capture_stats *cs = cstats();

			s->defunct = 1;
			if (cs)
				cs->dropped_sessions++;
			return;
		}
	}
	avail = bpf_ringbuf_query(&rb, RB_AVAIL_DATA);
	r = room_for_call_records(avail, sizeof(*r)) ? bpf_ringbuf_reserve(&rb, sizeof(*r), 0) : NULL;
	if (!r) {
		s->next_seq++;	/* the gap in sequence numbers shows user space where records were lost */
		lost_records(s, 1);
		return;
	}
	fill_trace(r, type, tid, ts, s->next_seq++, depth, func_id, lat, res);
	bpf_ringbuf_submit(r, rb_wakeup_at(avail, sizeof(*r)));
}
