/* A user-space stand-in for kernel call chains: uprobes on these functions drive the real BPF
 * session logic on hosts where kernel functions cannot be traced (tests/test_native_sessions.py). */
#include <stddef.h>
#include <stdbool.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, used))

static volatile int sink;

NOINLINE int sk_check(int v) { sink += v; return v == 0 ? -22 : 0; }          /* -EINVAL on 0 */
NOINLINE void *sk_alloc(int v) { sink += v; return v > 100 ? NULL : (void *)&sink; }
NOINLINE void sk_log(int v) { sink += v; }                                       /* void, in between */
NOINLINE bool sk_flag(int v) { return v & 1; }
NOINLINE long sk_create(int v)
{
	int err = sk_check(v);

	if (err) {
		sk_log(v);	/* an unrelated void call between the child's error and ours */
		return err;
	}
	if (!sk_alloc(v))
		return -12;	/* -ENOMEM */
	sk_flag(v);
	return 3;	/* a "file descriptor" */
}
NOINLINE long sk_syscall(int v)
{
	long ret = sk_create(v);

	sk_log(1);
	return ret;
}
NOINLINE long sk_recurse(int n) { return n <= 0 ? -7 : sk_recurse(n - 1); }     /* -E2BIG at depth n */
NOINLINE long sk_many(int n)	/* a long session: n calls of sk_flag; fails (-EINVAL) when n is odd */
{
	for (int i = 0; i < n; i++)
		sk_flag(i);
	return n & 1 ? -22 : 0;
}
NOINLINE long sk_wait(int fd)	/* a session in progress until a byte arrives on fd, then sk_create's error */
{
	char c;

	if (read(fd, &c, 1) != 1)
		return -5;
	return sk_create(0);
}
