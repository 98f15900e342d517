"""Bad input through the installed command, as a user types it: flags, environment and config files, fuzzed.

Every run is `retsnoop-otel ...` as a subprocess (tests/command_runs.py), two at a time, in a user namespace of
its own: it holds no capability over the kernel, whatever the host allows. So an input is either refused as
bad input (exit 2, before any host fact is read) or valid, and then it ends in the refusal of kernel tracing
(exit 1, that one line: no privileges, or a kernel without kprobes and fentry; `agent --check` skips it instead,
says so on stdout and exits 0): whatever reaches that check has passed validation, and nothing is ever attached.
An OTEL_* variable is not the tool's own input: a value it cannot
use is one warning line before that (each variable at most once, naming it) and ignored ("warned" in the corpus).
Every run must also end within TIMEOUT_S, stay under MAX_RSS_MB, write one line (besides those warnings) of at most
MAX_LINE characters to stderr and nothing to stdout, never a traceback, never a secret it was given.

The corpus (tests/fixtures/fuzz_corpus.jsonl) holds the reproducers of every class found so far; hypothesis
adds generated cases around a valid base (each mutation of a flag, a variable or a config key), deterministic
in `make test` (FUZZ_RANDOM=1 explores with fresh seeds, FUZZ_EXAMPLES=N sets the pairs per test).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retsnoop_otel.trace.flags import build_parser
from tests.command_runs import TIMEOUT_S, TRACING_REFUSED, Case, Outcome, config_paths, load_corpus, run_case

MAX_RSS_MB = 200
MAX_LINE = 400
# exit 1 for valid input: besides tracing, what the host may refuse (no LBR here, a port another process holds)
HOST_REFUSALS = (*TRACING_REFUSED, "--lbr needs last branch records", "the address is already in use")
PAIRS = int(os.environ.get("FUZZ_EXAMPLES", "75"))
WARNING = re.compile(r"retsnoop-otel(?: agent)?: warning: (OTEL_[A-Z_]+)[=:]")
FUZZ = settings(max_examples=PAIRS, deadline=None, derandomize=not os.environ.get("FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], database=None)


OUTPUT_FAILED = "retsnoop-otel: cannot write to stdout: "  # the one line of a stdout that is full (expect "full")
EXPECTED_CODE = {"refused": 2, "pipe": 141, "full": 1}


def output_problems(case: Case, out: Outcome) -> list[str]:
    """A run whose stdout's reader left ("pipe": 141, nothing said) or whose stdout is full ("full": exit 1, one
    line): no traceback, the code; with stderr itself full, only the code can be seen."""
    found = []
    want = EXPECTED_CODE.get(case.expect, 1)
    if out.code != want:
        found.append(f"exit {out.code}, not {want}")
    if "Traceback" in out.stderr or "Exception ignored" in out.stderr:
        found.append("a traceback")
    if case.stderr == "full":
        return found
    lines = [line for line in out.stderr.splitlines() if not WARNING.match(line)]
    if case.expect == "pipe" and lines:
        found.append(f"said something about a reader that left: {lines[:2]!r}")
    if case.expect == "full" and not (len(lines) == 1 and lines[0].startswith(OUTPUT_FAILED)):
        found.append(f"not one line on the full stdout: {lines[:3]!r}")
    return found


def problems(case: Case, out: Outcome) -> list[str]:
    """What is wrong with one run; [] when it behaved."""
    if out.code is None:
        return [f"no exit within {TIMEOUT_S:g} s (killed)"]
    if case.expect in ("pipe", "full") or case.stderr == "full":
        return output_problems(case, out)
    found = []
    text = out.stdout + out.stderr
    warned = [(m.group(1), line) for line in out.stderr.splitlines() if (m := WARNING.match(line))]
    lines = [line for line in out.stderr.splitlines() if not WARNING.match(line)]
    names = [var for var, _ in warned]
    if len(set(names)) != len(names):
        found.append(f"a variable warned about twice: {names}")
    if any(var not in case.env for var in names):
        found.append(f"a warning about a variable not set: {names}")
    if any(len(line) > MAX_LINE for _, line in warned):
        found.append(f"a warning longer than {MAX_LINE} characters")
    if "Traceback" in text:
        found.append("a traceback")
    if out.max_rss_mb > MAX_RSS_MB:
        found.append(f"{out.max_rss_mb:.0f} MB of memory")
    if case.secret and case.secret in text:
        found.append("echoed the secret")
    checked = "--check" in case.argv and out.code == 0  # agent --check: the kernel's checks skipped, exit 0
    if checked:
        if not (lines == [] and "kernel checks skipped (" in out.stdout and "configuration is valid" in out.stdout):
            found.append(f"--check passed without saying what it skipped: {out.stdout[-300:]!r}")
    elif out.stdout.strip():
        found.append(f"wrote to stdout: {out.stdout[:200]!r}")
    elif len(lines) != 1:
        found.append(f"{len(lines)} lines on stderr")
    elif len(lines[0]) > MAX_LINE:
        found.append(f"a {len(lines[0])}-character line")
    host = checked or (out.code == 1 and len(lines) == 1 and any(r in lines[0] for r in HOST_REFUSALS))
    if case.expect == "refused" and out.code != 2:
        found.append(f"exit {out.code}, not 2 (bad input)")
    elif case.expect in ("valid", "warned") and not (checked or (host and any(r in lines[0] for r in TRACING_REFUSED))):
        found.append(f"exit {out.code}: did not reach this host's kernel refusal")
    if case.expect == "valid" and warned:
        found.append(f"warned about valid input: {warned[0][1][:200]!r}")
    elif case.expect == "warned" and not warned:
        found.append("no warning about the variable it cannot use")
    elif case.expect == "either" and not (out.code == 2 or host):
        found.append(f"exit {out.code}: neither refused as input (2) nor at the kernel check (1)")
    return found


def run_all(cases: list[Case]) -> list[str]:
    """Runs the cases two at a time; one report line per misbehaving case."""
    def one(case: Case) -> str:
        with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
            out = run_case(case, Path(tmp), TIMEOUT_S)
        found = problems(case, out)
        return "" if not found else (f"{'; '.join(found)} -- {case.why or 'generated'}: {case.show()[:600]} "
                                     f"-> stderr {out.stderr[:300]!r}")
    with ThreadPoolExecutor(max_workers=2) as pool:
        return [r for r in pool.map(one, cases) if r]


def test_corpus() -> None:
    cases = load_corpus()
    assert len(cases) >= 100 and {c.expect for c in cases} == {"refused", "valid", "warned", "pipe", "full"}
    bad = run_all(cases)
    assert not bad, f"{len(bad)} of {len(cases)} corpus cases misbehaved:\n" + "\n".join(bad)


# ---- generated cases: a valid base, mutated ----

TRACE_BASE = ("trace", "-e", "*sys_bpf")
VALID_FLAGS = [("-a", "bpf_check"), ("-d", "map_create"), ("-x", "EINVAL"), ("-X", "ENOENT"), ("-L", "5"), ("-S",),
               ("-T",), ("-E",), ("-K",), ("-F",), ("-M",), ("--json",), ("-A",), ("-n", "bash"), ("-N", "sshd"),
               ("-p", "1"), ("-P", "2"), ("--otlp-endpoint", "http://127.0.0.1:4317"),
               ("--otlp-protocol", "http/protobuf"), ("--export-addresses",), ("-C", "bpf.ringbuf-size=1M"),
               ("--probe-set", "mine"), ("-v",), ("-sn",), ("--no-app-context",)]
SKIPPED = {"-h", "--help", "-V", "--version", "--dry-run", "--config-help"}  # they end before the kernel check, exit 0
FLAGS = sorted({o for d in build_parser().declared for o in d.action.option_strings} - SKIPPED)
WORDS = ["*sys_bpf", "array_map_*", ":kernel/bpf/*.c", "f [mod]", "f [mod", "[", "", "-ENOMEM", "EINVAL", "any",
         "0", "-1", "65536", "99999999999999999999", "1e400", "nan", "inf", "-inf", "http://127.0.0.1:4317",
         "ftp://x", "http://[::1", "http://:0", "localhost:4317", "grpc", "http/json", "bpf.ringbuf-size=8M",
         "bpf.ringbuf-size=3M", "calls.max-per-session=0", "x=y", "=", "@{tmp}/g", "@/dev/zero", "@{tmp}",
         "{tmp}/file", "/dev/zero", "/dev/null", "/nonexistent/dir/t.json", "/sys/fs/cgroup/none", "-k", "--",
         "é", "\x7f", "\t", "{rep:a:5000}", "{rep:%:300}"]
VALUES = st.one_of(st.sampled_from(WORDS), st.text(st.characters(blacklist_categories=("Cs",),
                                                                  blacklist_characters="\x00"), max_size=12))
ENV_VARS = ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_COMPRESSION",
            "OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_EXPORTER_OTLP_CLIENT_KEY", "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            "OTEL_RESOURCE_ATTRIBUTES", "OTEL_SERVICE_NAME", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
            "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SDK_DISABLED",
            "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_EXPORT_TIMEOUT",
            "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "OTEL_METRIC_EXPORT_INTERVAL",
            "OTEL_METRIC_EXPORT_TIMEOUT", "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
            "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION", "OTEL_ATTRIBUTE_COUNT_LIMIT",
            "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "OTEL_SPAN_EVENT_COUNT_LIMIT", "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT",
            "OTEL_LOG_LEVEL", "OTEL_METRICS_EXEMPLAR_FILTER", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"]
FILES = st.one_of(st.text(max_size=40), st.binary(max_size=40).map(lambda b: {"hex": b.hex()}),
                  st.sampled_from([{"kind": k} for k in ("fifo", "dir", "devzero", "devnull")]))


@st.composite
def trace_cases(draw: st.DrawFn) -> Case:
    argv = list(TRACE_BASE) if draw(st.booleans()) else ["trace"]
    for _ in range(draw(st.integers(0, 2))):
        argv += draw(st.sampled_from(VALID_FLAGS))
    for _ in range(draw(st.integers(1, 3))):
        argv.append(draw(st.sampled_from(FLAGS)))
        if draw(st.booleans()):
            argv.append(draw(VALUES))
    env = draw(st.dictionaries(st.sampled_from(ENV_VARS), VALUES, max_size=2))
    files = {"g": draw(FILES), "file": draw(FILES)}
    return Case(tuple(argv), env, files, expect="either")


BASE_CONFIG: dict = {
    "probe_sets": [{"name": "errs", "entry": ["*sys_bpf"], "allow": ["bpf_check"], "mode": "stack",
                    "attach_mode": "auto", "filters": {"deny_errors": ["ENOENT"], "min_duration_ms": 0},
                    "sampling": {"success_probability": 0.1}}],
    "exporter": {"otlp": {"endpoint": "http://127.0.0.1:4317", "protocol": "grpc", "compression": "gzip",
                          "timeout": 10}},
    "metrics": {"listen": "127.0.0.1:0", "stall_after_s": 30},
    "limits": {"max_spans_per_trace": 4096, "ringbuf_size": "8M", "max_sessions": 4096},
    "logging": {"format": "json", "level": "info"},
}


PATHS = config_paths(BASE_CONFIG)  # every key and list index: the places a mutation can hit
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2, 1 << 70), st.floats(allow_nan=True),
                    st.sampled_from([w for w in WORDS if "{rep" not in w]), st.text(max_size=10))
NODES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                     max_leaves=6)


@st.composite
def config_cases(draw: st.DrawFn) -> Case:
    cfg = json.loads(json.dumps(BASE_CONFIG))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        parent = cfg
        try:
            for step in path[:-1]:
                parent = parent[step]
            if draw(st.integers(0, 9)) == 0 and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = draw(NODES)
        except (KeyError, IndexError, TypeError):  # an earlier mutation replaced the way there
            continue
    if draw(st.integers(0, 4)) == 0:
        cfg[draw(st.sampled_from(["vmlinux", "bogus", "kubernetes"]))] = draw(NODES)
    text = yaml.safe_dump(cfg, allow_unicode=True)
    command = draw(st.sampled_from([("agent", "--check"), ("agent", "--config")]))
    return Case((*command, "{tmp}/a.yaml"), {}, {"a.yaml": text, "g": draw(FILES)}, expect="either")


@FUZZ
@given(st.lists(trace_cases(), min_size=2, max_size=2))
def test_generated_trace_flags_and_environment(pair: list[Case]) -> None:
    bad = run_all(pair)
    assert not bad, "\n".join(bad)


@FUZZ
@given(st.lists(config_cases(), min_size=2, max_size=2))
def test_generated_agent_configs(pair: list[Case]) -> None:
    bad = run_all(pair)
    assert not bad, "\n".join(bad)


@st.composite
def valid_trace_cases(draw: st.DrawFn) -> Case:
    flags = draw(st.lists(st.sampled_from([f for f in VALID_FLAGS if f[0] not in ("-K", "-F", "-M")]), max_size=4,
                          unique=True))
    if ("-S",) in flags and {("-x", "EINVAL"), ("-X", "ENOENT")} & set(flags):
        flags.remove(("-S",))  # success sessions and error filters exclude each other (as in retsnoop)
    if ("-E",) in flags and ("-T",) not in flags:
        flags.append(("-T",))  # -E adds the stack to -T's call trace: alone it is refused
    mode = draw(st.sampled_from([(), ("-K",), ("-F",), ("-M",), ("--kprobe-session",)]))
    return Case((*TRACE_BASE, *mode, *(t for f in flags for t in f)), {}, {}, expect="valid")


@settings(FUZZ, max_examples=max(5, PAIRS // 5))
@given(st.lists(valid_trace_cases(), min_size=2, max_size=2))
def test_valid_flags_reach_the_kernel_check(pair: list[Case]) -> None:
    bad = run_all(pair)
    assert not bad, "\n".join(bad)


def test_long_command_lines() -> None:
    """Issue 47.3: command lines far longer than anyone types (a script's generated -a list, a loop gone wrong)
    are read in time linear in their words: valid ones reach the kernel check, one bad word at the end is one line
    naming its flag, within the hang detector's TIMEOUT_S (argparse alone took 12 s for 10,000 `-a x`)."""
    many = tuple(w for i in range(20000) for w in ("-a", f"f{i}"))
    cases = [
        Case((*TRACE_BASE, *many), expect="valid", why="20,000 -a"),
        Case((*TRACE_BASE, *("-v",) * 20000), expect="valid", why="20,000 -v"),
        Case((*TRACE_BASE, *many, "-p", "nope"), why="20,000 -a, then a bad pid"),
        Case((*TRACE_BASE, "-F", *many, "-K"), why="two attach modes 40,000 words apart"),
        Case((*TRACE_BASE, *("-x", "-EINVAL") * 10000), expect="valid", why="10,000 -x -EINVAL (getopt's values)"),
    ]
    bad = run_all(cases)
    assert not bad, "\n".join(bad)


# ---- outputs: every command that writes to stdout, with its reader gone or its disk full, stderr too ----

VALID_CHECK = {"a.yaml": "probe_sets:\n  - name: errs\n    entry: ['*sys_bpf']\n    mode: metrics\n"}
WRITERS = [(("features",), {}), (("features", "--json"), {}), (("--help",), {}), (("trace", "--help"), {}),
           (("agent", "--help"), {}), (("simfail", "--help"), {}), (("trace", "-V"), {}),
           (("trace", "--config-help"), {}), (("agent", "--check", "{tmp}/a.yaml", "--no-kernel"), VALID_CHECK)]


def output_cases() -> list[Case]:
    """Each stdout writer with stdout closed (141) or full (1), and stderr full as well; bad input (a FIFO for
    -J, --trace-json and exporter.file among it) with stdout closed or full and stderr full stays 2."""
    cases = []
    for argv, files in WRITERS:
        for stdout, expect in (("closed", "pipe"), ("full", "full")):
            for stderr in ("", "full"):
                cases.append(Case(argv, {}, files, expect, why=f"{' '.join(argv)} with stdout {stdout}",
                                  stdout=stdout, stderr=stderr))
    refused = [c for c in load_corpus() if c.expect == "refused" and not c.stdout and not c.stderr][::8]
    for c in refused:
        for stdout, stderr in (("closed", "full"), ("full", "full"), ("", "full")):
            cases.append(Case(c.argv, c.env, c.files, "refused", why=f"{c.why}, stdout {stdout or 'file'}, stderr full",
                              stdout=stdout, stderr=stderr))
    return cases


def test_outputs_closed_or_full() -> None:
    cases = output_cases()
    bad = run_all(cases)
    assert not bad, f"{len(bad)} of {len(cases)} output cases misbehaved:\n" + "\n".join(bad)


@pytest.mark.parametrize("value", ["http://[::1", "ftp://user:pw@x:1"])
def test_a_run_that_misbehaves_is_reported(value: str) -> None:
    """The checker itself: a valid-expected bad input and a refused-expected valid one are both findings; so are a
    stdout writer whose closed pipe is said to be full, and one expected to fail that writes to a file."""
    assert run_all([Case(("features",), expect="full", stdout="closed")])
    assert run_all([Case(("features",), expect="pipe")])
    assert run_all([Case((*TRACE_BASE, "--otlp-endpoint", value), expect="valid")])
    assert run_all([Case(TRACE_BASE, expect="refused")])
    assert run_all([Case(TRACE_BASE, expect="warned")])  # no variable it cannot use: no warning
    assert run_all([Case((*TRACE_BASE, "--otlp-endpoint", "http://c:4318"), {"OTEL_BSP_MAX_QUEUE_SIZE": "x"},
                         expect="valid")])  # a warning is no valid run


def test_peak_memory_is_the_commands_not_this_process() -> None:
    """A large test process (make test's grows past 300 MB) must not count as the command's memory: fork()
    copies it, and wait4's ru_maxrss of the child would include that copy."""
    ballast = bytearray(300 << 20)
    ballast[::4096] = b"x" * len(ballast[::4096])  # resident, not only reserved
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        out = run_case(Case(("trace", "--frobnicate")), Path(tmp), TIMEOUT_S)
    assert out.code == 2 and 5 < out.max_rss_mb < 100, out
    del ballast
