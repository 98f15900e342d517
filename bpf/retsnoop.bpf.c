// SPDX-License-Identifier: GPL-2.0
/* Kernel side of retsnoop-otel: per-thread sessions started by entry functions, the deepest
 * error chain with the kernel stack at the error point, optional per-call records, and in-kernel
 * per-function aggregates (calls, errors by errno, log2 latency histogram) for Prometheus.
 *
 * One set of logic behind three thin pairs of programs: fentry/fexit, kprobe/kretprobe (also
 * attached as uprobes) and kprobe.multi/kretprobe.multi. Every attachment carries the function
 * id as its BPF cookie. bpf/retsnoop.h is the whole contract with user space.
 */

#include "vmlinux_min.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "retsnoop.h"

char LICENSE[] SEC("license") = "GPL";

#define MAX_ERRNO 4095

/* Read-only configuration, set by user space before load. */
const volatile bool emit_calls = false;		/* -T / OTLP: per-call records */
const volatile bool capture_success = false;	/* -S: report sessions without errors */
const volatile __u64 min_duration_ns = 0;	/* -L */
const volatile __u32 tgid_allow_cnt = 0;
const volatile __u32 comm_allow_cnt = 0;
const volatile bool has_tgid_filter = false;
const volatile bool has_comm_filter = false;
const volatile __u64 cgroup_id_filter = 0;	/* --cgroup: this cgroup v2 and everything below it */
const volatile __u32 cgroup_level = 0;		/* its depth below the root cgroup */
const volatile __u32 max_depth = MAX_FSTACK_DEPTH;	/* nesting recorded per session (<= 64) */
const volatile bool capture_args = false;	/* -A: off unless asked, kernel memory can hold secrets */
const volatile bool use_lbr = false;		/* --lbr: snapshot the CPU's branch records at exits */
const volatile bool read_app = false;		/* read the application's OTel thread context at session start */
const volatile bool user_stacks = false;	/* take the user stack at session start */
const volatile bool workload_stats = false;	/* count per cgroup too (metrics workload label) */

/* Set by user space once every probe is attached: no session starts half-instrumented. */
volatile bool ready = false;

struct session {
	__u64 start_ts;
	__u64 cgroup_id;	/* workload_stats: the thread's cgroup v2 when the session started */
	__u32 tid;
	__u32 tgid;
	__u32 next_seq;
	__u32 dropped_records;
	__s32 depth;
	__s32 chain_depth;
	__s32 chain_top;
	__s32 kstack_sz;
	__u8 is_err;
	__u8 defunct;
	__u8 pad[6];
	char comm[TASK_COMM_LEN];
	char proc_comm[TASK_COMM_LEN];
	__u16 func_ids[MAX_FSTACK_DEPTH];
	__u64 func_ts[MAX_FSTACK_DEPTH];
	__u16 chain_ids[MAX_FSTACK_DEPTH];
	__s64 chain_res[MAX_FSTACK_DEPTH];
	__u64 chain_lat[MAX_FSTACK_DEPTH];
	__u64 kstack[MAX_KSTACK_DEPTH];
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 * 1024 * 1024);
} rb SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);	/* resized to the number of traced functions */
	__type(key, __u32);
	__type(value, struct func_info);
} func_infos SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct session);
} sessions SEC(".maps");

/* Template for new sessions: BPF cannot memset a 2 KB value, but can copy this zeroed one. */
static const struct session empty_session = {};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct capture_stats);
} cap_stats SEC(".maps");

/* Recursion guard: our own helpers may be traced functions too (fentry fires inside BPF). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} running SEC(".maps");

static __always_inline struct capture_stats *cstats(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&cap_stats, &zero);
}

static __always_inline bool enter_guard(void)
{
	__u32 zero = 0;
	__u32 *r = bpf_map_lookup_elem(&running, &zero);

	if (!r || *r)
		return false;
	*r = 1;
	return true;
}

static __always_inline void exit_guard(void)
{
	__u32 zero = 0;
	__u32 *r = bpf_map_lookup_elem(&running, &zero);

	if (r)
		*r = 0;
}

static __always_inline __u32 lvl(int d)
{
	/* mask after an opaque copy so the compiler cannot drop it: the verifier needs the bound */
	__u32 i = d;

	asm volatile("" : "+r"(i));
	return i & (MAX_FSTACK_DEPTH - 1);
}

static __always_inline __u32 session_key(__u32 tid)
{
	/* idle threads share tid 0 on every CPU: give each CPU its own key */
	return tid ? tid : (__u32)-(1 + (int)bpf_get_smp_processor_id());
}

