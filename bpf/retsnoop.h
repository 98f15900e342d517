/* Records shared by the BPF side (retsnoop.bpf.c) and user space (retsnoop_otel/capture/records.py).
 * This header is the only contract between kernel and user space: keep both in sync.
 * All records start with a u32 type; layouts are naturally aligned, little endian.
 */
#ifndef __RETSNOOP_H
#define __RETSNOOP_H

#define MAX_FSTACK_DEPTH 64	/* traced-function nesting kept per session */
#define MAX_KSTACK_DEPTH 64	/* kernel stack frames captured at the error point */
#define TASK_COMM_LEN 16
#define EXE_NAME_LEN 64	/* the executable's file name, as /proc/PID/exe names it (truncated) */
#define DUR_BUCKETS 40		/* log2(ns) latency buckets: [2^i, 2^(i+1)) ns, last one open */

enum rec_type {
	REC_SESSION_START = 1,
	REC_FUNC_ENTRY = 2,
	REC_FUNC_EXIT = 3,
	REC_SESSION_END = 4,
	REC_FUNC_ARGS = 5,
	REC_SESSION_LBR = 6,
	REC_SESSION_APP = 7,
	REC_SESSION_USTACK = 8,
	REC_APP_PROBE = 9,
	REC_FUNC_BATCH = 10,
	REC_APP_EXEC = 11,
	REC_INJECT_PROBE = 12,
	REC_APP_PUBLISH = 13,
};

#define MAX_LBR_ENTRIES 32	/* the most any CPU's last-branch stack holds */

/* One record of the CPU's last-branch stack, as struct perf_branch_entry lays it out. */
struct lbr_entry {
	__u64 from;
	__u64 to;
	__u64 flags;	/* mispred/predicted/cycles/type bit-fields: passed through, not decoded */
};

/* Branches captured by bpf_get_branch_snapshot() at the exit of one traced function (--lbr). */
struct lbr_capture {
	__u64 ts;	/* exit time of the function whose exit took the snapshot */
	__s32 sz;	/* bytes of entries filled, or the helper's negative error (-ENOENT: no LBR) */
	__u16 func_id;
	__u16 depth;
	struct lbr_entry entries[MAX_LBR_ENTRIES];
};

/* Sent right before the REC_SESSION_END of a reported session that captured branches. */
struct rec_session_lbr {
	__u32 type;
	__u32 tid;
	__u64 start_ts;	/* matches the session end's start_ts */
	struct lbr_capture lbr;
};

/* ---- the application's context: OpenTelemetry thread context (OTEP 4947) and user stack ---- */

#define APP_CTX_HEAD 28		/* trace-id, span-id, valid, trace-flags, attrs-data-size */
#define MAX_APP_ATTRS 612	/* attrs-data kept: records of up to 640 bytes, as OTEP 4947 recommends */
#define MAX_USTACK_DEPTH 64

/* Where otel_thread_ctx_v1 lives in every thread of one process (map app_targets, by tgid; filled by
 * user space from the ELF files of the process). glibc on x86-64 or arm64. */
struct app_tls {
	__s64 tp_offset;	/* modid 0: the variable is at thread pointer + tp_offset (the executable's TLS) */
	__u64 offset;		/* modid > 0: at dtv[modid].val + offset, where dtv = *(thread pointer + 8) */
	__u32 modid;
	__u32 flags;
};
#define APP_TLS_NONE 0x1	/* the process was checked: it publishes no thread context */

enum app_status {
	APP_OK = 0,		/* a valid record was read */
	APP_NO_RECORD = 1,	/* the thread has no record (NULL pointer, or its DTV entry is not allocated) */
	APP_INVALID = 2,	/* the record's valid byte is not 1 */
	APP_FAULT = 3,		/* a read of user memory failed (unmapped, paged out): err holds the error */
};

/* The record as OTEP 4947 lays it out, byte-packed; attrs cut at MAX_APP_ATTRS. */
struct app_ctx {
	__u8 trace_id[16];
	__u8 span_id[8];
	__u8 valid;
	__u8 trace_flags;
	__u16 attrs_size;	/* as the record says: more than MAX_APP_ATTRS means the attributes were cut */
	__u8 attrs[MAX_APP_ATTRS];
};

