// SPDX-License-Identifier: GPL-2.0-only
/* Kernel side of retsnoop-otel: per-thread sessions started by entry functions, the deepest
 * error chain with the kernel stack at the error point, optional per-call records, and in-kernel
 * per-function aggregates (calls, errors by errno, log2 latency histogram) for Prometheus.
 *
 * One set of logic behind thin programs per attach flavour (flavours.bpf.h): fentry/fexit,
 * kprobe/kretprobe (also attached as uprobes), kprobe.multi/kretprobe.multi, kprobe.session, fsession,
 * fsession.multi, and for user-space functions uprobe.multi and uprobe.session.
 * bpf/retsnoop.h is the whole contract with user space.
 */

#include "vmlinux_min.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "retsnoop.h"
#include "compat.bpf.h"

char LICENSE[] SEC("license") = "GPL";

#define MAX_ERRNO 4095

/* Read-only configuration, set by user space before load. */
const volatile bool emit_calls = false;		/* -T / OTLP: per-call records */
const volatile bool capture_success = false;	/* -S: report sessions without errors */
const volatile __u64 min_duration_ns = 0;	/* -L */
const volatile __u32 tgid_allow_cnt = 0;
const volatile __u32 comm_allow_cnt = 0;
const volatile bool has_tgid_filter = false;
const volatile __u32 self_tgid = 0;		/* our own process, never traced (0: none; tests trace themselves) */
const volatile bool has_comm_filter = false;
const volatile __u64 cgroup_id_filter = 0;	/* --cgroup: this cgroup v2 and everything below it */
const volatile __u32 cgroup_level = 0;		/* its depth below the root cgroup */
const volatile __u32 max_depth = MAX_FSTACK_DEPTH;	/* nesting recorded per session (<= 64) */
const volatile bool capture_args = false;	/* -A: off unless asked, kernel memory can hold secrets */
const volatile bool use_lbr = false;		/* --lbr: snapshot the CPU's branch records at exits */
const volatile bool read_app = false;		/* read the application's OTel thread context at session start */
const volatile bool user_stacks = false;	/* take the user stack at session start */
const volatile bool kernel_stack = true;	/* take the kernel stack at the error (off where nothing reports it) */
const volatile bool func_counts = true;	/* per-function and per-session counts (stats.bpf.h): read by
						 * the metrics only, off where none are served */
const volatile bool workload_stats = false;	/* count per cgroup too (metrics workload label) */
const volatile __u64 rb_bytes = 8 * 1024 * 1024;	/* the ring buffer's size */
const volatile __u64 success_threshold = 0;	/* sampling.bpf.h */
const volatile __u64 success_interval_ns = 0;
const volatile __u64 success_burst_ns = 0;
const volatile __u64 error_threshold = 0;	/* sampling.bpf.h: 0 reports every error session */
const volatile __u64 error_interval_ns = 0;
const volatile __u64 error_burst_ns = 0;

/* Set by user space once every probe is attached: no session starts half-instrumented. */
volatile bool ready = false;
/* Set by user space before it detaches: the links go in any order (many from parallel threads), so a session in
 * progress could end after some of its inner probes went; from here on a session's end drops it, unreported. */
volatile bool stopping = false;

struct session {
	__u64 start_ts;
	__u64 cgroup_id;	/* workload_stats: the thread's cgroup v2 when the session started */
	__u64 randomness;	/* sampling.bpf.h */
	__u32 tid;
	__u32 tgid;
	__u32 next_seq;
	__u32 dropped_records;
	__s32 depth;
	__s32 chain_depth;
	__s32 chain_top;
	__s32 kstack_sz;
	__s32 sys_depth;	/* the depth while in a syscall the tracepoints hooked (syscalls.bpf.h); 0: in none */
	__u32 cpu;		/* where it started */
	__u32 origin_err;	/* errno_of() the error chain's deepest function returned (stats.bpf.h) */
	__u8 is_err;
	__u8 defunct;		/* its start record was lost: nothing more of it is sent */
	__u8 want_success;	/* reported if it succeeds (sampling.bpf.h) */
	__u8 streaming;		/* calls.bpf.h: per-call records go straight to the ring buffer */
	__u8 active;		/* the entry outlives its session: the thread's next session reuses it */
	/* everything above is reset when a session starts; the arrays below are written before they are read */
	__u16 func_ids[MAX_FSTACK_DEPTH];
	__u64 func_ts[MAX_FSTACK_DEPTH];
	__u16 chain_ids[MAX_FSTACK_DEPTH];
	__s64 chain_res[MAX_FSTACK_DEPTH];
	__u64 chain_lat[MAX_FSTACK_DEPTH];
	__u64 kstack[MAX_KSTACK_DEPTH];
};

#include "ringbuf.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);	/* resized to the number of traced functions */
	__type(key, __u32);
	__type(value, struct func_info);
} func_infos SEC(".maps");

