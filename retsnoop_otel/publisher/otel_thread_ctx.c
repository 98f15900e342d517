/* OpenTelemetry Thread Context (OTEP 4947) and Process Context (OTEP 4719) writer for Python services.
 *
 * Built into libotel_thread_ctx.so with -fvisibility=hidden and the TLSDESC dialect (x86-64
 * -mtls-dialect=gnu2; the default on aarch64), so that `otel_thread_ctx_v1` is an ELF TLS symbol in .dynsym
 * reached through TLSDESC relocations. Only the symbols marked OTEL_EXPORT are exported.
 *
 * Thread context: each thread owns one fixed record (a __thread struct). The first otel_thread_ctx_set() of a
 * thread points otel_thread_ctx_v1 at it; from then on the pointer never changes and updates only toggle
 * `valid` (the OTEP's "fixed record" scheme: the pointer or `valid`, never both). A thread that never set
 * a context has a NULL pointer. Readers look at a thread only while it is stopped (signal-handler
 * semantics), so compiler fences are enough between the steps.
 *
 * Process context: one header in a memfd "OTEL_CTX" mapping (fallback: a shared anonymous mapping named
 * "OTEL_CTX"), MADV_DONTFORK, payload (a serialized opentelemetry.proto.resource.v1.Resource) in a heap copy
 * the header points to. Readers run concurrently, so the steps are ordered with full memory barriers.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define OTEL_EXPORT __attribute__((visibility("default")))

#ifndef PR_SET_VMA
#define PR_SET_VMA 0x53564d41
#define PR_SET_VMA_ANON_NAME 0
#endif
#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif

/* ---- thread context ------------------------------------------------------------------------------ */

#define OTEL_THREAD_CTX_RECORD_SIZE 640 /* the size OTEP 4947 recommends not to exceed */
#define OTEL_THREAD_CTX_HEAD 28
#define OTEL_THREAD_CTX_ATTRS (OTEL_THREAD_CTX_RECORD_SIZE - OTEL_THREAD_CTX_HEAD)

struct __attribute__((packed, aligned(8))) otel_thread_ctx_record {
	uint8_t trace_id[16];
	uint8_t span_id[8];
	uint8_t valid;
	uint8_t trace_flags;
	uint16_t attrs_data_size;
	uint8_t attrs_data[OTEL_THREAD_CTX_ATTRS];
};

_Static_assert(sizeof(struct otel_thread_ctx_record) == OTEL_THREAD_CTX_RECORD_SIZE, "record layout");
_Static_assert(__builtin_offsetof(struct otel_thread_ctx_record, attrs_data) == OTEL_THREAD_CTX_HEAD, "head");

OTEL_EXPORT __thread void *otel_thread_ctx_v1;
static __thread struct otel_thread_ctx_record record;

#define FENCE() __atomic_signal_fence(__ATOMIC_SEQ_CST)

static void set_valid(struct otel_thread_ctx_record *r, uint8_t v)
{
	FENCE();
	*(volatile uint8_t *)&r->valid = v;
	FENCE();
}

/* Bytes of attrs[0..len) that form whole entries (key, length, value) and fit in the record. */
static size_t whole_entries(const uint8_t *attrs, size_t len)
{
	size_t off = 0;

	while (off + 2 <= len) {
		size_t next = off + 2 + attrs[off + 1];

		if (next > len || next > OTEL_THREAD_CTX_ATTRS)
			break;
		off = next;
	}
	return off;
}

/* Publish a context on the calling thread: trace_id[16] and span_id[8] in W3C (big-endian) byte order,
 * the W3C trace flags, and attrs-data entries. Returns how many bytes of attrs were kept (whole entries
 * that fit in the 640-byte record). Only pointers and ints: Python calls it without ctypes argtypes. */
OTEL_EXPORT int otel_thread_ctx_set(const uint8_t *trace_id, const uint8_t *span_id, int trace_flags,
				    const uint8_t *attrs, int attrs_len)
{
	struct otel_thread_ctx_record *r = &record;
	size_t kept = attrs && attrs_len > 0 ? whole_entries(attrs, (size_t)attrs_len) : 0;

	if (otel_thread_ctx_v1 != r) { /* first context of this thread: the record is still zero (invalid) */
		FENCE();
		*(void *volatile *)&otel_thread_ctx_v1 = r;
	}
	set_valid(r, 0);
	memcpy(r->trace_id, trace_id, sizeof(r->trace_id));
	memcpy(r->span_id, span_id, sizeof(r->span_id));
	r->trace_flags = (uint8_t)trace_flags;
	if (kept)
		memcpy(r->attrs_data, attrs, kept);
	r->attrs_data_size = (uint16_t)kept;
	set_valid(r, 1);
	return (int)kept;
}

/* No context on the calling thread: the record turns invalid (a thread that never had one keeps NULL). */
OTEL_EXPORT void otel_thread_ctx_clear(void)
{
	struct otel_thread_ctx_record *r = otel_thread_ctx_v1;

	if (!r)
		return;
	set_valid(r, 0);
	memset(r->trace_id, 0, sizeof(r->trace_id));
	memset(r->span_id, 0, sizeof(r->span_id));
	r->trace_flags = 0;
	r->attrs_data_size = 0;
	FENCE();
}

