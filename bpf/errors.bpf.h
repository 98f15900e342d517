// SPDX-License-Identifier: GPL-2.0-only
/* retsnoop's error rule, by the return kind user space derived from BTF (func_info.flags): NULL and
 * ERR_PTR pointers, -MAX_ERRNO..-1 for signed integers (32-bit ones sign-extended first), never for
 * void, bool or unsigned. User-space functions add the rules their users give: any negative int, int 0,
 * a NULL pointer (ints read from the low 32 bits: a C int leaves the upper half undefined).
 * Part of retsnoop.bpf.c; capture/model.py is_failure() is the same rule. */

static __always_inline bool can_fail(__u32 flags)
{
	__u32 kind = (flags >> FUNC_RET_KIND_SHIFT) & 0xff;

	return kind != RK_VOID && kind != RK_BOOL && kind != RK_UNSIGNED;
}

static __always_inline bool is_failure(__s64 res, __u32 flags)
{
	switch ((flags >> FUNC_RET_KIND_SHIFT) & 0xff) {
	case RK_VOID:
	case RK_BOOL:
	case RK_UNSIGNED:
		return false;
	case RK_POINTER:
		return res == 0 || (__u64)res >= (__u64)-MAX_ERRNO;
	case RK_INT32:
	case RK_UNKNOWN:
		return (__u32)res >= (__u32)-MAX_ERRNO;
	case RK_NEG:
		return (__s32)res < 0;
	case RK_ZERO:
		return (__u32)res == 0;
	case RK_NULL:
		return res == 0;
	default:
		return (__u64)res >= (__u64)-MAX_ERRNO;
	}
}

static __always_inline __u32 errno_of(__s64 res, __u32 flags)
{
	__u32 kind = (flags >> FUNC_RET_KIND_SHIFT) & 0xff;

	if ((kind == RK_POINTER && res == 0) || kind == RK_ZERO || kind == RK_NULL)
		return 0;
	if (kind == RK_NEG)	/* an errno only inside its range */
		return (__u32)res >= (__u32)-MAX_ERRNO ? -(__s32)res : 0;
	if (kind == RK_INT32 || kind == RK_UNKNOWN)
		return -(__s32)res;
	return -res;
}
