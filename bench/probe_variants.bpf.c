// SPDX-License-Identifier: GPL-2.0
/* Stripped-down probe programs for bench/probe_cost.py: each does one piece of what retsnoop.bpf.c does
 * on every probe run, so bpf_stats (run_time_ns / run_cnt) can say which piece costs what, per attach
 * mode and set size. Built by the bench itself into bench/build/ (not part of the package). */

#include "../bpf/vmlinux_min.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "GPL";

__u64 sink = 0;	/* results land here so the compiler keeps the calls */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, __u32);
} ip_ids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u64);
} tids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} guard SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u64);
} hits SEC(".maps");

static __always_inline int v_empty(struct pt_regs *ctx)
{
	return 0;
}

static __always_inline int v_cookie(struct pt_regs *ctx)
{
	sink += bpf_get_attach_cookie(ctx);
	return 0;
}

static __always_inline int v_funcip(struct pt_regs *ctx)
{
	sink += bpf_get_func_ip(ctx);
	return 0;
}

static __always_inline int v_iphash(struct pt_regs *ctx)
{
	__u64 ip = bpf_get_func_ip(ctx);
	__u32 *id = bpf_map_lookup_elem(&ip_ids, &ip);

	if (id)
		sink += *id;
	return 0;
}

static __always_inline int v_tidhash(struct pt_regs *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 *v = bpf_map_lookup_elem(&tids, &tid);

	if (v)
		sink += *v;
	return 0;
}

static __always_inline int v_ktime(struct pt_regs *ctx)
{
	sink += bpf_ktime_get_boot_ns();
	return 0;
}

static __always_inline int v_guard(struct pt_regs *ctx)
{
	__u32 zero = 0, *g = bpf_map_lookup_elem(&guard, &zero);

	if (g)
		sink += *g;
	return 0;
}

/* calls per function (entry runs only): what fentry's per-function run counts are compared with */
static __always_inline int v_count(struct pt_regs *ctx)
{
	__u64 ip = bpf_get_func_ip(ctx), *n;
	__u32 *id = bpf_map_lookup_elem(&ip_ids, &ip);

	if (id && (n = bpf_map_lookup_elem(&hits, id)))
		__sync_fetch_and_add(n, 1);
	return 0;
}

/* Pieces of a session's fixed cost (once per traced syscall, not per probe run), here at every run. */
struct big_session {
	char b[2400];	/* about struct session's size in retsnoop.bpf.c */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct big_session);
} big_sessions SEC(".maps");

struct scratch {
	__u64 stack[64];
	char name[64];
	char comm[16];
	char proc_comm[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} rb SEC(".maps");

static const struct big_session empty_big = {};

static __always_inline struct scratch *scr(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&scratch, &zero);
}

/* what the peer (bpftrace) does per run: a per-thread map update, and a delete */
static __always_inline int v_tidupd(struct pt_regs *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 now = bpf_ktime_get_ns();

	bpf_map_update_elem(&tids, &tid, &now, BPF_ANY);
	bpf_map_delete_elem(&tids, &tid);
	return 0;
}

/* a session's start and end: its map entry created from a zeroed template, then deleted */
static __always_inline int v_tmpl(struct pt_regs *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();

	bpf_map_update_elem(&big_sessions, &tid, &empty_big, BPF_NOEXIST);
	bpf_map_delete_elem(&big_sessions, &tid);
	return 0;
}

/* the kernel stack at the error */
static __always_inline int v_stack(struct pt_regs *ctx)
{
	struct scratch *s = scr();

	if (s)
		sink += bpf_get_stack(ctx, s->stack, sizeof(s->stack), 0);
	return 0;
}

/* the session end record, reserved and thrown away */
static __always_inline int v_rbrec(struct pt_regs *ctx)
{
	char *r = bpf_ringbuf_reserve(&rb, 1832, 0);

	if (r) {
		r[0] = 1;
		bpf_ringbuf_discard(r, 0);
	}
	return 0;
}

/* the executable's name, the thread's and the process's comm */
static __always_inline int v_names(struct pt_regs *ctx)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct scratch *s = scr();
	const unsigned char *name;

	if (!s)
		return 0;
	bpf_get_current_comm(s->comm, sizeof(s->comm));
	BPF_CORE_READ_STR_INTO(&s->proc_comm, task, group_leader, comm);
	name = BPF_CORE_READ(task, mm, exe_file, f_path.dentry, d_name.name);
	if (name)
		bpf_probe_read_kernel_str(s->name, sizeof(s->name), name);
	return 0;
}

/* one program per variant and attach section: kprobe (also kretprobe) and kprobe.multi (also return) */
#define VARIANT(name)							\
	SEC("kprobe") int k_##name(struct pt_regs *ctx) { return v_##name(ctx); }	\
	SEC("kprobe.multi") int m_##name(struct pt_regs *ctx) { return v_##name(ctx); }

/* fexit.multi (Linux 7.2+, a tracing_multi link): loaded without a target function (the bench sets its type) */
SEC("?fexit.multi") int f_empty(void *ctx) { return v_empty(ctx); }
SEC("?fexit.multi") int f_tidhash(void *ctx) { return v_tidhash(ctx); }

VARIANT(empty)
VARIANT(cookie)
VARIANT(funcip)
VARIANT(iphash)
VARIANT(tidhash)
VARIANT(ktime)
VARIANT(guard)
VARIANT(count)
VARIANT(tidupd)
VARIANT(tmpl)
VARIANT(stack)
VARIANT(rbrec)
VARIANT(names)
