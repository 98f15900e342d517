/* The workload of bench/user_func_cost.py: a chain of four nested user functions against the kernel chain of the
 * same depth, in one binary so that both loops are compiled alike.
 *   user_chain chain N    uc_outer() N times: uc_outer -> uc_mid -> uc_inner -> uc_check, which returns -EINVAL
 *   user_chain inner N    uc_mid() N times: the three inner functions, called outside any session
 *   user_chain syscall N  N failing bpf(BPF_MAP_CREATE) (an array map with an 8-byte key: EINVAL in
 *                         array_map_alloc_check, under __x64_sys_bpf -> __sys_bpf -> map_create)
 * Prints the nanoseconds per call of its own loop (CLOCK_MONOTONIC), nothing else.
 * Built with -fno-optimize-sibling-calls: a tail call would leave a function's frame before its callee returns.
 * Built with frame pointers: every traced function starts with `push %rbp`, which x86 uprobes emulate. With
 * -DUC_LEAF_CHECK (bench/user_func_cost.py --leaf-check) uc_check starts with an instruction they single-step. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

volatile int sink;

#ifndef UC_LEAF_CHECK
/* not traced: it makes uc_check a function that calls another, so that it starts with a `push %rbp` like the
 * others (gcc 12 gives a leaf that uses no stack no frame, -mno-omit-leaf-frame-pointer or not) */
__attribute__((noipa)) int uc_code(void)
{
	return EINVAL;
}

__attribute__((noipa)) int uc_check(int n)
{
	int code = uc_code();

	return n >= 0 ? -code : 0;
}
#else
/* a leaf: its first instruction is a `mov`, which an x86 uprobe single-steps out of line instead of emulating */
__attribute__((noipa)) int uc_check(int n)
{
	return n >= 0 ? -EINVAL : 0;
}
#endif

__attribute__((noipa)) int uc_inner(int n)
{
	int err = uc_check(n + 1);

	return err ? err : n;
}

__attribute__((noipa)) int uc_mid(int n)
{
	int err = uc_inner(n + 1);

	return err ? err : n;
}

__attribute__((noipa)) int uc_outer(int n)
{
	int err = uc_mid(n + 1);

	return err ? err : n;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s chain|inner|syscall N\n", argv[0]);
		return 2;
	}
	const char *what = argv[1];
	long n = atol(argv[2]);
	unsigned int attr[30];
	struct timespec a, b;

	memset(attr, 0, sizeof(attr));
	attr[0] = 2; attr[1] = 8; attr[2] = 4; attr[3] = 1;  /* BPF_MAP_TYPE_ARRAY, key 8: EINVAL */
	clock_gettime(CLOCK_MONOTONIC, &a);
	if (!strcmp(what, "chain")) {
		for (long i = 0; i < n; i++)
			sink = uc_outer((int)i);
	} else if (!strcmp(what, "inner")) {
		for (long i = 0; i < n; i++)
			sink = uc_mid((int)i);
	} else if (!strcmp(what, "syscall")) {
		for (long i = 0; i < n; i++) {
			long fd = syscall(SYS_bpf, 0, attr, sizeof(attr));

			if (fd >= 0)
				close((int)fd);
		}
	} else {
		fprintf(stderr, "unknown workload %s\n", what);
		return 2;
	}
	clock_gettime(CLOCK_MONOTONIC, &b);
	printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
	return 0;
}
