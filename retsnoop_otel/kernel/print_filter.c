// SPDX-License-Identifier: BSD-2-Clause
/*
 * libbpf's print hook with its debug messages dropped in C, before they reach the Python hook
 * (kernel/libbpf.py, through kernel/libbpf_abi.py): one load of our CO-RE object prints 4,699 of
 * them (relocations, map setup), and each call into Python takes the GIL, which a thread importing
 * beside the load holds for up to a switch interval at a time. libbpf itself filters only for its
 * own default hook (LIBBPF_LOG_LEVEL).
 */
#include <stdarg.h>

typedef int (*print_fn)(int level, const char *fmt, va_list args);

/* one per process, as libbpf's hook is */
static print_fn forward;
static int most_verbose;

static int filtered(int level, const char *fmt, va_list args)
{
	return level > most_verbose ? 0 : forward(level, fmt, args);
}

/* the hook for libbpf_set_print(): messages of `level` (enum libbpf_print_level) and more severe reach `fn` */
print_fn pf_install(print_fn fn, int level)
{
	forward = fn;
	most_verbose = level;
	return filtered;
}