/* uapi enum values for bpf_ringbuf_query() (not in the minimal vmlinux header) */
#define RB_AVAIL_DATA 0
#define RB_RING_SIZE 1
/* Room per-call records leave free for session end records (two, with their 8-byte headers): when
 * calls flood the ring buffer, the session still arrives, with its gap counted, instead of vanishing. */
#define END_RECORD_HEADROOM (2 * (sizeof(struct rec_session_end) + 8))

static __always_inline bool room_for_call_records(void)
{
	return bpf_ringbuf_query(&rb, RB_AVAIL_DATA) + END_RECORD_HEADROOM <= bpf_ringbuf_query(&rb, RB_RING_SIZE);
}

/* Separate concerns, one file each. They are part of this compilation unit, not headers of their
 * own: they use the configuration, struct session, the ring buffer and the helpers above. */
#include "errors.bpf.h"
#include "filters.bpf.h"
#include "stats.bpf.h"
#include "lbr.bpf.h"
#include "args.bpf.h"
#include "appctx.bpf.h"

static __always_inline void emit_trace(struct session *s, __u32 type, __u32 tid, __u64 ts, int depth,
				       __u32 func_id, __u64 lat, __s64 res)
{
	struct rec_func_trace *r;
	struct capture_stats *cs;

	r = room_for_call_records() ? bpf_ringbuf_reserve(&rb, sizeof(*r), 0) : NULL;
	if (!r) {
		s->next_seq++;	/* the gap in sequence numbers shows user space where records were lost */
		if (!s->dropped_records) {
			cs = cstats();
			if (cs)
				cs->incomplete_sessions++;
		}
		s->dropped_records++;
		cs = cstats();
		if (cs)
			cs->dropped_records++;
		return;
	}
	r->type = type;
	r->tid = tid;
	r->ts = ts;
	r->seq = s->next_seq++;
	r->depth = depth;
	r->func_id = func_id;
	r->lat = lat;
	r->res = res;
	bpf_ringbuf_submit(r, 0);
}

static __always_inline struct session *start_session(__u32 key, __u32 tid, __u32 tgid, __u64 now)
{
	struct rec_session_start *r;
	struct capture_stats *cs;
	struct task_struct *task;
	struct session *s;

	if (!filters_allow(tgid, tid))
		return NULL;
	cs = cstats();
	if (bpf_map_update_elem(&sessions, &key, &empty_session, BPF_NOEXIST)) {
		if (cs)
			cs->dropped_sessions++;
		return NULL;
	}
	s = bpf_map_lookup_elem(&sessions, &key);
	if (!s)
		return NULL;
	if (cs)
		cs->sessions_started++;
	s->start_ts = now;
	s->tid = tid;
	s->tgid = tgid;
	if (workload_stats)
		s->cgroup_id = bpf_get_current_cgroup_id();
	bpf_get_current_comm(s->comm, sizeof(s->comm));
	task = (struct task_struct *)bpf_get_current_task();
	BPF_CORE_READ_STR_INTO(&s->proc_comm, task, group_leader, comm);
	if (emit_calls) {
		r = bpf_ringbuf_reserve(&rb, sizeof(*r), 0);
		if (!r) {
			s->defunct = 1;
			if (cs)
				cs->dropped_sessions++;
			return s;
		}
		r->type = REC_SESSION_START;
		r->tid = tid;
		r->tgid = tgid;
		r->cpu = bpf_get_smp_processor_id();
		r->start_ts = now;
		__builtin_memcpy(r->comm, s->comm, sizeof(r->comm));
		__builtin_memcpy(r->proc_comm, s->proc_comm, sizeof(r->proc_comm));
		bpf_ringbuf_submit(r, 0);
	}
	return s;
}

static __always_inline void handle_entry(void *ctx, __u32 func_id, bool fentry)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)pid_tgid, key = session_key(tid);
	struct func_info *fi;
	struct session *s;
	__u64 now;
	int d;

	fi = bpf_map_lookup_elem(&func_infos, &func_id);
	if (!fi)
		return;
	now = bpf_ktime_get_boot_ns();
	s = bpf_map_lookup_elem(&sessions, &key);
	if (!s) {
		if (!ready || !(fi->flags & FUNC_IS_ENTRY))
			return;
		s = start_session(key, tid, pid_tgid >> 32, now);
		if (!s)
			return;
	}
	d = s->depth;
	s->depth = d + 1;
	if (d < 0 || d >= max_depth || d >= MAX_FSTACK_DEPTH)
		return;	/* too deep: tracked by depth only, never recorded */
	s->func_ids[lvl(d)] = func_id;
	s->func_ts[lvl(d)] = now;
	if (emit_calls && !s->defunct) {
		emit_trace(s, REC_FUNC_ENTRY, tid, now, d, func_id, 0, 0);
		if (capture_args)
			emit_args(ctx, s, tid, d, func_id, s->next_seq - 1, fentry);
	}
}

