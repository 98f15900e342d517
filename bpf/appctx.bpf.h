// SPDX-License-Identifier: GPL-2.0-only
/* The application's side of a reported session: its OpenTelemetry thread context (OTEP 4947: the TLS
 * variable otel_thread_ctx_v1 points to a record with the active trace id and span id) and its user stack.
 * Part of retsnoop.bpf.c. The thread pointer and where glibc's TCB keeps the DTV are per architecture
 * (vmlinux_min.h).
 *
 * Both are taken when the session ends, and only for sessions that are reported. The thread has not run
 * user code since the entry function was entered (it is inside a system call or fault of its own), so its
 * record and its user stack are what they were when the session started; unreported sessions (successes
 * under sampling, filtered ones) cost nothing here. */

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

static __always_inline void ask_about(__u32 tgid)
{
	struct rec_app_probe *r;
	__u8 one = 1;

	/* looked up first: an LRU map's update takes a free node (evicting one when full) even when the key
	 * exists, and sessions keep coming until user space's answer lands */
	if (bpf_map_lookup_elem(&app_asked, &tgid) ||
	    bpf_map_update_elem(&app_asked, &tgid, &one, BPF_NOEXIST))
		return;	/* asked already */
	r = bpf_ringbuf_reserve(&rb, sizeof(*r), 0);
	if (!r) {
		bpf_map_delete_elem(&app_asked, &tgid);	/* ask again at the next session */
		return;
	}
	r->type = REC_APP_PROBE;
	r->tgid = tgid;
	bpf_ringbuf_submit(r, rb_wakeup(sizeof(*r)));
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

/* The record the thread's otel_thread_ctx_v1 points to, into r. */
static __always_inline void read_app_ctx(struct rec_session_app *r, struct app_tls *t)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u64 tp, dtv = 0, blk = 0, ptr = 0, addr;
	long err = 0;
	__u32 n;

	tp = USER_THREAD_POINTER(task);
	if (t->modid) {
		__u64 len = 0;

		err = bpf_probe_read_user(&dtv, sizeof(dtv), (void *)(tp + TCB_DTV_OFFSET));
		if (!err)	/* dtv[-1] holds the number of entries (glibc INSTALL_DTV) */
			err = bpf_probe_read_user(&len, sizeof(len), (void *)(dtv - 16));
		if (!err && t->modid <= len)
			err = bpf_probe_read_user(&blk, sizeof(blk), (void *)(dtv + 16 * (__u64)t->modid));
		if (err)
			goto fault;
		/* beyond the thread's DTV (not resized since the module was loaded), or glibc's TLS_DTV_UNALLOCATED:
		 * this thread never used the module, so it has no record either */
		if (!blk || blk == (__u64)-1) {
			r->status = APP_NO_RECORD;
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
		r->status = APP_NO_RECORD;
		return;
	}
	err = bpf_probe_read_user(&r->ctx, APP_CTX_HEAD, (void *)ptr);
	if (err)
		goto fault;
	if (r->ctx.valid != 1) {
		r->status = APP_INVALID;
		return;
	}
	n = attrs_len(r->ctx.attrs_size);
	if (n) {
		err = bpf_probe_read_user(r->ctx.attrs, n, (void *)(ptr + APP_CTX_HEAD));
		if (err)
			goto fault;
	}
	r->status = APP_OK;
	return;
fault:
	r->status = APP_FAULT;
	r->err = err;
}

/* Sent right before the session's end record: its thread's context (when its process publishes one)
 * and its user stack (when asked for). A process user space has not checked yet is asked about instead
 * (one born before the run, or one whose exec was not seen: app_exec below): its first reported sessions
 * stay unlinked until the answer lands. */
static __always_inline void emit_app_side(void *ctx, struct session *s)
{
	struct app_tls *t = bpf_map_lookup_elem(&app_targets, &s->tgid);
	struct rec_session_ustack *u;
	struct rec_session_app *r;

	if (!t)
		ask_about(s->tgid);	/* user stacks need the process's mappings too: asked for either feature */
	if (read_app && t && !(t->flags & APP_TLS_NONE)) {
		r = bpf_ringbuf_reserve(&rb, sizeof(*r), 0);
		if (r) {	/* else the session end that follows still arrives, without the link */
			r->type = REC_SESSION_APP;
			r->tid = s->tid;
			r->start_ts = s->start_ts;
			r->err = 0;
			__builtin_memset(&r->ctx, 0, APP_CTX_HEAD);
			read_app_ctx(r, t);
			bpf_ringbuf_submit(r, rb_wakeup(sizeof(*r)));
		}
	}
	if (user_stacks) {
		u = bpf_ringbuf_reserve(&rb, sizeof(*u), 0);
		if (u) {
			u->type = REC_SESSION_USTACK;
			u->tid = s->tid;
			u->start_ts = s->start_ts;
			u->pad = 0;
			u->ustack_sz = bpf_get_stack(ctx, u->ustack, sizeof(u->ustack), BPF_F_USER_STACK);
			bpf_ringbuf_submit(u, rb_wakeup(sizeof(*u)));
		}
	}
}

/* A process exec'd: a new image, whatever an earlier image of the same pid published. Its previous answer is
 * withdrawn (it would point into memory the new image lays out differently), and user space is told, so that
 * it looks for the variable while the process starts (ld.so has not run yet: its libraries, the publisher
 * among them, load after this point) and has the answer in app_targets before its first session. Loaded and
 * attached only when the probe set reads thread context (kernel/tracer.py); processes the probe set's
 * filters keep from starting sessions are not reported. A raw tracepoint: on every kernel from 5.10 on, and
 * allowed where tracing programs (tp_btf, fentry) are not. It costs every exec on the host one run (bench/
 * app_exec_cost.py); the other way, asking at every session's start, costs every session a lookup. */
SEC("raw_tp/sched_process_exec")
int app_exec(void *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();	/* after de_thread(): the exec'ing thread leads its group */
	__u32 tgid = pid_tgid >> 32;
	struct rec_app_probe *r;

	/* a process the filters keep out starts no session either: whatever its entries say is never read */
	if (!read_app || !filters_allow(tgid, (__u32)pid_tgid))
		return 0;
	/* looked up first: a lookup takes no lock, and most processes have no entry */
	if (bpf_map_lookup_elem(&app_targets, &tgid))
		bpf_map_delete_elem(&app_targets, &tgid);
	if (bpf_map_lookup_elem(&app_asked, &tgid))
		bpf_map_delete_elem(&app_asked, &tgid);	/* its first session may ask again if no answer came */
	r = bpf_ringbuf_reserve(&rb, sizeof(*r), 0);
	if (!r)
		return 0;	/* its first reported session asks instead */
	r->type = REC_APP_EXEC;
	r->tgid = tgid;
	bpf_ringbuf_submit(r, rb_wakeup(sizeof(*r)));
	return 0;
}

#define PR_SET_VMA 0x53564d41	/* prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, addr, len, name) names a mapping */
#define PR_SET_VMA_ANON_NAME 0
#define OTEL_CTX_NAME_LEN 9	/* "OTEL_CTX" and its NUL */

/* A process created its OTEP 4719 process context (a memfd named OTEL_CTX, or a mapping it names so): its
 * publisher's library is loaded, and it may start a request within the next few milliseconds (a Python
 * service sets up its SDK right after). User space checks it at once instead of at its next timed check
 * (appctx/watch.py), and wakes up for it: it is rare and its answer is due before that first request.
 * The name is read from the syscall's arguments at its entry (syscall tracepoints: args at offset 16). */
static __always_inline int report_publish(void *name_ptr)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32;
	struct rec_app_probe *r;
	char name[OTEL_CTX_NAME_LEN + 1] = {};	/* one more: a longer name is cut there, and not taken */

	if (!read_app || !filters_allow(tgid, (__u32)pid_tgid))
		return 0;
	if (bpf_probe_read_user_str(name, sizeof(name), name_ptr) != OTEL_CTX_NAME_LEN)
		return 0;
#pragma unroll
	for (int i = 0; i < OTEL_CTX_NAME_LEN; i++)	/* unrolled: no memcmp in BPF */
		if (name[i] != "OTEL_CTX"[i])
			return 0;
	r = bpf_ringbuf_reserve(&rb, sizeof(*r), 0);
	if (!r)
		return 0;	/* its timed checks still find it */
	r->type = REC_APP_PUBLISH;
	r->tgid = tgid;
	bpf_ringbuf_submit(r, RB_FORCE_WAKEUP);
	return 0;
}

