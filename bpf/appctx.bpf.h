// SPDX-License-Identifier: GPL-2.0
/* The application's side of a session, taken when the session starts (the entry function is entered by
 * the application's own thread): its OpenTelemetry thread context (OTEP 4947: the TLS variable
 * otel_thread_ctx_v1 points to a record with the active trace id and span id) and its user stack.
 * Part of retsnoop.bpf.c. x86-64: the thread pointer is task->thread.fsbase. */

#define BPF_F_USER_STACK (1ULL << 8)

/* Where each process keeps otel_thread_ctx_v1 (user space fills it; resized when the feature is on). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct app_tls);
} app_targets SEC(".maps");

/* Processes user space was already asked about, so that a busy new process sends one probe, not one
 * per session, until its entry lands in app_targets. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u8);
} app_asked SEC(".maps");

struct session_app {
	__s32 status;
	__s32 err;
	struct app_ctx ctx;
};

/* The context each open session read at its start (one entry unless the feature is on). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct session_app);
} session_apps SEC(".maps");

struct session_ustack {
	__s32 sz;
	__u32 pad;
	__u64 ips[MAX_USTACK_DEPTH];
};

/* The user stack each open session took at its start (one entry unless user stacks are on). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct session_ustack);
} session_ustacks SEC(".maps");

static const struct session_app empty_app = {};
static const struct session_ustack empty_ustack = {};

static __always_inline void ask_about(__u32 tgid)
{
	struct rec_app_probe *r;
	__u8 one = 1;

	if (bpf_map_update_elem(&app_asked, &tgid, &one, BPF_NOEXIST))
		return;	/* asked already */
	r = bpf_ringbuf_reserve(&rb, sizeof(*r), 0);
	if (!r) {
		bpf_map_delete_elem(&app_asked, &tgid);	/* ask again at the next session */
		return;
	}
	r->type = REC_APP_PROBE;
	r->tgid = tgid;
	bpf_ringbuf_submit(r, 0);
}

static __always_inline __u32 attrs_len(__u16 size)
{
	__u32 n = size;

	if (n > MAX_APP_ATTRS)
		n = MAX_APP_ATTRS;
	/* the verifier must see the bounded value in the register the helper gets, not a recomputed copy */
	asm volatile("" : "+r"(n));
	return n;
}

/* The record the thread's otel_thread_ctx_v1 points to, into session_apps[key]. Nothing is recorded for
 * a process user space has not checked yet: its first sessions stay unlinked until the check lands. */
static __always_inline void read_app_ctx(__u32 key, __u32 tgid, struct task_struct *task)
{
	struct app_tls *t = bpf_map_lookup_elem(&app_targets, &tgid);
	__u64 tp, dtv = 0, blk = 0, ptr = 0, addr;
	struct session_app *a;
	long err = 0;
	__u32 n;

	if (!t) {
		ask_about(tgid);	/* user stacks need the process's mappings too: asked for either feature */
		return;
	}
	if (!read_app || (t->flags & APP_TLS_NONE))
		return;
	if (bpf_map_update_elem(&session_apps, &key, &empty_app, BPF_ANY))
		return;
	a = bpf_map_lookup_elem(&session_apps, &key);
	if (!a)
		return;
	tp = BPF_CORE_READ(task, thread.fsbase);
	if (t->modid) {
		__u64 len = 0;

		err = bpf_probe_read_user(&dtv, sizeof(dtv), (void *)(tp + 8));
		if (!err)	/* dtv[-1] holds the number of entries (glibc INSTALL_DTV) */
			err = bpf_probe_read_user(&len, sizeof(len), (void *)(dtv - 16));
		if (!err && t->modid <= len)
			err = bpf_probe_read_user(&blk, sizeof(blk), (void *)(dtv + 16 * (__u64)t->modid));
		if (err)
			goto fault;
		/* beyond the thread's DTV (not resized since the module was loaded), or glibc's TLS_DTV_UNALLOCATED:
		 * this thread never used the module, so it has no record either */
		if (!blk || blk == (__u64)-1) {
			a->status = APP_NO_RECORD;
			return;
		}
		addr = blk + t->offset;
	} else {
		addr = tp + t->tp_offset;
	}
	err = bpf_probe_read_user(&ptr, sizeof(ptr), (void *)addr);
	if (err)
		goto fault;
	if (!ptr) {
		a->status = APP_NO_RECORD;
		return;
	}
	err = bpf_probe_read_user(&a->ctx, APP_CTX_HEAD, (void *)ptr);
	if (err)
		goto fault;
	if (a->ctx.valid != 1) {
		a->status = APP_INVALID;
		return;
	}
	n = attrs_len(a->ctx.attrs_size);
	if (n) {
		err = bpf_probe_read_user(a->ctx.attrs, n, (void *)(ptr + APP_CTX_HEAD));
		if (err)
			goto fault;
	}
	a->status = APP_OK;
	return;
fault:
	a->status = APP_FAULT;
	a->err = err;
}

/* The user stack of the thread entering the entry function, into session_ustacks[key]. */
static __always_inline void take_ustack(void *ctx, __u32 key)
{
	struct session_ustack *u;

	if (bpf_map_update_elem(&session_ustacks, &key, &empty_ustack, BPF_ANY))
		return;
	u = bpf_map_lookup_elem(&session_ustacks, &key);
	if (u)
		u->sz = bpf_get_stack(ctx, u->ips, sizeof(u->ips), BPF_F_USER_STACK);
}

static __always_inline void emit_app(struct session *s, __u32 key)
{
	struct session_app *a = bpf_map_lookup_elem(&session_apps, &key);
	struct rec_session_app *r;

	if (!a)
		return;
	r = bpf_ringbuf_reserve(&rb, sizeof(*r), 0);
	if (!r)
		return;	/* the session end that follows still arrives, without the link */
	r->type = REC_SESSION_APP;
	r->tid = s->tid;
	r->start_ts = s->start_ts;
	r->status = a->status;
	r->err = a->err;
	bpf_probe_read_kernel(&r->ctx, sizeof(r->ctx), &a->ctx);
	bpf_ringbuf_submit(r, 0);
}

static __always_inline void emit_ustack(struct session *s, __u32 key)
{
	struct session_ustack *u = bpf_map_lookup_elem(&session_ustacks, &key);
	struct rec_session_ustack *r;

	if (!u)
		return;
	r = bpf_ringbuf_reserve(&rb, sizeof(*r), 0);
	if (!r)
		return;
	r->type = REC_SESSION_USTACK;
	r->tid = s->tid;
	r->start_ts = s->start_ts;
	r->ustack_sz = u->sz;
	bpf_probe_read_kernel(r->ustack, sizeof(r->ustack), u->ips);
	bpf_ringbuf_submit(r, 0);
}

static __always_inline void forget_app(__u32 key)
{
	if (read_app)
		bpf_map_delete_elem(&session_apps, &key);
	if (user_stacks)
		bpf_map_delete_elem(&session_ustacks, &key);
}