/* The calling thread's record as a reader finds it (NULL before the thread's first context). */
OTEL_EXPORT void *otel_thread_ctx_current(void)
{
	return otel_thread_ctx_v1;
}

/* Where otel_thread_ctx_v1 lives in the calling thread (dlsym gives no per-thread address for TLS). */
OTEL_EXPORT void **otel_thread_ctx_addr(void)
{
	return &otel_thread_ctx_v1;
}

OTEL_EXPORT size_t otel_thread_ctx_record_size(void)
{
	return sizeof(struct otel_thread_ctx_record);
}

/* ---- process context ----------------------------------------------------------------------------- */

struct __attribute__((packed, aligned(8))) otel_process_ctx_header {
	char signature[8]; /* "OTEL_CTX", written last */
	uint32_t version;  /* 2 */
	uint32_t payload_size;
	uint64_t published_at_ns; /* 0 while an update is in progress */
	const char *payload;
};

static pthread_mutex_t pc_lock = PTHREAD_MUTEX_INITIALIZER;
static struct otel_process_ctx_header *pc_header;
static size_t pc_size;
static pid_t pc_pid; /* MADV_DONTFORK: a forked child has no mapping and publishes anew */
static int pc_memfd; /* the mapping is the memfd's, found by its name /memfd:OTEL_CTX without prctl */
static char *pc_payload;
static uint64_t pc_published_at;

#define BARRIER() __atomic_thread_fence(__ATOMIC_SEQ_CST)

static uint64_t next_timestamp(void)
{
	struct timespec ts;
	uint64_t now = 0;

	if (clock_gettime(CLOCK_REALTIME, &ts) == 0)
		now = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
	if (now <= pc_published_at) /* strictly increasing, never 0: readers compare before and after */
		now = pc_published_at + 1;
	return pc_published_at = now;
}

static int name_mapping(void)
{
	/* fails on kernels without CONFIG_ANON_VMA_NAME and on memfd mappings; still made so that a reader
	 * hooking prctl sees every publication */
	return prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, (unsigned long)pc_header, pc_size, "OTEL_CTX");
}

static int create_mapping(void)
{
	size_t size = (size_t)sysconf(_SC_PAGESIZE);
	void *addr = MAP_FAILED;
	int fd = memfd_create("OTEL_CTX", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL);

	if (fd < 0 && errno == EINVAL) /* kernels before 6.3 know no MFD_NOEXEC_SEAL */
		fd = memfd_create("OTEL_CTX", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd >= 0) {
		if (ftruncate(fd, (off_t)size) == 0)
			addr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
		close(fd);
	}
	pc_memfd = addr != MAP_FAILED;
	if (addr == MAP_FAILED) /* memfd refused (seccomp, old kernel): named shared anonymous memory */
		addr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (addr == MAP_FAILED)
		return -errno;
	if (madvise(addr, size, MADV_DONTFORK) != 0) {
		int err = -errno;

		munmap(addr, size);
		return err;
	}
	pc_header = addr;
	pc_size = size;
	pc_pid = getpid();
	return 0;
}

/* Publish the serialized Resource (first call of this process), or update the published one following
 * OTEP 4719's update protocol. Returns 0 or a negative errno (-ENOTSUP: memfd refused and the kernel cannot
 * name anonymous mappings, so readers would not find it). */
OTEL_EXPORT int otel_process_ctx_publish(const char *payload, uint32_t len)
{
	char *copy = malloc(len ? len : 1);
	char *old;
	int err = 0;

	if (!copy)
		return -ENOMEM;
	memcpy(copy, payload, len);
	pthread_mutex_lock(&pc_lock);
	if (pc_header && pc_pid == getpid()) {
		struct otel_process_ctx_header *h = pc_header;

		*(volatile uint64_t *)&h->published_at_ns = 0;
		BARRIER();
		h->payload = copy;
		h->payload_size = len;
		BARRIER();
		*(volatile uint64_t *)&h->published_at_ns = next_timestamp();
		name_mapping();
	} else {
		pc_header = NULL; /* inherited across fork: the mapping is gone, only the heap copy remains */
		err = create_mapping();
		if (err == 0) {
			struct otel_process_ctx_header *h = pc_header;

			h->version = 2;
			h->payload_size = len;
			h->published_at_ns = next_timestamp();
			h->payload = copy;
			BARRIER();
			memcpy(h->signature, "OTEL_CTX", sizeof(h->signature));
			BARRIER();
			if (name_mapping() != 0 && !pc_memfd) {
				/* no memfd and no name: no reader can find it (OTEP 4719), so it is not published */
				munmap(pc_header, pc_size);
				pc_header = NULL;
				err = -ENOTSUP;
			}
		}
	}
	if (err) {
		old = copy;
	} else {
		old = pc_payload;
		pc_payload = copy;
	}
	pthread_mutex_unlock(&pc_lock);
	free(old);
	return err;
}

/* Where the header is (NULL before the first publication in this process). */
OTEL_EXPORT void *otel_process_ctx_header(void)
{
	void *h;

	pthread_mutex_lock(&pc_lock);
	h = pc_pid == getpid() ? pc_header : NULL;
	pthread_mutex_unlock(&pc_lock);
	return h;
}
