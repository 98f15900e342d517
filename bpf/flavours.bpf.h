// SPDX-License-Identifier: GPL-2.0-only
/* The programs the kernel runs, one thin wrapper per attach flavour around handle_entry() and
 * handle_exit(). Part of retsnoop.bpf.c (included last). kernel/capture_config.py has the pair of one
 * flavour loaded, kernel/tracer.py attaches it.
 *
 * How each finds the traced function's id: fentry, fsession and kprobe read their BPF cookie (a field of the
 * run context). kprobe.multi and kprobe.session look the function's address up in ip_ids instead
 * (ID_BY_IP), and only once the thread is known to be in a session: their cookie is found by a binary
 * search over the link's sorted addresses on every run (bench/probe_cost.py). Kernels before 5.15 have no
 * cookies: there a kprobe finds its id by address too, and a kretprobe takes the session's innermost call.
 * (compat.bpf.h: what differs between kernels). */

/* fentry: a pair per traced function, cloned from these templates (kernel/clones.py). Entry functions get
 * fentry_entry/fexit_exit; the others fentry_inner/fexit_inner, which cannot start or end a session and
 * leave that code out: it is most of what the kernel verifies for every clone. */
static __always_inline void fentry_run(void *ctx, bool outer)
{
	if (!enter_guard())
		return;
	handle_entry(ctx, (__u32)bpf_get_attach_cookie(ctx), true, outer);
	exit_guard();
}

static __always_inline void fexit_run(void *ctx, bool outer)
{
	__u64 ret = 0;

	snap_lbr();
	if (!enter_guard())
		return;
	bpf_get_func_ret(ctx, &ret);
	handle_exit(ctx, (__u32)bpf_get_attach_cookie(ctx), (__s64)ret, outer);
	exit_guard();
}

SEC("fentry/bpf_fentry_test1")
int BPF_PROG(fentry_entry)
{
	fentry_run(ctx, true);
	return 0;
}

SEC("fexit/bpf_fentry_test1")
int BPF_PROG(fexit_exit)
{
	fexit_run(ctx, true);
	return 0;
}

SEC("?fentry/bpf_fentry_test1")
int BPF_PROG(fentry_inner)
{
	fentry_run(ctx, false);
	return 0;
}

SEC("?fexit/bpf_fentry_test1")
int BPF_PROG(fexit_inner)
{
	fexit_run(ctx, false);
	return 0;
}

SEC("kprobe")
int kprobe_entry(struct pt_regs *ctx)
{
	handle_entry(ctx, kprobe_id(ctx, ID_BY_IP), false, true);
	return 0;
}

SEC("kretprobe")
int kretprobe_exit(struct pt_regs *ctx)
{
	snap_lbr();
	handle_exit(ctx, kprobe_id(ctx, ID_OF_TOP), (__s64)PT_REGS_RC(ctx), true);
	return 0;
}

/* kprobe.multi: entry functions (may start a session) and the others (kmulti_inner) in two links, or every function
 * in kmulti_entry's (one_link) */
SEC("kprobe.multi")
int kmulti_entry(struct pt_regs *ctx)
{
	handle_entry(ctx, ID_BY_IP, false, OUTER_LINKED);
	return 0;
}

SEC("?kprobe.multi")
int kmulti_inner(struct pt_regs *ctx)
{
	handle_entry(ctx, ID_BY_IP, false, false);
	return 0;
}

SEC("kretprobe.multi")
int kmulti_exit(struct pt_regs *ctx)
{
	snap_lbr();
	handle_exit(ctx, ID_BY_IP, (__s64)PT_REGS_RC(ctx), true);	/* most exits find no session: no id needed */
	return 0;
}

/* kprobe.session (Linux 6.10+): one program at entry and exit; a non-zero return at entry tells the
 * kernel not to run it at that call's exit, which skips the exits of every call outside a session.
 * Two links, as for kprobe.multi: entry functions (ksession) and the others (ksession_inner), or one (one_link).
 * In section kprobe.multi, not loaded unless asked ("?"): libbpf 1.1 knows no kprobe.session section,
 * so user space sets the expected attach type before load and attaches with its own BPF_LINK_CREATE. */