static __always_inline void take_chain(void *ctx, struct session *s, int d, __u32 key, __u32 func_id, __u64 now)
{
	/* the live stack [0..d] becomes the chain; levels above d fill in as they return */
	bpf_probe_read_kernel(s->chain_ids, sizeof(s->chain_ids), s->func_ids);
	s->chain_depth = d + 1;
	s->chain_top = d + 1;
	s->kstack_sz = bpf_get_stack(ctx, s->kstack, sizeof(s->kstack), 0);
	if (use_lbr)
		keep_lbr(key, func_id, d, now);
}

static __always_inline void fill_level(struct session *s, int d, __s64 res, __u64 lat)
{
	s->chain_top = d;
	s->chain_res[lvl(d)] = res;
	s->chain_lat[lvl(d)] = lat;
}

static __always_inline void end_session(void *ctx, struct session *s, __u32 key, __u64 now)
{
	struct capture_stats *cs = cstats();
	struct rec_session_end *r;
	__u64 lat = now - s->start_ts;
	__u32 entry_id = s->func_ids[0];
	struct func_stats *es = bpf_map_lookup_elem(&entry_stats, &entry_id);

	if (es)
		count_into(es, lat, s->is_err);
	if (workload_stats)
		count_workload(s->cgroup_id, entry_id | WL_SESSION, s->is_err);
	if (s->defunct || !(s->is_err || capture_success) || lat < min_duration_ns)
		goto out;
	if (use_lbr)
		emit_lbr(s, key);
	if (read_app || user_stacks)
		emit_app_side(ctx, s);
	r = bpf_ringbuf_reserve(&rb, sizeof(*r), 0);
	if (!r) {
		if (cs)
			cs->dropped_sessions++;
		goto out;
	}
	r->type = REC_SESSION_END;
	r->tid = s->tid;
	r->tgid = s->tgid;
	r->cpu = bpf_get_smp_processor_id();
	r->start_ts = s->start_ts;
	r->end_ts = now;
	r->cgroup_id = bpf_get_current_cgroup_id();
	r->last_seq = s->next_seq;
	r->dropped_records = s->dropped_records;
	r->is_err = s->is_err;
	r->chain_depth = s->chain_depth;
	r->chain_top = s->chain_top;
	r->kstack_sz = s->kstack_sz;
	__builtin_memcpy(r->comm, s->comm, sizeof(r->comm));
	__builtin_memcpy(r->proc_comm, s->proc_comm, sizeof(r->proc_comm));
	bpf_probe_read_kernel(r->chain_ids, sizeof(r->chain_ids), s->chain_ids);
	bpf_probe_read_kernel(r->chain_res, sizeof(r->chain_res), s->chain_res);
	bpf_probe_read_kernel(r->chain_lat, sizeof(r->chain_lat), s->chain_lat);
	bpf_probe_read_kernel(r->kstack, sizeof(r->kstack), s->kstack);
	bpf_ringbuf_submit(r, 0);
	if (cs)
		cs->sessions_reported++;
out:
	if (use_lbr)
		bpf_map_delete_elem(&session_lbrs, &key);
	bpf_map_delete_elem(&sessions, &key);
}

static __always_inline void handle_exit(void *ctx, __u32 func_id, __s64 res)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)pid_tgid, key = session_key(tid);
	struct capture_stats *cs;
	struct func_info *fi;
	struct session *s;
	bool failed;
	__u64 now, lat;
	__u32 err;
	int d;

	s = bpf_map_lookup_elem(&sessions, &key);
	if (!s)
		return;
	fi = bpf_map_lookup_elem(&func_infos, &func_id);
	if (!fi)
		return;
	now = bpf_ktime_get_boot_ns();
	d = s->depth - 1;
	if (d >= max_depth || d >= MAX_FSTACK_DEPTH) {
		s->depth = d;
		return;
	}
	if (d < 0 || s->func_ids[lvl(d)] != func_id) {
		/* an exit without its entry (attach raced with a running call): the session is unusable */
		cs = cstats();
		if (cs)
			cs->incomplete_sessions++;
		if (use_lbr)
			bpf_map_delete_elem(&session_lbrs, &key);
		bpf_map_delete_elem(&sessions, &key);
		return;
	}
	s->depth = d;
	lat = now - s->func_ts[lvl(d)];
	failed = is_failure(res, fi->flags);
	err = failed ? errno_of(res, fi->flags) : 0;
	count_call(func_id, lat, failed, err);
	if (workload_stats)
		count_workload(s->cgroup_id, func_id, failed ? err + 1 : 0);

	if (d == s->chain_top - 1 && (s->is_err || capture_success)) {
		/* the parent of the chain's top returns: always the same frame as in the chain */
		fill_level(s, d, res, lat);
		if (s->is_err && !failed && can_fail(fi->flags))
			s->is_err = 0;	/* a fallible function succeeded: the error was handled */
	} else if (failed || (capture_success && !s->is_err && d + 1 > s->chain_depth)) {
		/* a new error restarts the chain here; with -S, so does a deeper call chain */
		take_chain(ctx, s, d, key, func_id, now);
		fill_level(s, d, res, lat);
		if (failed)
			s->is_err = 1;
	}
	if (emit_calls && !s->defunct)
		emit_trace(s, REC_FUNC_EXIT, tid, now, d, func_id, lat, res);
	if (d == 0)
		end_session(ctx, s, key, now);
}

