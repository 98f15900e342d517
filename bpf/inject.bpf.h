// SPDX-License-Identifier: GPL-2.0-only
/* Injected probes (-J, retsnoop's --inject-probe): a kprobe (at a function or an offset inside it), a kretprobe,
 * a raw tracepoint or a tracepoint that records, inside the thread's session only, a REC_INJECT_PROBE in the
 * per-call record stream, between the entries and exits around it (a seq of its own). Part of retsnoop.bpf.c,
 * included after flavours.bpf.h. Not loaded unless -J is given ("?" sections: kernel/inject_attach.py turns on
 * the programs of the kinds in use). Each link's BPF cookie is its probe id (kprobes and tracepoints 5.15+, raw
 * tracepoints 6.10+: user space refuses the kinds a kernel cannot tell apart). */

struct inject_info {
	__u32 size;	/* payload bytes to copy from the context: a tracepoint entry's, or 8 x a raw tracepoint's args */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);	/* resized to the number of injected probes */
	__type(key, __u32);
	__type(value, struct inject_info);
} inject_infos SEC(".maps");

/* The held records go out and the session streams from now on: a probe's payload is too large to hold. */
static __always_inline bool inject_stream(struct session *s, __u32 key)
{
	struct capture_stats *cs;

	if (s->streaming)
		return true;
	s->streaming = 1;
	if (release_calls(s, key))
		return true;
	s->defunct = 1;
	cs = cstats();
	if (cs)
		cs->dropped_sessions++;
	return false;
}

/* `src`: where the payload is (NULL: none) */
static __always_inline void inject_fire(void *ctx, __u64 value, const void *src)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid(), key = session_key(tid);
	__u32 probe_id = (__u32)bpf_get_attach_cookie(ctx);
	struct rec_inject_probe *r;
	struct inject_info *info;
	struct session *s;
	__u64 avail, size;
	int d;

	s = bpf_map_lookup_elem(&sessions, &key);
	if (!ready || !emit_calls || !s || !s->active || s->defunct)
		return;
	info = bpf_map_lookup_elem(&inject_infos, &probe_id);
	if (!info || !inject_stream(s, key))
		return;
	d = s->depth;
	if (d > max_depth)
		d = max_depth;
	avail = bpf_ringbuf_query(&rb, RB_AVAIL_DATA);
	r = room_for_call_records(avail, sizeof(*r)) ? bpf_ringbuf_reserve(&rb, sizeof(*r), 0) : NULL;
	if (!r) {
		s->next_seq++;	/* a gap user space shows where the probe was lost */
		lost_records(s, 1);
		return;
	}
	r->type = REC_INJECT_PROBE;
	r->tid = tid;
	r->ts = bpf_ktime_get_boot_ns();
	r->seq = s->next_seq++;
	r->depth = d < 0 ? 0 : d;
	r->probe_id = probe_id;
	r->value = value;
	r->pad = 0;
	size = src ? info->size : 0;
	asm volatile("" : "+r"(size));	/* the bound below must stay in the code for the verifier */
	if (size > MAX_INJECT_DATA)
		size = MAX_INJECT_DATA;
	r->data_len = size ? bpf_probe_read_kernel(r->data, size, src) : 0;
	if (!r->data_len)
		r->data_len = size;
	bpf_ringbuf_submit(r, rb_wakeup_at(avail, sizeof(*r)));
}

/* fentry programs may run inside these (a traced helper): the guard keeps them out of a half-written record */
static __always_inline void inject_run(void *ctx, __u64 value, const void *src)
{
	if (!enter_guard())
		return;
	inject_fire(ctx, value, src);
	exit_guard();
}

SEC("?kprobe")
int inject_kprobe(struct pt_regs *ctx)
{
	inject_run(ctx, PT_REGS_IP(ctx), NULL);
	return 0;
}

SEC("?kretprobe")
int inject_kretprobe(struct pt_regs *ctx)
{
	inject_run(ctx, PT_REGS_RC(ctx), NULL);
	return 0;
}

/* the context is the trace event's raw entry (common fields first), as tracefs' format file lays it out */
SEC("?tracepoint")
int inject_tp(void *ctx)
{
	inject_run(ctx, 0, ctx);
	return 0;
}

/* the context is the tracepoint's arguments, one u64 each */
SEC("?raw_tp")
int inject_rawtp(void *ctx)
{
	inject_run(ctx, 0, ctx);
	return 0;
}
