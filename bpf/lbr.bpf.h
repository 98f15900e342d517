// SPDX-License-Identifier: GPL-2.0-only
/* --lbr: the CPU's last branch records at the return that last (re)started a session's chain.
 * Part of retsnoop.bpf.c. */

/* --lbr: the snapshot each exit takes, one slot per CPU (resized to the CPU count when LBR is on). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lbr_capture);
} lbr_snaps SEC(".maps");

/* --lbr: the snapshot kept for each session, taken where its deepest chain was (re)started.
 * Apart from the sessions map so that sessions cost nothing extra without --lbr (resized to
 * the sessions map's size when LBR is on). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lbr_capture);
} session_lbrs SEC(".maps");

/* First thing in every exit program (each helper call before it would push our own branches out
 * of the CPU's small LBR stack): snapshot the branches into this CPU's slot. A nested exit program
 * (fentry on a helper we call, itself traced) would overwrite the slot; the deny list keeps our
 * helpers out of traced sets, so that does not happen in practice. */
static __always_inline void snap_lbr(void)
{
	struct lbr_capture *c;
	__u32 cpu;

	if (!use_lbr)
		return;
	cpu = bpf_get_smp_processor_id();
	c = bpf_map_lookup_elem(&lbr_snaps, &cpu);
	if (c)
		c->sz = bpf_get_branch_snapshot(c->entries, sizeof(c->entries), 0);
}

/* The snapshot this exit took becomes the session's: retsnoop's LBR at the deepest failing return. */
static __always_inline void keep_lbr(__u32 key, __u32 func_id, int d, __u64 now)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct lbr_capture *snap = bpf_map_lookup_elem(&lbr_snaps, &cpu), *kept;

	if (!snap || bpf_map_update_elem(&session_lbrs, &key, snap, BPF_ANY))
		return;
	kept = bpf_map_lookup_elem(&session_lbrs, &key);
	if (!kept)
		return;
	kept->ts = now;
	kept->func_id = func_id;
	kept->depth = d;
}

static __always_inline void emit_lbr(struct session *s, __u32 key)
{
	struct lbr_capture *kept = bpf_map_lookup_elem(&session_lbrs, &key);
	struct rec_session_lbr *r;

	if (!kept)
		return;
	r = bpf_ringbuf_reserve(&rb, sizeof(*r), 0);
	if (!r)
		return;	/* the session end that follows still arrives, without branches */
	r->type = REC_SESSION_LBR;
	r->tid = s->tid;
	r->start_ts = s->start_ts;
	bpf_probe_read_kernel(&r->lbr, sizeof(r->lbr), kept);
	bpf_ringbuf_submit(r, rb_wakeup(sizeof(*r)));
}
