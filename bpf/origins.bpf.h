// SPDX-License-Identifier: GPL-2.0-only
/* Error origins from the returns alone (--origins-only, kernel/modes/origin_exits.py): no session, no entry program,
 * nothing recorded on a success path. Part of retsnoop.bpf.c.
 *
 * Every traced function's return runs an origin_exit_* program (kretprobe.multi; fexit.multi's origin_fexit_* on
 * 7.2+ x86-64; the cookie is the function's id)
 * and every syscall's exit origin_sys_exit (entry functions without a syscall number: origin_entry_exit at their
 * return). A failing return is an error chain's link: the first one of the
 * thread's current chain is its origin (the deepest function: it returned first). The stack pointer at a return is
 * its caller's, so a return whose stack pointer is above the chain top's comes from an ancestor of every link so far
 * (the chain goes on, or, if it succeeds while it could fail, the error was handled and the chain ends); one at the
 * same height is a sibling (a failure there starts a new chain, as in retsnoop's sessions); one below is a call made
 * after the chain's top returned (a failure starts a new chain, a success changes nothing). The entry function's
 * return ends the chain: if it failed, its (entry, origin, errno) is counted in origin_stats, as a failing session's.
 *
 * The entry functions are the syscall preset's (runtime/settings.py refuses others): syscalls do not nest, so each
 * entry return ends one syscall's chain. Only returns on the thread's own stack count: a function returning in an
 * interrupt runs on another stack, whose addresses say nothing about the thread's calls. What sessions have and this
 * has not: latencies, the calls, and the call depth, which the stack pointer stands in for: where untraced functions
 * sit between traced ones, a traced function in another branch can return above the chain's top and be taken for
 * its ancestor (tests/unit/test_origin_exits_rule.py). */

struct pending {
	__u64 top_sp;		/* the stack pointer at the return of the chain's highest link so far */
	__u32 origin_id;
	__u32 err;		/* errno_of() the origin returned */
	__u8 active;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct pending);
} pending SEC(".maps");

#ifndef THREAD_SIZE
#define THREAD_SIZE (16384 << 1)	/* the largest a task's stack is (x86-64 with KASAN, arm64 with VMAP): an upper
					 * bound is enough to tell the thread's stack from an interrupt's */
#endif

static __always_inline bool on_task_stack(__u64 sp)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u64 base = (__u64)BPF_CORE_READ(task, stack);

	return sp > base && sp <= base + THREAD_SIZE;
}

/* One program per return kind (user space links each function by its kind): the kind is a constant here, so a
 * success costs the thread's lookup alone, and the function's id (a binary search of the link's cookies) is read
 * only when something fails. */
static __always_inline int origin_return(void *ctx, __u32 kind, __s64 res, __u64 sp)
{
	__u32 flags = kind << FUNC_RET_KIND_SHIFT, tid = (__u32)bpf_get_current_pid_tgid();
	struct pending *p = bpf_map_lookup_elem(&pending, &tid), fresh = {};

	if (!is_failure(res, flags)) {
		if (!p || !p->active || sp <= p->top_sp || !on_task_stack(sp))
			return 0;
		if (can_fail(flags))
			p->active = 0;	/* an ancestor of the chain could have failed and did not: the error was handled */
		else
			p->top_sp = sp;	/* one that cannot fail (void, bool): the error passes up through it */
		return 0;
	}
	if (!on_task_stack(sp))
		return 0;
	if (!p) {
		bpf_map_update_elem(&pending, &tid, &fresh, BPF_NOEXIST);
		p = bpf_map_lookup_elem(&pending, &tid);
		if (!p) {
			struct capture_stats *cs = cstats();

			if (cs)
				cs->dropped_sessions++;	/* no room for the thread's chain */
			return 0;
		}
	}
	if (!p->active || sp <= p->top_sp) {	/* a new chain: this function is its origin */
		p->origin_id = bpf_get_attach_cookie(ctx);
		p->err = errno_of(res, flags);
		p->active = 1;
	}
	p->top_sp = sp;
	return 0;
}

/* fexit.multi (Linux 7.2+, a tracing_multi link; kernel/modes/origin_fexits.py): the same rule from the trampoline,
 * at 0.6-0.7x of a kretprobe.multi return's cost on the preset (bench/RESULTS.md), with the stack pointer a kretprobe
 * reads (FEXIT_RET_SLOT), so the two kinds of link order one chain alike. x86-64 only: elsewhere the programs exist
 * (user space sets every program's autoload) but never load, since the feature probe refuses the mode there. */
