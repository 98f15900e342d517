// SPDX-License-Identifier: GPL-2.0-only
/* What kprobe.multi and kprobe.session programs know by the traced function's address: its id (map ip_ids) and,
 * where one link takes every function, whether it is an entry function. Included by retsnoop.bpf.c. */

/* kprobe.multi and kprobe.session: function address -> id (filled by user space at attach time). Their
 * BPF cookie is found by a binary search over the link's sorted addresses on every run (flavours.bpf.h). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);	/* resized to the number of traced functions in those modes */
	__type(key, __u64);
	__type(value, __u32);
} ip_ids SEC(".maps");

static __always_inline __s64 id_by_ip(void *ctx)
{
	__u64 ip = func_ip(ctx);
	__u32 *id = bpf_map_lookup_elem(&ip_ids, &ip);

	return id ? *id : -1;
}

/* kprobe.multi and kprobe.session with few entry functions (user space sets one_link): one program and one link for
 * every function, the entry functions told apart by address, and only where no session runs; a stop then detaches
 * one link, not two (on Linux 6.12 each link's unregistration waits for its own grace periods, one after another).
 * The publish hooks folded into the entry link count among them. */
#define FEW_ENTRIES 16
const volatile bool one_link = false;
const volatile __u32 few_entry_cnt = 0;
const volatile __u64 few_entry_ips[FEW_ENTRIES] = {};

static __always_inline bool few_entry(void *ctx)
{
	__u64 ip = func_ip(ctx);

	for (__u32 i = 0; i < FEW_ENTRIES && i < few_entry_cnt; i++)
		if (few_entry_ips[i] == ip)
			return true;
	return false;
}

/* handle_entry()'s `outer`: whether the function may start a session */
enum { OUTER_NO = 0, OUTER_YES = 1, OUTER_BY_IP = 2 };
#define OUTER_LINKED (one_link ? OUTER_BY_IP : OUTER_YES)	/* an entry link's program (see one_link) */
