// SPDX-License-Identifier: GPL-2.0-only
/* The syscall preset's session boundaries (kernel/syscall_hooks.py): raw tracepoints at every syscall's entry and
 * exit, instead of a kprobe.session on each of ~450 __x64_sys_* functions. Part of retsnoop.bpf.c.
 *
 * Why: with a kprobe.session per entry function, each syscall paid the function-entry hook's register save, a return
 * hijack, two program runs that each looked the function up by address, and that was most of what tracing a cheap
 * syscall cost (bench/syscall_preset_cost_analysis.md). A raw tracepoint saves nothing and hijacks nothing, and the
 * syscall number finds the entry function's id in an array. The session's level 0 is still that function.
 *
 * Syscalls do not nest: a session of these hooks still open when the thread enters its next syscall is one whose exit
 * never came (counted incomplete, and restarted); inside a session of another entry function (a user function's)
 * the syscall is one more level of it, as with the kprobes. exit and exit_group never reach the exit tracepoint; their
 * sessions end with the thread. */

#define ID_OF_SYSCALL (-3)	/* handle_exit(): the level of the syscall the exit tracepoint ends (syscall_exit_id) */
#define MAX_SYSCALL_NR 1024	/* above every native number (x86-64 and arm64 reach ~470); x32's carry bit 30 */

/* syscall number -> the entry function's id + 1 (0: not traced); filled by user space */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SYSCALL_NR);
	__type(key, __u32);
	__type(value, __u32);
} nr_ids SEC(".maps");

/* 32-bit compat syscalls reach the same tracepoints with their own numbering */
static __always_inline bool native_syscall(struct pt_regs *regs)
{
#if defined(__TARGET_ARCH_x86)
	return (BPF_CORE_READ(regs, cs) & 0xff) != 0x23;	/* __USER32_CS (and Xen PV's FLAT_RING3_CS32) */
#elif defined(__TARGET_ARCH_arm64)
	return !(BPF_CORE_READ(regs, user_regs.pstate) & 0x10);	/* PSR_MODE32_BIT */
#else
	return true;
#endif
}

/* The syscall's level: a new session, or (inside a session of another entry function, a user function's) a level of
 * that session, popped by the exit tracepoint as sys_depth says. */
static __always_inline void syscall_enter(__u32 func_id)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)pid_tgid, key = session_key(tid);
	struct session *s = bpf_map_lookup_elem(&sessions, &key);
	struct capture_stats *cs;
	struct func_info *fi;
	__u64 now;
	int d;

	if (!ready)
		return;
	if (s && s->active && s->sys_depth) {
		/* still in the last syscall: its exit never came */
		cs = cstats();
		if (cs)
			cs->incomplete_sessions++;
		drop_session(s, key);
	}
	if (!s || !s->active) {
		fi = bpf_map_lookup_elem(&func_infos, &func_id);
		if (!fi || !(fi->flags & FUNC_IS_ENTRY))
			return;
		now = bpf_ktime_get_boot_ns();
		s = start_session(s, key, tid, pid_tgid >> 32, now);
		if (!s)
			return;
	} else {
		now = bpf_ktime_get_boot_ns();
	}
	d = s->depth;
	s->depth = d + 1;
	s->sys_depth = d + 1;
	if (d < 0 || d >= max_depth || d >= MAX_FSTACK_DEPTH)
		return;
	s->func_ids[lvl(d)] = func_id;
	s->func_ts[lvl(d)] = now;
	if (emit_calls && !s->defunct)	/* no arguments (-A): this context holds the tracepoint's, not the function's */
		emit_trace(s, key, REC_FUNC_ENTRY, tid, now, d, func_id, 0, 0);
}

/* handle_exit()'s function id at the exit tracepoint: the syscall's level, or -1 when the thread is in no syscall
 * the tracepoints hooked; a session whose deeper levels did not all return is dropped. */
static __always_inline __s64 syscall_exit_id(struct session *s, __u32 key)
{
	struct capture_stats *cs;

	if (!s->sys_depth)
		return -1;
	if (s->depth != s->sys_depth) {
		/* a deeper level's exit never came (its probe attached while it ran): unusable */
		cs = cstats();
		if (cs)
			cs->incomplete_sessions++;
		drop_session(s, key);
		return -1;
	}
	s->sys_depth = 0;
	return s->func_ids[lvl(s->depth > max_depth ? 0 : s->depth - 1)];
}

static __always_inline void handle_exit(void *ctx, __s64 id, __s64 res, bool outer);

SEC("?raw_tp/sys_enter")
int BPF_PROG(sys_enter_session, struct pt_regs *regs, long nr)
{
	__u32 key = nr, *id;

	if (nr < 0 || nr >= MAX_SYSCALL_NR)
		return 0;
	id = bpf_map_lookup_elem(&nr_ids, &key);
	if (!id || !*id || !native_syscall(regs))
		return 0;
	syscall_enter(*id - 1);
	return 0;
}

/* the exit's number is not the entry's for rt_sigreturn (-1): the session's level 0 says which syscall it was */
SEC("?raw_tp/sys_exit")
int BPF_PROG(sys_exit_session, struct pt_regs *regs, long ret)
{
	handle_exit(ctx, ID_OF_SYSCALL, ret, true);
	return 0;
}
