"""runtime/heap.py release_free_pages: freed heap memory below live allocations goes back to the kernel."""

from __future__ import annotations

import subprocess
import sys

from retsnoop_otel.runtime.heap import release_free_pages

CHILD = r"""
import sys
from retsnoop_otel.runtime.heap import release_free_pages

def rss_anon_kb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon"))

blocks = [bytes(1000) + bytes([i % 256]) for i in range(40000)]  # glibc's heap, not pymalloc (above 512 bytes)
keep = bytes(1000) + b"k"  # live above them: the freed blocks are not at the heap's top, not trimmed on free
del blocks
before = rss_anon_kb()
released = release_free_pages()
after = rss_anon_kb()
print(released, before, after)
"""


def test_freed_heap_pages_go_back_to_the_kernel() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True).stdout.split()
    released, before, after = out[0] == "True", int(out[1]), int(out[2])
    assert released
    assert before - after > 20_000, (before, after)  # about 40 MB freed, most of it in whole pages


def test_a_c_library_without_malloc_trim_is_no_error() -> None:
    assert release_free_pages("libc-that-is-not-here.so.6") is False