/* ---- attach flavours ---------------------------------------------------------------------- */

SEC("fentry/bpf_fentry_test1")
int BPF_PROG(fentry_entry)
{
	if (!enter_guard())
		return 0;
	handle_entry(ctx, (__u32)bpf_get_attach_cookie(ctx), true);
	exit_guard();
	return 0;
}

SEC("fexit/bpf_fentry_test1")
int BPF_PROG(fexit_exit)
{
	__u64 ret = 0;

	snap_lbr();
	if (!enter_guard())
		return 0;
	bpf_get_func_ret(ctx, &ret);
	handle_exit(ctx, (__u32)bpf_get_attach_cookie(ctx), (__s64)ret);
	exit_guard();
	return 0;
}

SEC("kprobe")
int kprobe_entry(struct pt_regs *ctx)
{
	if (!enter_guard())
		return 0;
	handle_entry(ctx, (__u32)bpf_get_attach_cookie(ctx), false);
	exit_guard();
	return 0;
}

SEC("kretprobe")
int kretprobe_exit(struct pt_regs *ctx)
{
	snap_lbr();
	if (!enter_guard())
		return 0;
	handle_exit(ctx, (__u32)bpf_get_attach_cookie(ctx), (__s64)PT_REGS_RC(ctx));
	exit_guard();
	return 0;
}

SEC("kprobe.multi")
int kmulti_entry(struct pt_regs *ctx)
{
	if (!enter_guard())
		return 0;
	handle_entry(ctx, (__u32)bpf_get_attach_cookie(ctx), false);
	exit_guard();
	return 0;
}

SEC("kretprobe.multi")
int kmulti_exit(struct pt_regs *ctx)
{
	snap_lbr();
	if (!enter_guard())
		return 0;
	handle_exit(ctx, (__u32)bpf_get_attach_cookie(ctx), (__s64)PT_REGS_RC(ctx));
	exit_guard();
	return 0;
}

/* Record sizes are part of the contract with retsnoop_otel/capture/records.py, whose formats
 * tests/unit/test_records.py compares with these numbers. */
_Static_assert(sizeof(struct rec_session_start) == 56, "rec_session_start layout");
_Static_assert(sizeof(struct rec_func_trace) == 40, "rec_func_trace layout");
_Static_assert(sizeof(struct rec_session_end) == 1760, "rec_session_end layout");
_Static_assert(sizeof(struct func_stats) == 344, "func_stats layout");
_Static_assert(sizeof(struct capture_stats) == 48, "capture_stats layout");
_Static_assert(sizeof(struct wl_key) == 16, "wl_key layout");
_Static_assert(sizeof(struct func_info) == 16, "func_info layout");
_Static_assert(sizeof(struct rec_func_args) == 1616, "rec_func_args layout");
_Static_assert(sizeof(struct arg_spec) == 16, "arg_spec layout");
_Static_assert(sizeof(struct lbr_capture) == 784, "lbr_capture layout");
_Static_assert(sizeof(struct rec_session_lbr) == 800, "rec_session_lbr layout");
_Static_assert(sizeof(struct app_tls) == 24, "app_tls layout");
_Static_assert(sizeof(struct app_ctx) == 640, "app_ctx layout");
_Static_assert(sizeof(struct rec_session_app) == 664, "rec_session_app layout");
_Static_assert(sizeof(struct rec_session_ustack) == 536, "rec_session_ustack layout");
_Static_assert(sizeof(struct rec_app_probe) == 8, "rec_app_probe layout");
