"""Return-value classification and formatting (retsnoop's result column, OTel error.type)."""

from __future__ import annotations

import pytest

from retsnoop_otel.capture.errfilter import ErrorFilter
from retsnoop_otel.capture.errnos import errno_name, parse_errno
from retsnoop_otel.capture.model import RetKind, Session, StackEntry, TracedFunc, error_type, format_result, is_failure

U64 = (1 << 64) - 1


@pytest.mark.parametrize("raw,kind,text,err", [
    (U64 - 21, RetKind.SIGNED, "-EINVAL", "EINVAL"),
    (0xFFFFFFEA, RetKind.INT32, "-EINVAL", "EINVAL"),  # 32-bit int: upper half garbage
    (0x12345678FFFFFFF4, RetKind.INT32, "-ENOMEM", "ENOMEM"),
    (0xFFFFFFEA, RetKind.UNSIGNED, "0xffffffea", None),  # unsigned never fails; big values in hex
    (0, RetKind.POINTER, "NULL", "NULL"),
    (U64 - 11, RetKind.POINTER, "-ENOMEM", "ENOMEM"),  # ERR_PTR(-ENOMEM)
    (0xFFFFC9000031E000, RetKind.POINTER, "0xffffc9000031e000", None),
    (0, RetKind.VOID, "void", None),
    (1, RetKind.BOOL, "true", None),
    (0x100, RetKind.BOOL, "false", None),
    (5, RetKind.SIGNED, "5", None),
    (U64 - 523, RetKind.INT32, "-ENOTSUPP", "ENOTSUPP"),  # kernel-internal errno
    (U64 - 4094, RetKind.SIGNED, "-4095", "E4095"),
    (U64 - 4095, RetKind.SIGNED, "-4096", None),  # below -MAX_ERRNO: a number, not an error
    (1 << 40, RetKind.SIGNED, "0x10000000000", None),
])
def test_result_formatting_and_errors(raw, kind, text, err):
    assert format_result(raw, kind) == text
    assert error_type(raw, kind) == err
    assert is_failure(raw, kind) == (err is not None)


def test_errno_names():
    assert errno_name(22) == "EINVAL" and errno_name(524) == "ENOTSUPP" and errno_name(11) == "EAGAIN"
    assert parse_errno("-E2BIG") == 7 and parse_errno("enomem") == 12
    with pytest.raises(ValueError, match="unknown errno name 'EWHATEVER'"):
        parse_errno("EWHATEVER")


def _session(*results):
    funcs = {0: TracedFunc(0, "__x64_sys_bpf", 0, RetKind.SIGNED, True),
             1: TracedFunc(1, "array_map_alloc", 0, RetKind.POINTER, False)}
    chain = [StackEntry(0, results[0], 10), StackEntry(1, results[1], 5)]
    return Session(1, 1, "a", "a", 0, 10, True, chain, []), funcs


def test_error_filter_allow_and_deny():
    s, funcs = _session(U64 - 11, 0)  # -ENOMEM from a NULL allocation
    assert ErrorFilter.parse([], []).accepts(s, funcs)
    assert ErrorFilter.parse(["ENOMEM"], []).accepts(s, funcs)
    assert ErrorFilter.parse(["NULL"], []).accepts(s, funcs)
    assert not ErrorFilter.parse(["-EINVAL"], []).accepts(s, funcs)
    assert not ErrorFilter.parse([], ["NULL"]).accepts(s, funcs)
    assert not ErrorFilter.parse(["ENOMEM"], ["ENOMEM"]).accepts(s, funcs)  # deny wins
    assert ErrorFilter.parse(["any"], []).accepts(s, funcs)
    with pytest.raises(ValueError, match="-x/--allow-errors: unknown errno name 'EFOO'"):
        ErrorFilter.parse(["EFOO"], [])