static __always_inline int origin_fexit(__u64 *ctx, __u32 kind)
{
#if defined(__TARGET_ARCH_x86)
	__u64 ret = 0;

	bpf_get_func_ret(ctx, &ret);
	return origin_return(ctx, kind, (__s64)ret, FEXIT_RET_SLOT(ctx));
#else
	return 0;
#endif
}

/* Each return kind's pair of programs, kretprobe.multi's and fexit.multi's (user space links each function by its
 * kind, and by fexit.multi where the kernel has it), the kind a constant in both. */
#define ORIGIN_RETURNS(suffix, kind)							\
SEC("?kprobe.multi")									\
int origin_exit_##suffix(struct pt_regs *ctx)						\
{											\
	return origin_return(ctx, kind, PT_REGS_RC(ctx), PT_REGS_SP(ctx));		\
}											\
											\
SEC("?fexit.multi")									\
int origin_fexit_##suffix(__u64 *ctx)							\
{											\
	return origin_fexit(ctx, kind);							\
}

ORIGIN_RETURNS(int, RK_INT32)		/* int and what BTF does not say: the low 32 bits */
ORIGIN_RETURNS(long, RK_SIGNED)
ORIGIN_RETURNS(ptr, RK_POINTER)
ORIGIN_RETURNS(never, RK_VOID)		/* void, bool, unsigned: never fails, passes an error up */

/* An entry function's return: a failure counts (entry, origin, errno), the thread's chain its origin when the chain is
 * this call's (its top below `sp`; `sp` 0: at sys_exit, where every chain is the syscall's); either way the chain
 * ends, so the next call starts afresh (its stack may sit higher: the kernel randomizes it per syscall). */
static __always_inline int entry_return(__u32 id, __s64 res, __u64 sp)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)pid_tgid;
	struct pending *p = bpf_map_lookup_elem(&pending, &tid);
	struct func_info *fi = bpf_map_lookup_elem(&func_infos, &id);
	struct origin_key k = { .entry_id = id, .origin_id = id };
	struct capture_stats *cs;

	if (!fi)
		return 0;
	if (!is_failure(res, fi->flags)) {
		if (p && p->active)
			p->active = 0;	/* the call succeeded: whatever failed inside it was handled */
		return 0;
	}
	if (p && p->active) {
		if (!sp || sp > p->top_sp) {	/* its chain */
			k.origin_id = p->origin_id;
			k.err = p->err;
		}
		p->active = 0;
	}
	if (k.origin_id == id)	/* nothing failed below it: it is its own origin */
		k.err = errno_of(res, fi->flags);
	if (!ready || !filters_allow(pid_tgid >> 32, tid))
		return 0;
	cs = cstats();
	if (cs)
		cs->sessions_started++;	/* a failing call of an entry function: a failing session's count */
	count_origin_key(&k);
	return 0;
}

SEC("?kprobe.multi")
int origin_entry_exit(struct pt_regs *ctx)	/* an entry function without a syscall number */
{
	return entry_return(bpf_get_attach_cookie(ctx), PT_REGS_RC(ctx), PT_REGS_SP(ctx));
}

/* The syscall preset's entry functions end at the sys_exit raw tracepoint (kernel/syscall_hooks.py), their ids found
 * by syscall number (nr_ids, bpf/syscalls.bpf.h): no return hook on ~450 functions, the most a cheap syscall paid for
 * here (bench/RESULTS.md). A syscall not hooked, or a 32-bit one, only ends the thread's chain. */
SEC("?raw_tp/sys_exit")
int BPF_PROG(origin_sys_exit, struct pt_regs *regs, long ret)
{
	long nr = SYSCALL_NR(regs);
	__u32 key = nr, tid, *id = nr >= 0 && nr < MAX_SYSCALL_NR ? bpf_map_lookup_elem(&nr_ids, &key) : NULL;
	struct pending *p;

	if (id && *id && native_syscall(regs))
		return entry_return(*id - 1, ret, 0);
	tid = (__u32)bpf_get_current_pid_tgid();
	p = bpf_map_lookup_elem(&pending, &tid);
	if (p && p->active)
		p->active = 0;
	return 0;
}