/* One entry per thread, kept after its session ends and reset by the thread's next one: creating and
 * deleting a 2.4 kB entry per session cost more than the rest of the session's work (bench/probe_cost.py
 * variants tmpl and tidupd). LRU: the entries of threads that are gone make room for new threads. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct session);
} sessions SEC(".maps");

#define ID_BY_IP (-1)	/* handle_exit(): find the id by the function's address, once a session is found */
#define ID_OF_TOP (-2)	/* handle_exit(): the function of the session's innermost open call (kretprobes before
			 * Linux 5.15, which have neither a cookie nor the function's address) */

#include "by_address.bpf.h"

/* Template for a thread's first session: BPF cannot memset a 2 KB value, but can copy this zeroed one. */
static const struct session empty_session = {};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct capture_stats);
} cap_stats SEC(".maps");

/* Recursion guard of the fentry programs: fentry fires inside BPF programs (our helpers may be traced
 * functions too) and in interrupts that stop one of our programs half-way through a session update.
 * kprobe-type programs need none: the kernel runs no kprobe program while one runs on the CPU. */
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

/* Separate concerns, one file each. They are part of this compilation unit, not headers of their
 * own: they use the configuration, struct session, the ring buffer and the helpers above. */
#include "errors.bpf.h"
#include "filters.bpf.h"
#include "stats.bpf.h"
#include "lbr.bpf.h"
#include "calls.bpf.h"
#include "args.bpf.h"
#include "appctx.bpf.h"
#include "sampling.bpf.h"

static __always_inline void drop_session(struct session *s, __u32 key)
{
	if (use_lbr)
		bpf_map_delete_elem(&session_lbrs, &key);
	if (emit_calls)
		bpf_map_delete_elem(&call_bufs, &key);
	s->active = 0;
}

/* `s`: the thread's entry from its last session, or NULL for its first one */
static __always_inline struct session *start_session(struct session *s, __u32 key, __u32 tid, __u32 tgid,
						     __u64 now)
{
	struct capture_stats *cs;

	if (!filters_allow(tgid, tid))
		return NULL;
	cs = cstats();
	if (!s) {
		if (bpf_map_update_elem(&sessions, &key, &empty_session, BPF_NOEXIST) ||
		    !(s = bpf_map_lookup_elem(&sessions, &key))) {
			if (cs)
				cs->dropped_sessions++;
			return NULL;
		}
	} else {
		__builtin_memset(s, 0, __builtin_offsetof(struct session, func_ids));
	}
	if (cs)
		cs->sessions_started++;
	s->active = 1;
	s->start_ts = now;
	s->tid = tid;
	s->tgid = tgid;
	s->cpu = bpf_get_smp_processor_id();
	if (workload_stats)
		s->cgroup_id = bpf_get_current_cgroup_id();
	sample_at_start(s);
	if (emit_calls) {
		hold_calls(s, key);
		if (s->streaming && !emit_start(s)) {
			s->defunct = 1;
			if (cs)
				cs->dropped_sessions++;
		}
	}
	return s;
}

/* Returns the function's id when the call's exit must be seen, else -1 (kprobe.session skips the other exits).
 * `outer`: the function may start a session (an entry function, or a program for every function);
 * kprobe.multi and kprobe.session attach the other functions with programs where it is OUTER_NO, so that
 * their calls outside a session cost one lookup of the thread's session and nothing else, or (OUTER_BY_IP, one
 * link for all) that and a look at the few entry addresses. */
static __always_inline __s64 handle_entry(void *ctx, __s64 id, bool fentry, int outer)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)pid_tgid, key = session_key(tid), func_id;
	struct session *s, *idle = NULL;
	struct func_info *fi;
	__u64 now;
	int d;

	s = bpf_map_lookup_elem(&sessions, &key);
	if (s && !s->active) {
		idle = s;
		s = NULL;
	}
	if (!s && (outer == OUTER_NO || (outer == OUTER_BY_IP && !few_entry(ctx))))
		return -1;
	if (id == ID_BY_IP && (id = id_by_ip(ctx)) >= APP_PUB_ID && outer)	/* a publish hook (appctx.bpf.h) */
		return publish_call(ctx, id - APP_PUB_ID), -1;
	if (id < 0)
		return -1;
	func_id = id;
	if (!s) {
		/* most calls of a large set run outside any session: decide that before reading the clock */
		fi = bpf_map_lookup_elem(&func_infos, &func_id);
		if (!ready || !fi || !(fi->flags & FUNC_IS_ENTRY))
			return -1;
		now = bpf_ktime_get_boot_ns();
		s = start_session(idle, key, tid, pid_tgid >> 32, now);
		if (!s)
			return -1;
	} else {
		now = bpf_ktime_get_boot_ns();
	}
	d = s->depth;
	s->depth = d + 1;
	if (d < 0 || d >= max_depth || d >= MAX_FSTACK_DEPTH)
		return func_id;	/* too deep: tracked by depth only, never recorded */
	s->func_ids[lvl(d)] = func_id;
	s->func_ts[lvl(d)] = now;
	if (emit_calls && !s->defunct) {
		emit_trace(s, key, REC_FUNC_ENTRY, tid, now, d, func_id, 0, 0);
		if (capture_args && !s->defunct)
			emit_args(ctx, s, tid, d, func_id, s->next_seq - 1, fentry);
	}
	return func_id;
}

