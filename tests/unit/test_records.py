"""The Python mirror of bpf/retsnoop.h against the sizes the BPF side asserts at compile time and the
header's constants."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from retsnoop_otel.capture import records
from retsnoop_otel.capture.model import RET_KIND_CODES, RetKind
from retsnoop_otel.capture.records import FuncTraceRec, SessionEndRec, SessionStartRec, decode

ROOT = Path(__file__).resolve().parents[2]


def _asserted_sizes() -> dict[str, int]:
    src = (ROOT / "bpf" / "retsnoop.bpf.c").read_text()
    return {m.group(1): int(m.group(2)) for m in
            re.finditer(r"_Static_assert\(sizeof\(struct (\w+)\) == (\d+)", src)}


@pytest.mark.parametrize("name,fmt", [
    ("rec_session_start", records.SESSION_START), ("rec_func_trace", records.FUNC_TRACE),
    ("rec_session_end", records.SESSION_END), ("func_stats", records.FUNC_STATS),
    ("capture_stats", records.CAPTURE_STATS), ("func_info", records.FUNC_INFO), ("arg_spec", records.ARG_SPEC),
    ("wl_key", records.WL_KEY)])
def test_struct_sizes_match_the_bpf_side(name, fmt):
    assert _asserted_sizes()[name] == fmt.size


def test_lbr_record_size_matches_the_bpf_side():
    sizes = _asserted_sizes()
    assert sizes["rec_session_lbr"] == records.SESSION_LBR_SIZE == 800
    assert sizes["lbr_capture"] == records.LBR_CAPTURE_SIZE


def test_header_constants_match():
    """Every records.py constant named like a #define or enum value of the header has its value."""
    hdr = (ROOT / "bpf" / "retsnoop.h").read_text()
    consts = {k: int(v, 0) for k, v in re.findall(r"#define (\w+)\s+(0x[0-9a-f]+|\d+)", hdr)}
    consts.update({k: int(v) for k, v in re.findall(r"^\s*(\w+) = (\d+),", hdr, re.M)})
    mirrored = {k: v for k, v in vars(records).items() if k in consts}
    assert mirrored == {k: consts[k] for k in mirrored}
    assert {"MAX_FSTACK_DEPTH", "MAX_KSTACK_DEPTH", "DUR_BUCKETS", "FUNC_RET_KIND_SHIFT", "REC_SESSION_LBR",
            "MAX_LBR_ENTRIES", "ARG_KIND_SHIFT", "ARG_STR", "FUNC_IS_ENTRY"} <= set(mirrored)
    kinds = dict(re.findall(r"RK_(\w+) = (\d+)", hdr))
    assert {RetKind[k]: int(v) for k, v in kinds.items()} == RET_KIND_CODES


def test_decode_func_trace_and_start():
    raw = records.FUNC_TRACE.pack(records.REC_FUNC_EXIT, 42, 1000, 7, 2, 5, 30, -22)
    assert decode(raw) == FuncTraceRec(True, 42, 1000, 7, 2, 5, 30, -22)
    raw = records.SESSION_START.pack(records.REC_SESSION_START, 1, 2, 3, 99, b"simfail\0", b"simfail")
    assert decode(raw) == SessionStartRec(1, 2, 3, 99, "simfail", "simfail")


def test_decode_session_end_trims_kstack():
    m = records.MAX_FSTACK_DEPTH
    ids = [3, 1] + [0] * (m - 2)
    res = [-22, -22] + [0] * (m - 2)
    lat = [500, 20] + [0] * (m - 2)
    kstack = [0xffffffff81000010, 0xffffffff81000020] + [0] * (records.MAX_KSTACK_DEPTH - 2)
    raw = records.SESSION_END.pack(records.REC_SESSION_END, 10, 11, 1, 100, 600, 77, 0, 9, 0, 1, 0, 2, 0, 16,
                                   b"a", b"b", b"python3.11", *ids, *res, *lat, *kstack)
    rec = decode(raw)
    assert rec.proc_comm == "b" and rec.exe == "python3.11"  # the exe name is not cut at 15 characters
    assert isinstance(rec, SessionEndRec)
    assert rec.is_err and rec.chain_depth == 2 and rec.chain_top == 0 and rec.sampling == 0
    assert rec.kstack == (0xffffffff81000010, 0xffffffff81000020)
    assert rec.chain_ids[:2] == (3, 1) and rec.chain_res[:2] == (-22, -22)


def test_func_batch_size_and_decode():
    """The per-call records a session held in the kernel: as many as `cnt` says, each a FUNC_TRACE record."""
    assert _asserted_sizes()["rec_func_batch"] == records.FUNC_BATCH_SIZE
    recs = [records.FUNC_TRACE.pack(records.REC_FUNC_ENTRY, 42, 1000, 0, 0, 5, 0, 0),
            records.FUNC_TRACE.pack(records.REC_FUNC_EXIT, 42, 1500, 1, 0, 5, 500, -22)]
    raw = records.FUNC_BATCH_HEAD.pack(records.REC_FUNC_BATCH, 42, 999, 2) + b"".join(recs)
    rec = decode(raw)
    assert rec == records.FuncBatchRec(42, 999, (FuncTraceRec(False, 42, 1000, 0, 0, 5, 0, 0),
                                                 FuncTraceRec(True, 42, 1500, 1, 0, 5, 500, -22)))


