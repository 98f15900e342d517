// SPDX-License-Identifier: GPL-2.0
/* The stack pointer a fexit.multi program derives (FEXIT_RET_SLOT, bpf/vmlinux_min.h) against the one a
 * kretprobe.multi program reads, at the same returns: --origins-only orders one chain with both kinds of link
 * (kernel/modes/origin_fexits.py). Built and run by tests/vm/scenarios/stack_position.py. */

#include "../../bpf/vmlinux_min.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

#define CALLS 8

struct seen_key {
	__u32 func;	/* the link's cookie */
	__u32 kind;	/* 0: fexit.multi, 1: kretprobe.multi */
	__u32 call;	/* the how-manieth return of that function this kind saw */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, struct seen_key);
	__type(value, __u64);
} seen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} counts SEC(".maps");	/* [func * 2 + kind]; [63]: the thread to watch */

static __always_inline int record(__u32 func, __u32 kind, __u64 sp)
{
	__u32 watch_key = 63, key = (func & 15) * 2 + kind, *watched = bpf_map_lookup_elem(&counts, &watch_key), *n;
	struct seen_key k = { .func = func, .kind = kind };

	if (!watched || *watched != (__u32)bpf_get_current_pid_tgid())
		return 0;
	n = bpf_map_lookup_elem(&counts, &key);
	if (!n || *n >= CALLS)
		return 0;
	k.call = (*n)++;
	bpf_map_update_elem(&seen, &k, &sp, BPF_ANY);
	return 0;
}

#if defined(__TARGET_ARCH_x86)
SEC("?fexit.multi")
int at_fexit(__u64 *ctx)
{
	return record(bpf_get_attach_cookie(ctx), 0, FEXIT_RET_SLOT(ctx));
}
#endif

SEC("?kprobe.multi")
int at_kretprobe(struct pt_regs *ctx)
{
	return record(bpf_get_attach_cookie(ctx), 1, PT_REGS_SP(ctx));
}