/* n clamped to [0, max] where the verifier can see it (the opaque copy keeps the compiler from folding
 * the clamp into arithmetic it cannot follow): copies of chains and stacks take only their filled part,
 * most of them far shorter than their arrays. */
static __always_inline __u64 upto(__s32 n, __u64 max)
{
	__u64 v = n > 0 ? (__u64)n : 0;	/* 64-bit: no zero-extension copy for the bound to get lost in */

	asm volatile("" : "+r"(v));
	if (v > max)
		v = max;
	return v;
}

/* `user`: the error is a user-space function's, whose probe context holds no kernel stack of the error */
static __always_inline void take_chain(void *ctx, struct session *s, int d, __u32 key, __u32 func_id, __u64 now,
				       bool user)
{
	/* the live stack [0..d] becomes the chain; levels above d fill in as they return */
	bpf_probe_read_kernel(s->chain_ids, upto(d + 1, MAX_FSTACK_DEPTH) * sizeof(s->chain_ids[0]), s->func_ids);
	s->chain_depth = d + 1;
	s->chain_top = d + 1;
	s->kstack_sz = kernel_stack && !user ? bpf_get_stack(ctx, s->kstack, sizeof(s->kstack), 0) : 0;
	if (use_lbr)
		keep_lbr(key, func_id, d, now);
}

static __always_inline void fill_level(struct session *s, int d, __s64 res, __u64 lat)
{
	s->chain_top = d;
	s->chain_res[lvl(d)] = res;
	s->chain_lat[lvl(d)] = lat;
}

/* The executable's file name (what /proc/PID/exe ends with), read in the kernel because a short-lived
 * process is often gone before user space could look it up; empty for kernel threads (no mm). */
static __always_inline void read_exe_name(char *out)
{
	const unsigned char *name = exe_name();

	out[0] = 0;
	if (name)
		bpf_probe_read_kernel_str(out, EXE_NAME_LEN, name);
}

static __always_inline void end_session(void *ctx, struct session *s, __u32 key, __u64 now)
{
	struct capture_stats *cs;
	struct rec_session_end *r;
	__u64 lat = now - s->start_ts;
	__u32 entry_id = s->func_ids[0];
	struct func_stats *es;
	__u8 sampling = 0;

	if (func_counts && (es = bpf_map_lookup_elem(&entry_stats, &entry_id)))
		count_into(es, lat, s->is_err);
	if (workload_stats)
		count_workload(s->cgroup_id, entry_id | WL_SESSION, s->is_err);
	if (s->is_err)
		count_origin(s, entry_id);
	if (s->defunct || !(s->is_err || capture_success) || lat < min_duration_ns)
		goto out;
	cs = cstats();	/* not before: most sessions end above, and on 5.10 and 6.1 the lookup is a call */
	if (!s->is_err) {
		sampling = sample_success(s, entry_id, now);
		if (!sampling) {
			if (cs)
				cs->sampled_out++;
			goto out;
		}
	} else if (error_threshold || error_interval_ns) {
		sampling = sample_error(s, now);	/* after count_origin: the origin counts stay exact */
		if (!sampling) {
			if (cs)
				cs->errors_sampled_out++;
			goto out;
		}
	}
	if (emit_calls && !s->streaming)
		release_calls(s, key);	/* without its start record the session still ends, without calls */
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
	r->randomness = sampling == SAMPLED_PROBABILITY ? s->randomness : 0;
	r->last_seq = s->next_seq;
	r->dropped_records = s->dropped_records;
	r->is_err = s->is_err;
	r->sampling = sampling;
	r->chain_depth = s->chain_depth;
	r->chain_top = s->chain_top;
	r->kstack_sz = s->kstack_sz;
	read_names(r->comm, r->proc_comm, s->tid, s->tgid);
	read_exe_name(r->exe);
	/* user space reads chain_* up to chain_depth and kstack up to kstack_sz: the rest stays unwritten */
	bpf_probe_read_kernel(r->chain_ids, upto(s->chain_depth, MAX_FSTACK_DEPTH) * sizeof(r->chain_ids[0]),
			      s->chain_ids);
	bpf_probe_read_kernel(r->chain_res, upto(s->chain_depth, MAX_FSTACK_DEPTH) * sizeof(r->chain_res[0]),
			      s->chain_res);
	bpf_probe_read_kernel(r->chain_lat, upto(s->chain_depth, MAX_FSTACK_DEPTH) * sizeof(r->chain_lat[0]),
			      s->chain_lat);
	bpf_probe_read_kernel(r->kstack, upto(s->kstack_sz, sizeof(r->kstack)), s->kstack);
	bpf_ringbuf_submit(r, rb_wakeup(sizeof(*r)));
	if (cs)
		cs->sessions_reported++;
out:
	drop_session(s, key);
}

