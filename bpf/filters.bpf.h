// SPDX-License-Identifier: GPL-2.0-only
/* Which tasks may start a session (--cgroup, -p/-P, -n/-N). Part of retsnoop.bpf.c.
 * User space writes deny entries after allow entries, so a task both allowed and denied is denied. */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u8);
} tgid_filter SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, char[TASK_COMM_LEN]);
	__type(value, __u8);
} comm_filter SEC(".maps");

static __always_inline bool filters_allow(__u32 tgid, __u32 tid)
{
	char comm[TASK_COMM_LEN] = {};
	__u8 *v;

	if (tgid == self_tgid)	/* a compare, not a lookup: the one pid every run excludes */
		return false;
	if (cgroup_id_filter && bpf_get_current_ancestor_cgroup_id(cgroup_level) != cgroup_id_filter)
		return false;
	if (has_tgid_filter) {
		v = bpf_map_lookup_elem(&tgid_filter, &tgid);
		if (v && *v == FILTER_DENY)
			return false;
		if (tgid_allow_cnt && !(v && *v == FILTER_ALLOW))
			return false;
	}
	if (has_comm_filter) {
		bpf_get_current_comm(comm, sizeof(comm));
		v = bpf_map_lookup_elem(&comm_filter, comm);
		if (v && *v == FILTER_DENY)
			return false;
		if (comm_allow_cnt && !(v && *v == FILTER_ALLOW))
			return false;
	}
	return true;
}
