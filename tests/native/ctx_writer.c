/* A program that publishes OpenTelemetry thread context (OTEP 4947) the way native SDKs do, then makes a
 * failing call on every thread, round after round: the writer side of the thread-context tests.
 *
 *   ctx_writer MODE THREADS CALL [ROUNDS]
 *   MODE     valid | unsampled | invalid (valid = 0) | null (no record) | bigsize (attrs-data-size 0xffff)
 *            | badptr (the pointer names unmapped memory) | pagedout (the record's page is not present
 *            when the call is made: a shared mapping whose page table entry is dropped before each round)
 *   THREADS  threads making the call, each with its own trace id (…01, …02) and span id
 *   CALL     bpf: bpf(BPF_MAP_CREATE) of an array map with max_entries 0 (-EINVAL, in the kernel);
 *            sim: sk_syscall(0) of libsimkern.so (-EINVAL, a user function for uprobes); with
 *            SIM_FAIL_EVERY=N only every Nth round fails, the others succeed (sessions not reported)
 *   ROUNDS   0 (default): a round per line read on stdin ("go"), until EOF; N: N rounds, 50 ms apart
 *
 * Where the variable lives is chosen at build time, the cases a reader must handle:
 *   default              in the executable, exported with -rdynamic (static TLS, below the thread pointer)
 *   -DCTX_LIB            in libctxlib.so, linked at start (built with -mtls-dialect=gnu2: TLSDESC)
 * Every round prints "round N tid=T trace=HEX span=HEX ret=R" per thread, so tests know which thread held which ids.
 * Functions are kept out of line (and frame pointers on) for the user-stack tests.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

struct __attribute__((packed)) record {
	uint8_t trace_id[16];
	uint8_t span_id[8];
	uint8_t valid;
	uint8_t trace_flags;
	uint16_t attrs_data_size;
	uint8_t attrs_data[64];
};

#ifdef CTX_LIB
void ctx_set(void *rec);	/* libctxlib.so */
#else
__attribute__((visibility("default"))) __thread void *otel_thread_ctx_v1;
static void ctx_set(void *rec) { otel_thread_ctx_v1 = rec; }
#endif

static const char *mode, *call;
static int nthreads, rounds;
static pthread_barrier_t start_round, end_round;
static volatile int stop;
static long (*sk_syscall)(int);

struct bpf_map_create_attr {
	uint32_t map_type, key_size, value_size, max_entries, map_flags;
};

static int fail_every = 1;	/* SIM_FAIL_EVERY=N: only every Nth sim call fails (the others return 3) */

NOINLINE static long make_failing_call(int round)
{
	if (!strcmp(call, "sim"))
		return sk_syscall(round % fail_every ? 5 : 0);
	struct bpf_map_create_attr attr = {2 /* BPF_MAP_TYPE_ARRAY */, 4, 4, 0, 0};
	return syscall(SYS_bpf, 0 /* BPF_MAP_CREATE */, &attr, sizeof(attr));
}

NOINLINE static long handle_request(int round)
{
	long ret = make_failing_call(round);

	__asm__ volatile("" ::: "memory");	/* not a tail call: this frame stays on the stack */
	return ret;
}

static void fill(struct record *r, int idx)
{
	memset(r, 0, sizeof(*r));
	for (int i = 0; i < 16; i++)
		r->trace_id[i] = 0x10 + i;
	r->trace_id[15] = (uint8_t)idx;
	for (int i = 0; i < 8; i++)
		r->span_id[i] = 0xa0 + i;
	r->span_id[7] = (uint8_t)idx;
	r->trace_flags = strcmp(mode, "unsampled") ? 1 : 0;
	/* attributes: key index 0 ("http.route" in the process context's key map, when one is published) */
	static const char route[] = "/users/:id";
	r->attrs_data[0] = 0;
	r->attrs_data[1] = sizeof(route) - 1;
	memcpy(r->attrs_data + 2, route, sizeof(route) - 1);
	r->attrs_data_size = 2 + sizeof(route) - 1;
	if (!strcmp(mode, "bigsize"))
		r->attrs_data_size = 0xffff;	/* corrupt: more than the record holds */
	r->valid = strcmp(mode, "invalid") ? 1 : 0;
}

static void *worker(void *arg)
{
	int idx = (int)(intptr_t)arg;
	struct record *r = calloc(1, sizeof(*r) + 1024);	/* room past the 64 bytes: bigsize reads stay mapped */
	long page = sysconf(_SC_PAGESIZE);

	if (!strcmp(mode, "pagedout")) {
		int fd = memfd_create("ctx_record", 0);

		if (fd < 0 || ftruncate(fd, page) || (r = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0))
		    == MAP_FAILED) {
			perror("ctx_writer: record mapping");
			exit(1);
		}
	}
	fill(r, idx);
	if (!strcmp(mode, "badptr"))
		ctx_set((void *)0x1000);	/* never mapped: below vm.mmap_min_addr */
	else if (strcmp(mode, "null"))
		ctx_set(r);
	for (int round = 1;; round++) {
		pthread_barrier_wait(&start_round);
		if (stop)
			break;
		if (!strcmp(mode, "pagedout"))
			madvise(r, page, MADV_DONTNEED);	/* the data stays in the memfd; the mapping faults */
		long ret = handle_request(round);
		char ids[49];
		if (!strcmp(mode, "pagedout"))
			madvise(r, page, MADV_DONTNEED);
		for (int i = 0; i < 24; i++)
			sprintf(ids + 2 * i, "%02x", i < 16 ? r->trace_id[i] : r->span_id[i - 16]);
		printf("round %d tid=%ld trace=%.32s span=%.16s ret=%ld\n", round, (long)gettid(), ids, ids + 32, ret);
		fflush(stdout);
		pthread_barrier_wait(&end_round);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: %s valid|unsampled|invalid|null|bigsize|badptr|pagedout THREADS bpf|sim [ROUNDS]\n",
			argv[0]);
		return 2;
	}
	mode = argv[1];
	nthreads = atoi(argv[2]);
	call = argv[3];
	rounds = argc > 4 ? atoi(argv[4]) : 0;
	if (!strcmp(call, "sim")) {
		const char *lib = getenv("SIMKERN"), *every = getenv("SIM_FAIL_EVERY");

		if (every && atoi(every) > 0)
			fail_every = atoi(every);
		void *h = dlopen(lib ? lib : "libsimkern.so", RTLD_NOW);

		sk_syscall = h ? (long (*)(int))dlsym(h, "sk_syscall") : NULL;
		if (!sk_syscall) {
			fprintf(stderr, "ctx_writer: %s\n", dlerror());
			return 1;
		}
	}
	pthread_barrier_init(&start_round, NULL, nthreads + 1);
	pthread_barrier_init(&end_round, NULL, nthreads + 1);
	pthread_t *t = calloc(nthreads, sizeof(*t));
	for (int i = 0; i < nthreads; i++)
		pthread_create(&t[i], NULL, worker, (void *)(intptr_t)(i + 1));
	printf("ready pid=%d\n", getpid());
	fflush(stdout);
	char line[64];
	for (int round = 1; rounds ? round <= rounds : fgets(line, sizeof(line), stdin) != NULL; round++) {
		if (rounds)
			usleep(50000);
		pthread_barrier_wait(&start_round);
		pthread_barrier_wait(&end_round);
		printf("done %d\n", round);
		fflush(stdout);
	}
	stop = 1;
	pthread_barrier_wait(&start_round);
	for (int i = 0; i < nthreads; i++)
		pthread_join(t[i], NULL);
	return 0;
}