#include "syscalls.bpf.h"
#include "origins.bpf.h"

/* `outer`: as for handle_entry(). A session's level 0 is always an entry function (a mismatch there drops
 * the session above), so the exits of the other functions never end one: fentry verifies a program pair
 * per traced function, and theirs leave the session's end out. */
static __always_inline void handle_exit(void *ctx, __s64 id, __s64 res, bool outer)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)pid_tgid, key = session_key(tid), func_id;
	struct capture_stats *cs;
	struct func_info *fi;
	struct session *s;
	bool failed, wanted, in_chain, new_chain;
	__u64 now = 0, lat = 0;
	__u32 err;
	int d;

	s = bpf_map_lookup_elem(&sessions, &key);
	if (!s || !s->active)
		return;
	if (id == ID_BY_IP)
		id = id_by_ip(ctx);
	else if (id == ID_OF_SYSCALL) {
		if ((id = syscall_exit_id(s, key)) < 0)
			return;
	} else if (id == ID_OF_TOP)	/* past max_depth any traced id does: that exit only counts the depth down */
		id = s->depth <= 0 ? -1 : s->func_ids[lvl(s->depth > max_depth ? 0 : s->depth - 1)];
	if (id < 0)
		return;
	func_id = id;
	fi = bpf_map_lookup_elem(&func_infos, &func_id);
	if (!fi)
		return;
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
		drop_session(s, key);
		return;
	}
	s->depth = d;
	failed = is_failure(res, fi->flags);
	err = failed ? errno_of(res, fi->flags) : 0;
	wanted = s->want_success;	/* a success that would be reported (-S): its deepest chain is kept too */
	/* the parent of the chain's top returns: always the same frame as in the chain (a failure above a success
	 * chain is a new error instead); or a new error restarts the chain here (with -S, so does a deeper chain) */
	in_chain = d == s->chain_top - 1 && (s->is_err || (wanted && !failed));
	new_chain = !in_chain && (failed || (wanted && !s->is_err && d + 1 > s->chain_depth));
	/* the clock only where the time is kept: most exits are successes that nothing records */
	if (func_counts || emit_calls || in_chain || new_chain ||
	    (outer && d == 0 && (s->is_err || capture_success))) {
		now = bpf_ktime_get_boot_ns();
		lat = now - s->func_ts[lvl(d)];
	}
	if (func_counts)
		count_call(func_id, lat, failed, err);
	if (workload_stats)
		count_workload(s->cgroup_id, func_id, failed ? err + 1 : 0);

	if (in_chain) {
		fill_level(s, d, res, lat);
		if (s->is_err && !failed && can_fail(fi->flags))
			s->is_err = 0;	/* a fallible function succeeded: the error was handled */
	} else if (new_chain) {
		take_chain(ctx, s, d, key, func_id, now, fi->flags & FUNC_IS_USER);
		fill_level(s, d, res, lat);
		if (failed) {
			s->is_err = 1;
			s->origin_err = err;	/* the chain's deepest level: where the error started */
		}
	}
	if (emit_calls && !s->defunct)
		emit_trace(s, key, REC_FUNC_EXIT, tid, now, d, func_id, lat, res);
	if (outer && d == 0) {
		if (stopping)
			drop_session(s, key);
		else
			end_session(ctx, s, key, now);
	}
}

#include "flavours.bpf.h"
#include "inject.bpf.h"

/* Record sizes are part of the contract with retsnoop_otel/capture/records.py, whose formats
 * tests/unit/test_records.py compares with these numbers. */
_Static_assert(sizeof(struct rec_session_start) == 56, "rec_session_start layout");
_Static_assert(sizeof(struct rec_func_trace) == 40, "rec_func_trace layout");
_Static_assert(sizeof(struct rec_session_end) == 1832, "rec_session_end layout");
_Static_assert(sizeof(struct rec_func_batch) == 2584, "rec_func_batch layout");
_Static_assert(sizeof(struct func_stats) == 344, "func_stats layout");
_Static_assert(sizeof(struct capture_stats) == 72, "capture_stats layout");
_Static_assert(sizeof(struct origin_key) == 16, "origin_key layout");
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
_Static_assert(sizeof(struct rec_inject_probe) == 296, "rec_inject_probe layout");
