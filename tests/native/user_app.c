/* An application whose request handler calls a failing syscall (issue 35): handle_request() checks its input
 * in parse_request(), then asks the kernel for an array map with no key size, which the kernel refuses with
 * EINVAL deep in map_create(); the handler returns -errno. The user-function tests trace this one tree across
 * the boundary: handle_request, the syscall and the kernel chain with the error.
 *   user_app ROUNDS [DELAY_MS]: one request per round, "request N -> RET" on stdout each. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/bpf.h>

__attribute__((noipa)) int parse_request(int n)
{
	return n >= 0 ? 0 : -EINVAL;
}

__attribute__((noipa)) void *find_handler(int n)
{
	return n > 0 ? (void *)&parse_request : NULL;
}

__attribute__((noipa)) int handle_request(int n)
{
	union bpf_attr attr;
	int err = parse_request(n);

	if (err)
		return err;
	if (!find_handler(n))
		return -ENOENT;
	memset(&attr, 0, sizeof(attr));
	attr.map_type = BPF_MAP_TYPE_ARRAY;
	if (syscall(SYS_bpf, BPF_MAP_CREATE, &attr, sizeof(attr)) < 0)
		return -errno;
	return 0;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 1;
	int delay_ms = argc > 2 ? atoi(argv[2]) : 100;

	for (int i = 1; i <= rounds; i++) {
		printf("request %d -> %d\n", i, handle_request(i));
		fflush(stdout);
		usleep(delay_ms * 1000);
	}
	return 0;
}