struct syscall_enter_args {
	__u64 common;	/* struct trace_entry */
	__s64 nr;
	__u64 args[6];
};

SEC("?tracepoint/syscalls/sys_enter_memfd_create")
int app_publish(struct syscall_enter_args *ctx)
{
	return report_publish((void *)ctx->args[0]);	/* memfd_create(name, flags) */
}

SEC("?tracepoint/syscalls/sys_enter_prctl")
int app_publish_vma(struct syscall_enter_args *ctx)
{
	if (ctx->args[0] != PR_SET_VMA || ctx->args[1] != PR_SET_VMA_ANON_NAME)
		return 0;
	return report_publish((void *)ctx->args[4]);
}

/* The same two hooks as one program on the syscalls' entry functions (__x64_sys_memfd_create, ...), by one
 * kprobe.multi link where the kernel has kprobe.multi (kernel/app_hooks.py), its cookie saying which syscall. A
 * syscall tracepoint turns on the tracepoint path of every syscall of every task while it is attached, and
 * detaching one waits for RCU grace periods under the kernel's event mutex (0.1 s each in the emulated VM, most of
 * a stop); a kprobe costs only these two functions' calls. One link, not one per syscall: before fprobe ran on
 * fgraph (6.14), each kprobe.multi link's detach waited for grace periods of its own under ftrace's lock (80-140 ms
 * each on 6.12 in the emulated VM). The entry function's one argument is the user's registers
 * (ARCH_HAS_SYSCALL_WRAPPER). */
#define APP_PUB_MEMFD_CREATE 0	/* the cookies (kernel/app_hooks.py PUBLISH_SYSCALLS, in that order) */
#define APP_PUB_PRCTL 1

static __always_inline int publish_call(struct pt_regs *ctx, __u64 which)
{
	struct pt_regs *regs = (struct pt_regs *)PT_REGS_PARM1(ctx);

	if (which == APP_PUB_MEMFD_CREATE)
		return report_publish((void *)PT_REGS_PARM1_CORE_SYSCALL(regs));	/* memfd_create(name, flags) */
	if (PT_REGS_PARM1_CORE_SYSCALL(regs) != PR_SET_VMA || PT_REGS_PARM2_CORE_SYSCALL(regs) != PR_SET_VMA_ANON_NAME)
		return 0;
	return report_publish((void *)PT_REGS_PARM5_CORE_SYSCALL(regs));
}

SEC("?kprobe.multi")
int app_pub_kp(struct pt_regs *ctx)
{
	return publish_call(ctx, bpf_get_attach_cookie(ctx));
}

/* Folded into the attach mode's link of entry functions instead (kprobe.session, kprobe.multi: one link fewer to
 * detach, each kprobe.multi link's detach waiting for grace periods of its own before 6.14): the two entry functions
 * are in map ip_ids under these ids, above every traced function's, and handle_entry() hands their calls here. */
#define APP_PUB_ID 0xffffff00u