/* Sent right before the REC_SESSION_END of a reported session whose process publishes thread context. */
struct rec_session_app {
	__u32 type;
	__u32 tid;
	__u64 start_ts;	/* matches the session end's start_ts */
	__s32 status;	/* enum app_status */
	__s32 err;	/* APP_FAULT: the negative error of the failed read */
	struct app_ctx ctx;
};

/* Sent right before the REC_SESSION_END of a reported session when user stacks are on. */
struct rec_session_ustack {
	__u32 type;
	__u32 tid;
	__u64 start_ts;
	__s32 ustack_sz;	/* bytes of ustack filled, or negative error */
	__u32 pad;
	__u64 ustack[MAX_USTACK_DEPTH];	/* return addresses, innermost first (frame-pointer unwinding) */
};

/* A session started in a process user space has not checked yet: check it, fill app_targets. The same
 * layout with type REC_APP_EXEC: a process exec'd (a new image, its libraries not loaded yet): watch it; and
 * with type REC_APP_PUBLISH: a process created its OTEL_CTX process context (its publisher is loaded): check it now. */
struct rec_app_probe {
	__u32 type;
	__u32 tgid;
};

#define MAX_FUNC_ARGS 6
#define MAX_ARG_DATA 256	/* bytes captured per pointed-to argument (-A) */

/* arg_spec.spec[i]: kind in bits 12..15, bytes to copy in bits 0..11 */
#define ARG_KIND_SHIFT 12
#define ARG_SIZE_MASK 0xfff
enum arg_kind {
	ARG_NONE = 0,	/* no such argument */
	ARG_RAW = 1,	/* register value only (integers, enums, opaque pointers) */
	ARG_PTR = 2,	/* pointer: also copy `size` bytes it points to (structs, unions) */
	ARG_STR = 3,	/* char pointer: copy a NUL-terminated string */
};

struct arg_spec {
	__u16 spec[MAX_FUNC_ARGS];
	__u16 pad[2];
};

/* Arguments of one call, right after its REC_FUNC_ENTRY (same seq). */
struct rec_func_args {
	__u32 type;
	__u32 tid;
	__u32 seq;
	__u16 func_id;
	__u16 depth;
	__u64 args[MAX_FUNC_ARGS];
	__s16 data_len[MAX_FUNC_ARGS];	/* bytes copied, or negative error */
	__u16 pad[2];
	__u8 data[MAX_FUNC_ARGS][MAX_ARG_DATA];
};

/* func_info.flags */
#define FUNC_IS_ENTRY 0x1
#define FUNC_IS_USER 0x2	/* a user-space function (uprobe): no kernel stack at its error */
#define FUNC_RET_KIND_SHIFT 8	/* bits 8..15: ret kind (retsnoop_otel.capture.model.RET_KIND_CODES) */

enum ret_kind {
	RK_VOID = 0,
	RK_BOOL = 1,
	RK_UNSIGNED = 2,
	RK_INT32 = 3,
	RK_SIGNED = 4,
	RK_POINTER = 5,
	RK_UNKNOWN = 6,
	/* user-space functions, by the rule the user gave (no BTF says their types) */
	RK_NEG = 7,	/* any negative int */
	RK_ZERO = 8,	/* int 0 */
	RK_NULL = 9,	/* NULL pointer */
};

struct func_info {
	__u64 ip;
	__u32 flags;
	__u32 pad;
};

struct rec_session_start {
	__u32 type;
	__u32 tid;
	__u32 tgid;
	__u32 cpu;
	__u64 start_ts;
	char comm[TASK_COMM_LEN];
	char proc_comm[TASK_COMM_LEN];
};

/* REC_FUNC_ENTRY and REC_FUNC_EXIT (lat/res are 0 on entry). */
struct rec_func_trace {
	__u32 type;
	__u32 tid;
	__u64 ts;
	__u32 seq;
	__u16 depth;
	__u16 func_id;
	__u64 lat;
	__s64 res;
};

/* The first CALL_BUF_RECS per-call records of a session (mode calls) wait in the kernel until its
 * outcome is known, so that a successful session the sampler drops costs no ring-buffer record; a
 * reported session sends them as one batch (after its REC_SESSION_START), a longer one streams the rest. */
#define CALL_BUF_RECS 64

struct rec_func_batch {
	__u32 type;
	__u32 tid;
	__u64 start_ts;
	__u32 cnt;		/* records filled */
	__u32 pad;
	struct rec_func_trace recs[CALL_BUF_RECS];
};

