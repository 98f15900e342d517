"""The syscall-heavy loop the syscall preset's benches run (bench/syscalls_preset_cost.py and
bench/syscalls_preset_variants.py): seven of the cheapest syscalls per round, timed by itself."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench.harness import build_workload

WORKLOAD_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    long n = atol(argv[1]), fail_every = atol(argv[2]);
    char buf[64];
    struct stat st;
    int out = open("/dev/null", O_WRONLY);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        getpid();
        int fd = open("/dev/zero", O_RDONLY);
        if (read(fd, buf, sizeof(buf)) < 0) return 1;
        fstat(fd, &st);
        close(fd);
        if (write(out, buf, sizeof(buf)) < 0) return 1;
        if (fail_every && i % fail_every == 0) stat("/nonexistent/syscalls_preset_cost", &st);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.6f\n", (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9);
    return 0;
}
"""

WORKLOAD_PY = r"""
import os, sys, time
n, fail_every = int(sys.argv[1]), int(sys.argv[2])
out = os.open("/dev/null", os.O_WRONLY)
t0 = time.monotonic()
for i in range(n):
    os.getpid()
    fd = os.open("/dev/zero", os.O_RDONLY)
    buf = os.read(fd, 64)
    os.fstat(fd)
    os.close(fd)
    os.write(out, buf)
    if fail_every and i % fail_every == 0:
        try:
            os.stat("/nonexistent/syscalls_preset_cost")
        except OSError:
            pass
print(f"{time.monotonic() - t0:.6f}")
"""


def build(tmp: Path) -> list[str]:
    return build_workload(tmp, "syscall_loop", WORKLOAD_C, WORKLOAD_PY)


def workload_s(cmd: list[str], iterations: int, fail_every: int) -> float:
    out = subprocess.run([*cmd, str(iterations), str(fail_every)], capture_output=True, text=True, check=True,
                         timeout=3600).stdout
    return float(out.strip().splitlines()[-1])
