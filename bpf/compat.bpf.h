// SPDX-License-Identifier: GPL-2.0-only
/* What differs between kernels, from 5.10 to 7.x: helpers a kernel lacks and kfuncs whose prototype changed.
 * Part of retsnoop.bpf.c. Each choice is made by CO-RE against the running kernel's BTF when libbpf loads the
 * object: the branch not taken is a constant-false one the verifier never walks, so its helper or kfunc may be
 * unknown to that kernel and one object loads everywhere. */

/* kprobe programs before Linux 5.15 (no bpf_get_func_ip()): the probe's address is the function's, and the
 * kernel reports it one breakpoint instruction further on x86 (also for kprobes on ftrace, which mimic one) */
static __always_inline __u64 kprobe_func_ip(struct pt_regs *regs)
{
#if defined(__TARGET_ARCH_x86)
	return PT_REGS_IP_CORE(regs) - 1;
#else
	return PT_REGS_IP_CORE(regs);
#endif
}

/* the traced function's address in kprobe, kprobe.multi and kprobe.session programs */
static __always_inline __u64 func_ip(void *ctx)
{
	if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_get_func_ip))
		return bpf_get_func_ip(ctx);
	return kprobe_func_ip(ctx);
}

/* the cookie user space attached a kprobe with, where the kernel has cookies (5.15+: kernel/tracer.py attaches
 * without one otherwise, and the caller's `without_cookies` way applies) */
static __always_inline __s64 kprobe_id(void *ctx, __s64 without_cookies)
{
	if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_get_attach_cookie))
		return (__u32)bpf_get_attach_cookie(ctx);
	return without_cookies;
}

/* The running task as a BTF pointer (5.11+): its fields are plain loads the kernel guards against faults (a NULL
 * mm reads as 0), not a probe-read helper call per pointer; before that, probe reads (BPF_CORE_READ). */
static __always_inline bool have_task_btf(void)
{
	return bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_get_current_task_btf);
}

/* where the process's name is: the caller copies it with a probe read */
static __always_inline const char *group_leader_comm(void)
{
	struct task_struct *task;

	if (have_task_btf()) {
		task = bpf_get_current_task_btf();
		return task->group_leader->comm;
	}
	task = BPF_CORE_READ((struct task_struct *)bpf_get_current_task(), group_leader);
	return task->comm;	/* an address, relocated: nothing is read here */
}

/* The thread's and its process's names, read into a record as it is sent: most sessions are never reported. Read
 * then, not at the session's start, they are the names after an execve or a PR_SET_NAME inside the session. */
static __always_inline void read_names(char *comm, char *proc_comm, __u32 tid, __u32 tgid)
{
	bpf_get_current_comm(comm, TASK_COMM_LEN);
	if (tid == tgid)	/* the process's main thread: its name is the process's */
		__builtin_memcpy(proc_comm, comm, TASK_COMM_LEN);
	else
		bpf_probe_read_kernel_str(proc_comm, TASK_COMM_LEN, group_leader_comm());
}

static __always_inline const unsigned char *exe_name(void)
{
	struct task_struct *task;

	if (have_task_btf()) {
		task = bpf_get_current_task_btf();
		return task->mm->exe_file->f_path.dentry->d_name.name;
	}
	task = (struct task_struct *)bpf_get_current_task();
	return BPF_CORE_READ(task, mm, exe_file, f_path.dentry, d_name.name);
}

/* Linux 6.10+: whether a kprobe.session program runs at the exit of the call (false: at its entry). Linux 7.0
 * gave the kfunc the program's context (fsession programs share it), and libbpf refuses a declaration that does
 * not match the kernel's: both are declared weak, the one the kernel has binds (libbpf strips the ___ctx
 * flavour), the other stays unresolved and its call is in the branch the verifier never walks. */
extern bool bpf_session_is_return(void) __ksym __weak;
extern bool bpf_session_is_return___ctx(void *ctx) __ksym __weak;

static __always_inline bool session_is_return(void *ctx)
{
	if (bpf_ksym_exists(bpf_session_is_return___ctx))
		return bpf_session_is_return___ctx(ctx);
	return bpf_session_is_return();
}

/* Linux 6.10+: the call's own 8 bytes, kept from its entry to its exit (kprobe.session); 7.0 gave it the context
 * too, as bpf_session_is_return(). */
extern __u64 *bpf_session_cookie(void) __ksym __weak;
extern __u64 *bpf_session_cookie___ctx(void *ctx) __ksym __weak;

static __always_inline __u64 *session_cookie(void *ctx)
{
	if (bpf_ksym_exists(bpf_session_cookie___ctx))
		return bpf_session_cookie___ctx(ctx);
	return bpf_session_cookie();
}
