// SPDX-License-Identifier: GPL-2.0-only
/* -A: argument values, and the memory they point to, of each call (sent right after its
 * REC_FUNC_ENTRY). Part of retsnoop.bpf.c. */

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);	/* resized to the number of traced functions */
	__type(key, __u32);
	__type(value, struct arg_spec);
} arg_specs SEC(".maps");

static __always_inline __u64 read_arg(void *ctx, int i, bool fentry)
{
	struct pt_regs *regs = ctx;
	__u64 v = 0;

	if (fentry) {
		bpf_get_func_arg(ctx, i, &v);
		return v;
	}
	switch (i) {
	case 0: return PT_REGS_PARM1_CORE(regs);
	case 1: return PT_REGS_PARM2_CORE(regs);
	case 2: return PT_REGS_PARM3_CORE(regs);
	case 3: return PT_REGS_PARM4_CORE(regs);
	case 4: return PT_REGS_PARM5_CORE(regs);
	default: return PT_REGS_PARM6_CORE(regs);
	}
}

static __always_inline void emit_args(void *ctx, struct session *s, __u32 tid, int depth, __u32 func_id,
				      __u32 seq, bool fentry)
{
	struct rec_func_args *r;
	struct arg_spec *as;
	__u32 kind, size;
	__u64 v, avail;
	long n;
	int i;

	as = bpf_map_lookup_elem(&arg_specs, &func_id);
	if (!as)
		return;
	avail = bpf_ringbuf_query(&rb, RB_AVAIL_DATA);
	r = room_for_call_records(avail, sizeof(*r)) ? bpf_ringbuf_reserve(&rb, sizeof(*r), 0) : NULL;
	if (!r) {
		s->dropped_records++;
		return;
	}
	r->type = REC_FUNC_ARGS;
	r->tid = tid;
	r->seq = seq;
	r->func_id = func_id;
	r->depth = depth;
#pragma unroll
	for (i = 0; i < MAX_FUNC_ARGS; i++) {
		kind = as->spec[i] >> ARG_KIND_SHIFT;
		size = as->spec[i] & ARG_SIZE_MASK;
		v = kind ? read_arg(ctx, i, fentry) : 0;
		r->args[i] = v;
		n = 0;
		if (size > MAX_ARG_DATA)
			size = MAX_ARG_DATA;
		if (kind == ARG_PTR && v)
			n = bpf_probe_read_kernel(r->data[i], size, (void *)v) ?: size;
		else if (kind == ARG_STR && v)
			n = bpf_probe_read_kernel_str(r->data[i], MAX_ARG_DATA, (void *)v);
		r->data_len[i] = n;
	}
	bpf_ringbuf_submit(r, rb_wakeup_at(avail, sizeof(*r)));
}
