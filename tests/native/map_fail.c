// SPDX-License-Identifier: BSD-2-Clause
/* Fails bpf(BPF_MAP_CREATE) on purpose, the moment a tracer says it is ready: the workload of the readiness
 * scenario (tests/vm/scenarios/agent_ready.py, issue 49). Native, so that it reacts within a millisecond, where a
 * Python workload under emulation takes seconds to start.
 *
 *   map_fail [--wait-port PORT | --wait-file PATH TEXT] KIND COUNT [KIND COUNT]
 *
 * KIND htab: a HASH map with key_size 0 (EINVAL in htab_map_alloc_check); array: an ARRAY map with max_entries 0
 * (EINVAL in array_map_alloc_check); percpu: a PERCPU_ARRAY of 1 MiB values (E2BIG in array_map_alloc_check).
 * It first waits until 127.0.0.1:PORT accepts a connection or PATH holds TEXT, then makes the first COUNT calls
 * itself; a second KIND COUNT is made by a child it forks and execs (a process
 * born after the tracer was ready). Each call prints "call KIND RESULT ERRNO PID". */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/bpf.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void pause_ms(void)
{
	struct timespec ts = {0, 1000000};

	nanosleep(&ts, NULL);
}

static void wait_port(int port)
{
	struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};

	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	for (;;) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		int ok = fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0;

		if (fd >= 0)
			close(fd);
		if (ok)
			return;
		pause_ms();
	}
}

static int file_has(const char *path, const char *text)
{
	static char buf[1 << 20];
	FILE *f = fopen(path, "r");
	size_t n;

	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	return strstr(buf, text) != NULL;
}

static void fail_maps(const char *kind, int count)
{
	union bpf_attr attr;

	memset(&attr, 0, sizeof(attr));
	if (strcmp(kind, "htab") == 0) {
		attr.map_type = BPF_MAP_TYPE_HASH;
		attr.key_size = 0;
		attr.value_size = 8;
		attr.max_entries = 16;
	} else if (strcmp(kind, "percpu") == 0) {	/* E2BIG in array_map_alloc_check: values over 32 KiB */
		attr.map_type = BPF_MAP_TYPE_PERCPU_ARRAY;
		attr.key_size = 4;
		attr.value_size = 1 << 20;
		attr.max_entries = 1024;
	} else {
		attr.map_type = BPF_MAP_TYPE_ARRAY;
		attr.key_size = 4;
		attr.value_size = 8;
		attr.max_entries = 0;
	}
	for (int i = 0; i < count; i++) {
		long r = syscall(__NR_bpf, BPF_MAP_CREATE, &attr, sizeof(attr));

		printf("call %s %ld %d %d\n", kind, r, r < 0 ? errno : 0, getpid());
	}
	fflush(stdout);
}

int main(int argc, char **argv)
{
	int i = 1;

	if (i + 1 < argc && strcmp(argv[i], "--wait-port") == 0) {
		wait_port(atoi(argv[i + 1]));
		i += 2;
	} else if (i + 2 < argc && strcmp(argv[i], "--wait-file") == 0) {
		while (!file_has(argv[i + 1], argv[i + 2]))
			pause_ms();
		i += 3;
	}
	if (i + 1 >= argc) {
		fprintf(stderr, "usage: map_fail [--wait-port PORT | --wait-file PATH TEXT] KIND COUNT [KIND COUNT]\n");
		return 2;
	}
	printf("ready pid %d\n", getpid());
	fail_maps(argv[i], atoi(argv[i + 1]));
	if (i + 3 < argc) {
		pid_t child = fork();
		int status = 0;

		if (child == 0) {
			execl("/proc/self/exe", argv[0], argv[i + 2], argv[i + 3], (char *)NULL);
			_exit(127);
		}
		waitpid(child, &status, 0);
		return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
	}
	return 0;
}
