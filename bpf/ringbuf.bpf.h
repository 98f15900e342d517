// SPDX-License-Identifier: GPL-2.0-only
/* The ring buffer every record goes through, and when a record wakes the reader.
 * Included by retsnoop.bpf.c after its configuration (rb_bytes). */

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 * 1024 * 1024);
} rb SEC(".maps");

/* uapi values for bpf_ringbuf_query() and bpf_ringbuf_submit() (not in the minimal vmlinux header) */
#define RB_AVAIL_DATA 0
#define RB_NO_WAKEUP 1
#define RB_FORCE_WAKEUP 2

/* Submit flags: the reader is woken once a batch waits, by the record that makes the unread data cross
 * a multiple of 1/16 of the ring buffer (so a crossing missed in a race between CPUs is made up at the
 * next one). A wakeup per record costs the traced thread an irq_work and the reader a wakeup per
 * session; below the first mark, user space reads the records when its wait times out
 * (runtime.POLL_MS). Forcing a wakeup on every record past the mark until the reader ran cost each
 * record an irq_work again (exit 2.3x per run on real hardware, bench/native_cost.py).
 * `before`: unread bytes without this record (bpf_ringbuf_query() before reserving it). */
static __always_inline __u64 rb_used(__u64 size)
{
	return (size + 8 + 7) & ~7ULL;	/* what a record takes: an 8-byte header, 8-byte aligned */
}

static __always_inline __u64 rb_wakeup_at(__u64 before, __u64 size)
{
	__u64 mark = rb_bytes / 16;

	return before / mark != (before + rb_used(size)) / mark ? RB_FORCE_WAKEUP : RB_NO_WAKEUP;
}

/* the same for a record already reserved (counted in what the query returns) */
static __always_inline __u64 rb_wakeup(__u64 size)
{
	__u64 after = bpf_ringbuf_query(&rb, RB_AVAIL_DATA);

	return rb_wakeup_at(after > rb_used(size) ? after - rb_used(size) : 0, size);
}