def test_session_end_carries_the_kernel_sampling_decision():
    m, k = records.MAX_FSTACK_DEPTH, records.MAX_KSTACK_DEPTH
    raw = records.SESSION_END.pack(records.REC_SESSION_END, 10, 11, 1, 100, 600, 77, 0xD0_1234_5678_9ABC, 9, 0, 0,
                                   records.SAMPLED_PROBABILITY, 1, 0, 0, b"a", b"b", b"", *([0] * (3 * m + k)))
    rec = decode(raw)
    assert not rec.is_err and rec.sampling == records.SAMPLED_PROBABILITY and rec.randomness == 0xD0_1234_5678_9ABC


def test_func_args_size_and_decode():
    assert _asserted_sizes()["rec_func_args"] == records.FUNC_ARGS_SIZE
    head = records.FUNC_ARGS_HEAD.pack(records.REC_FUNC_ARGS, 5, 9, 2, 1, 0xffff8880, 7, 0, 0, 0, 0,
                                       8, 0, -14, 0, 0, 0)
    data = bytearray(records.MAX_FUNC_ARGS * records.MAX_ARG_DATA)
    data[0:8] = b"\x02\0\0\0\x04\0\0\0"
    rec = decode(head + bytes(data))
    assert rec.seq == 9 and rec.func_id == 2 and rec.args[:2] == (0xffff8880, 7)
    assert rec.data[0] == b"\x02\0\0\0\x04\0\0\0" and rec.data[1] is None and rec.data[2] is None


def test_unknown_record_type():
    with pytest.raises(ValueError):
        decode(struct.pack("<I", 99) + b"\0" * 60)


def test_per_cpu_sums():
    one = records.FUNC_STATS.pack(2, 1, 300, *([1] + [0] * (records.DUR_BUCKETS - 1)))
    two = records.FUNC_STATS.pack(3, 0, 700, *([0, 2] + [0] * (records.DUR_BUCKETS - 2)))
    calls, errors, dur, buckets = records.decode_func_stats(one + two, 2)
    assert (calls, errors, dur, buckets[:2]) == (5, 1, 1000, [1, 2])
    cs = records.decode_capture_stats(records.CAPTURE_STATS.pack(1, 2, 3, 4, 5, 6, 7, 8, 9) * 2, 2)
    assert (cs.dropped_sessions, cs.incomplete_sessions, cs.dropped_records, cs.sessions_started,
            cs.sessions_reported, cs.workload_dropped, cs.sampled_out, cs.origins_dropped, cs.errors_sampled_out) == \
        (2, 4, 6, 8, 10, 12, 14, 16, 18)


def app_record(tid=7, start_ts=100, status=records.APP_OK, err=0, size=5, attrs=b"\x00\x03abc", valid=1, flags=1):
    trace_id, span_id = bytes(range(1, 17)), bytes(range(17, 25))
    head = records.SESSION_APP_HEAD.pack(records.REC_SESSION_APP, tid, start_ts, status, err, trace_id, span_id,
                                         valid, flags, size)
    return head + attrs.ljust(records.MAX_APP_ATTRS, b"\xee")


def test_application_records_match_the_bpf_side():
    sizes = _asserted_sizes()
    assert sizes["rec_session_app"] == records.SESSION_APP_SIZE
    assert sizes["app_ctx"] == records.SESSION_APP_SIZE - 24 == records.APP_CTX_HEAD + records.MAX_APP_ATTRS
    assert sizes["rec_session_ustack"] == records.SESSION_USTACK.size
    assert sizes["rec_app_probe"] == records.APP_PROBE.size and sizes["app_tls"] == records.APP_TLS.size
    assert {"REC_SESSION_APP", "MAX_APP_ATTRS", "APP_CTX_HEAD", "APP_TLS_NONE", "MAX_USTACK_DEPTH", "APP_FAULT",
            "REC_APP_EXEC", "REC_APP_PUBLISH"} \
        <= {k for k in vars(records) if k.isupper()}


def test_decode_application_context():
    rec = decode(app_record())
    assert isinstance(rec, records.SessionAppRec)
    assert (rec.tid, rec.start_ts, rec.status, rec.trace_id[0], rec.span_id[-1], rec.attrs) == \
        (7, 100, records.APP_OK, 1, 24, b"\x00\x03abc")
    # a size beyond what the kernel side keeps: the kept bytes, and the size as the record said
    rec = decode(app_record(size=5000, attrs=b"x" * records.MAX_APP_ATTRS))
    assert rec.attrs_size == 5000 and len(rec.attrs) == records.MAX_APP_ATTRS
    rec = decode(app_record(status=records.APP_FAULT, err=-14))
    assert rec.status == records.APP_FAULT and rec.error == 14 and rec.attrs == b""
    with pytest.raises(ValueError, match="short application context"):
        decode(app_record()[:100])


def test_decode_user_stack_and_probe():
    ips = [0x401136, 0x7F0000001234] + [0] * (records.MAX_USTACK_DEPTH - 2)
    rec = decode(records.SESSION_USTACK.pack(records.REC_SESSION_USTACK, 7, 100, 16, *ips))
    assert rec == records.SessionUstackRec(7, 100, 0, (0x401136, 0x7F0000001234))
    rec = decode(records.SESSION_USTACK.pack(records.REC_SESSION_USTACK, 7, 100, -14, *([0] * 64)))
    assert rec.error == 14 and rec.ips == ()
    assert decode(records.APP_PROBE.pack(records.REC_APP_PROBE, 4321)) == records.AppProbeRec(4321)
    exec_rec = decode(records.APP_PROBE.pack(records.REC_APP_EXEC, 4321))
    assert exec_rec == records.AppExecRec(4321) and type(exec_rec) is records.AppExecRec
    pub = decode(records.APP_PROBE.pack(records.REC_APP_PUBLISH, 4321))
    assert pub == records.AppPublishRec(4321) and type(pub) is records.AppPublishRec