static __always_inline int session_run(struct pt_regs *ctx, int outer)
{
	__u64 kept;
	__s64 id;

	if (session_is_return(ctx)) {
		snap_lbr();
		kept = *session_cookie(ctx);	/* the id its entry kept: no address lookup at the exit */
		handle_exit(ctx, kept ? (__s64)kept - 1 : ID_BY_IP, (__s64)PT_REGS_RC(ctx), outer);
		return 0;
	}
	id = handle_entry(ctx, ID_BY_IP, false, outer);
	if (id < 0)
		return 1;
	*session_cookie(ctx) = id + 1;
	return 0;
}

SEC("?kprobe.multi")
int ksession(struct pt_regs *ctx)
{
	return session_run(ctx, OUTER_LINKED);
}

SEC("?kprobe.multi")
int ksession_inner(struct pt_regs *ctx)
{
	return session_run(ctx, false);
}

/* fsession (Linux 7.0+): fentry's pair in one program, run at the function's entry and again at its exit
 * (BPF_TRACE_FSESSION). Unlike kprobe.session its entry cannot skip the exit: the verifier allows these programs
 * no return value but 0 (kernel/bpf/verifier.c). Cloned per function from these templates, as fentry's pair is:
 * entry functions get fsession_entry, the others fsession_inner. */
static __always_inline void fsession_run(void *ctx, bool outer)
{
	if (session_is_return(ctx))
		fexit_run(ctx, outer);
	else
		fentry_run(ctx, outer);
}

SEC("?fsession/bpf_fentry_test1")
int BPF_PROG(fsession_entry)
{
	fsession_run(ctx, true);
	return 0;
}

SEC("?fsession/bpf_fentry_test1")
int BPF_PROG(fsession_inner)
{
	fsession_run(ctx, false);
	return 0;
}

/* fsession.multi (Linux 7.2+, BPF_TRACE_FSESSION_MULTI): the same program loaded once without a target function
 * and linked to the whole set by one tracing_multi link, each function's id its cookie in that link. Arguments
 * and the return value only through helpers (it is verified against no function's prototype), which is how ours
 * read them anyway. A section libbpf 1.7 does not know: kernel/capture_config.py sets its type and attach type. */
SEC("?fsession.multi")
int BPF_PROG(fsession_multi)
{
	fsession_run(ctx, true);
	return 0;
}

/* User-space functions (u:BINARY:GLOB): one session logic across the boundary, so an application function and the
 * kernel calls under it nest in one session. Single uprobes run kprobe_entry/kretprobe_exit (their cookie is the
 * id). uprobe.multi (Linux 6.6+) and uprobe.session (6.13+) read their cookie from the probed uprobe, in O(1),
 * unlike kprobe.multi's. Every user function may start a session (outer): its entry is checked in func_infos. */
SEC("?uprobe.multi")
int umulti_entry(struct pt_regs *ctx)
{
	handle_entry(ctx, (__u32)bpf_get_attach_cookie(ctx), false, true);
	return 0;
}

SEC("?uretprobe.multi")
int umulti_exit(struct pt_regs *ctx)
{
	handle_exit(ctx, (__u32)bpf_get_attach_cookie(ctx), (__s64)PT_REGS_RC(ctx), true);
	return 0;
}

/* uprobe.session: as kprobe.session, a non-zero return at entry skips the call's return probe, so calls outside a
 * session cost no uretprobe (a return-address hijack and a second trap). */
SEC("?uprobe.session")
int usession(struct pt_regs *ctx)
{
	__u32 id = (__u32)bpf_get_attach_cookie(ctx);

	if (session_is_return(ctx)) {
		handle_exit(ctx, id, (__s64)PT_REGS_RC(ctx), true);
		return 0;
	}
	return handle_entry(ctx, id, false, true) >= 0 ? 0 : 1;
}