/* rec_session_end.sampling: how the kernel side kept a session (0: an error session, not sampled) */
#define SAMPLED_PROBABILITY 0x1	/* randomness >= the success (error) threshold (OTel probability sampling) */
#define SAMPLED_RATE 0x2	/* within the rate of its entry function (of its error origin) */

struct rec_session_end {
	__u32 type;
	__u32 tid;
	__u32 tgid;
	__u32 cpu;
	__u64 start_ts;
	__u64 end_ts;
	__u64 cgroup_id;
	__u64 randomness;	/* SAMPLED_PROBABILITY: the 56-bit random value compared with the threshold */
	__u32 last_seq;		/* sequence number the next record would have had */
	__u32 dropped_records;	/* per-call records lost to a full ring buffer */
	__u8 is_err;
	__u8 sampling;
	__u8 pad[2];
	__s32 chain_depth;	/* levels in chain_*: 0 = no chain */
	__s32 chain_top;	/* lowest level whose result is known; levels above are still running */
	__s32 kstack_sz;	/* bytes of kstack filled, or negative error */
	char comm[TASK_COMM_LEN];
	char proc_comm[TASK_COMM_LEN];
	char exe[EXE_NAME_LEN];	/* read as the session ends, while the process still runs ("" for kernel threads) */
	__u16 chain_ids[MAX_FSTACK_DEPTH];
	__s64 chain_res[MAX_FSTACK_DEPTH];
	__u64 chain_lat[MAX_FSTACK_DEPTH];
	__u64 kstack[MAX_KSTACK_DEPTH];
};

struct func_stats {
	__u64 calls;
	__u64 errors;
	__u64 dur_sum_ns;
	__u64 dur_buckets[DUR_BUCKETS];
};

struct err_key {
	__u32 func_id;
	__u32 err;		/* positive errno, 0 = NULL pointer */
};

/* Counts per workload (the metrics workload label): map wl_stats, keyed by the cgroup v2 the
 * session's thread was in when it started. User space names the cgroup (namespace, container). */
#define WL_SESSION 0x80000000	/* wl_key.func_id: whole sessions of this entry function */
struct wl_key {
	__u64 cgroup_id;
	__u32 func_id;		/* a traced function's calls, or (| WL_SESSION) an entry function's sessions */
	__u32 outcome;		/* 0: success; calls: err_key.err + 1 of a failure; sessions: 1 = failed */
};

struct capture_stats {
	__u64 dropped_sessions;		/* sessions map full or SESSION_END record lost */
	__u64 incomplete_sessions;	/* sessions that lost per-call records or had mismatched exits */
	__u64 dropped_records;		/* per-call records lost to a full ring buffer */
	__u64 sessions_started;
	__u64 sessions_reported;
	__u64 workload_dropped;		/* counts not kept per workload: wl_stats full */
	__u64 sampled_out;		/* successful sessions the sampler dropped (in the kernel) */
	__u64 origins_dropped;		/* failing sessions left out of origin_stats (the map was full) */
	__u64 errors_sampled_out;	/* failing sessions the error sampler dropped (counted in origin_stats) */
};

/* Failing sessions by where their error started (map origin_stats): the entry function, the deepest
 * function of the error chain (the stack view's '!' row, rec_session_end.chain_ids[chain_depth - 1]) and
 * the error that function returned. Counted at every failing session's end, reported or not. */
struct origin_key {
	__u32 entry_id;
	__u32 origin_id;
	__u32 err;		/* as err_key.err: positive errno, 0 = NULL pointer */
	__u32 pad;
};

/* An injected probe (-J) fired inside a session: in the per-call record stream (streamed, never held), with a seq
 * of its own between the entries and exits around it (bpf/inject.bpf.h). */
#define MAX_INJECT_DATA 256	/* bytes of payload: a tracepoint's raw entry, or a raw tracepoint's u64 args */

struct rec_inject_probe {
	__u32 type;
	__u32 tid;
	__u64 ts;
	__u32 seq;
	__u16 depth;		/* the level a call made here would have: the innermost open call's + 1 */
	__u16 probe_id;
	__u64 value;		/* kprobe: the probed instruction pointer; kretprobe: the return value */
	__s32 data_len;		/* bytes of data filled, or the read's negative error */
	__u32 pad;
	__u8 data[MAX_INJECT_DATA];
};

/* Filters (maps tgid_filter / comm_filter values). */
#define FILTER_ALLOW 1
#define FILTER_DENY 2

#endif
