/* The few kernel types the BPF side touches, CO-RE relocated (preserve_access_index), so the build
 * does not depend on the build machine's kernel headers or BTF. */
#ifndef __VMLINUX_MIN_H
#define __VMLINUX_MIN_H

#define __VMLINUX_H__	/* tells bpf_tracing.h to use the kernel's pt_regs field names */

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed char __s8;
typedef short __s16;
typedef int __s32;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef _Bool bool;
#define true 1
#define false 0

enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_HASH = 5,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_RINGBUF = 27,
};

/* helpers a kernel may lack: bpf_core_enum_value_exists() asks the running kernel's BTF (CO-RE) */
enum bpf_func_id {
	BPF_FUNC_get_current_task_btf = 158,	/* Linux 5.11 */
	BPF_FUNC_get_func_ip = 173,		/* Linux 5.15 */
	BPF_FUNC_get_attach_cookie = 174,	/* Linux 5.15 */
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
};

/* The registers of a kprobe's context and the user thread pointer, per architecture (bpf_tracing.h's
 * PT_REGS_* macros read these names; the build passes -D__TARGET_ARCH_x86 or -D__TARGET_ARCH_arm64). */
#if defined(__TARGET_ARCH_x86)
struct pt_regs {
	unsigned long r15, r14, r13, r12, bp, bx, r11, r10, r9, r8, ax, cx, dx, si, di, orig_ax, ip, cs, flags,
		sp, ss;
} __attribute__((preserve_access_index));

#define SYSCALL_NR(regs) BPF_CORE_READ(regs, orig_ax)	/* at sys_exit: the syscall's number (-1: rt_sigreturn) */
/* In a fexit program, the stack pointer a kretprobe reads at the same return (its regs' sp: the slot of the
 * function's return address). The x86-64 trampoline keeps the argument slots at ctx (their count below ctx, at most
 * 12), the return value above them, then its saved frame pointer, its return address into the function, and then the
 * function's return address: 8 * (slots + 3) above ctx, whatever the count (tests/vm/scenarios/syscalls_preset.py
 * compares both on 7.2 for functions of 1, 3 and 9 arguments). */
#define FEXIT_RET_SLOT(ctx) ((__u64)(ctx) + 8 * (bpf_get_func_arg_cnt(ctx) & 15) + 24)

struct thread_struct {
	unsigned long fsbase;	/* the user thread pointer (TLS variant II: the TCB above the TLS blocks) */
} __attribute__((preserve_access_index));
#define USER_THREAD_POINTER(task) BPF_CORE_READ(task, thread.fsbase)
#define TCB_DTV_OFFSET 8	/* glibc's tcbhead_t: { void *tcb; dtv_t *dtv; ... } */
#elif defined(__TARGET_ARCH_arm64)
struct user_pt_regs {
	__u64 regs[31];
	__u64 sp;
	__u64 pc;
	__u64 pstate;
} __attribute__((preserve_access_index));

struct pt_regs {
	struct user_pt_regs user_regs;
	__u64 orig_x0;
	int syscallno;
} __attribute__((preserve_access_index));
#define SYSCALL_NR(regs) BPF_CORE_READ(regs, syscallno)

struct thread_struct {
	struct {
		unsigned long tp_value;	/* TPIDR_EL0, the user thread pointer (TLS variant I: the TCB below) */
	} uw;
} __attribute__((preserve_access_index));
#define USER_THREAD_POINTER(task) BPF_CORE_READ(task, thread.uw.tp_value)
#define TCB_DTV_OFFSET 0	/* glibc's tcbhead_t: { dtv_t *dtv; void *private; } */
#else
#error "retsnoop-otel's BPF side is built for x86 or arm64 (make -C bpf ARCH=x86|arm64)"
#endif

struct qstr {
	const unsigned char *name;
} __attribute__((preserve_access_index));

struct dentry {
	struct qstr d_name;
} __attribute__((preserve_access_index));

struct path {
	struct dentry *dentry;
} __attribute__((preserve_access_index));

struct file {
	struct path f_path;
} __attribute__((preserve_access_index));

struct mm_struct {
	struct file *exe_file;
} __attribute__((preserve_access_index));

struct task_struct {
	void *stack;
	struct mm_struct *mm;
	int pid;
	int tgid;
	char comm[16];
	struct task_struct *group_leader;
	struct thread_struct thread;
} __attribute__((preserve_access_index));

#endif
