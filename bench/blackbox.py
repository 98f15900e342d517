"""Black-box run of bad inputs against the installed command (issue 47's acceptance): flags, config keys, variables,
output paths, web configs and signals at start, as a careless or hostile user would give them.

    .venv/bin/python -m bench.blackbox [--only CATEGORY] [--jobs 2] [--show 40]

Every run is `retsnoop-otel ...` as a subprocess without capabilities (tests/command_runs.py), so valid input ends
at this host's kernel refusal (exit 1) and bad input is refused before it (exit 2). A finding is: a traceback, a run
killed at TIMEOUT_S (a hang), CPU time near the wall time of a long run (a pinned CPU), more than one stderr line
(warnings about OTEL_* variables aside) or one longer than MAX_LINE, an exit code outside the documented ones for
the case, and for an agent config: `agent --check` and `agent --config` disagreeing (the check exits 0 exactly when
the run gets past its input checks; otherwise both exit with the same code).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from tests.command_runs import COMMAND, KEPT_ENV, REPO, Case, Outcome, _place, config_paths, run_case

TIMEOUT_S = 20.0
MAX_LINE = 400
TRACING_REFUSED = ("needs root or the CAP_BPF and CAP_PERFMON capabilities", "kernel functions cannot be traced here")
# exit 1 for input that another host could take: an address of another machine, a port that needs a capability
HOST_REFUSALS = (*TRACING_REFUSED, "the address is already in use", "ports below 1024 need", "--lbr needs last branch",
                 "is not an address of this machine")
WARNING_PREFIXES = ("retsnoop-otel: warning: OTEL_", "retsnoop-otel agent: warning: OTEL_")
BASE_SET = "probe_sets:\n  - name: k\n    entry: ['*sys_bpf']\n"
TRACE = ("trace", "-e", "*sys_bpf")
SECRET_VARS = ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_RESOURCE_ATTRIBUTES")  # values never echoed (environment.md)


@dataclass(frozen=True)
class Probe:
    """One bad input: a case, its category, and whether it is an agent config (checked and run both)."""
    category: str
    case: Case
    paired: bool = False  # argv ends in the config path: run it as `agent --check` and `agent --config`


# ---- the inputs ----

BAD_VALUES = ["", " ", "\x01", "\x1b[2J", "a\rb", "a\nb", "\u202e", "é€😀", "{rep:x:100000}", "-1", "0",
              "99999999999999999999", "1e30", "-1e30", "nan", "inf", "0x10", "1_0", "/", "/dev/full", "{tmp}/fifo",
              "{tmp}/dir", "'", '"', "%s%n", "*", "u:", "kprobe:"]


def flag_probes() -> list[Probe]:
    """Every value-taking `trace` flag with every bad value, after a valid entry glob."""
    from retsnoop_otel.trace.flags import build_parser
    takes = sorted({d.action.option_strings[-1] for d in build_parser().declared
                    if d.action.nargs is None and d.action.option_strings[-1] not in ("--config-help",)})
    files = {"fifo": {"kind": "fifo"}, "dir": {"kind": "dir"}}
    out = []
    for i, flag in enumerate(takes):
        for j, value in enumerate(BAD_VALUES):
            if (i + j) % 3:  # a third of the grid: every flag sees nine values, every value every third flag
                continue
            out.append(Probe("flags", Case((*TRACE, flag, value), files=files, expect="either",
                                           why=f"{flag} {value[:20]!r}")))
    for extra in (("-E",), ("--trace-json", "{tmp}/t.json"), ("-E", "--trace-json", "{tmp}/t.json"),
                  ("-S", "-x", "EINVAL"), ("-F", "-K"), ("-s", "bogus"), ("-B", "x"), ("--lbr-max-count", "-3"),
                  ("--metrics-port", "0", "--web.listen-address", ":1"), ("-p", "0"), ("-p", "-5"),
                  ("-p", "4294967296"), ("-J", "kprobe:foo+-1"), ("-J", "tp:a"), ("-J", "rawtp:"),
                  ("-J", "tp::x"), ("-e", "u:/bin/true:"), ("-e", "u::main"), ("-e", "u:/dev/null:x"),
                  ("-e", "u:/proc:x"), ("-e", "u:{tmp}/fifo:x"), ("-e", "u:{tmp}/loop:x"),
                  ("-c", "nope"), ("-c", ""), ("--otlp-endpoint", "http://user:SECRETPW@[::1"),
                  ("--service-name-from", ""), ("-C", "=1"), ("-C", "bpf.ringbuf-size=0"),
                  ("-C", "bpf.ringbuf-size=99999999999G"), ("-C", "calls.max-per-session=-1"),
                  ("--web.config.file", "/dev/zero"), ("--web.config.file", "{tmp}/fifo")):
        out.append(Probe("flags", Case((*TRACE, *extra), files=files, expect="either", why=" ".join(extra)[:60])))
    for sub in (("features", "--json", "x"), ("features", "-q"), ("simfail", "--delay-ms", "nan"),
                ("simfail", "--delay-ms", "-1"), ("simfail", "--delay-ms", "1e30"), ("simfail", "-r", "-1"),
                ("simfail", "-r", "99999999999999999999"), ("simfail", "--comm", ""), ("simfail", "--comm", "x" * 40),
                ("simfail", "nosuchcase"), ("simfail", "--comm", "a\nb"), ("agent",), ("agent", "--config", ""),
                ("agent", "--check", ""), ("agent", "--check", "/"), ("agent", "--check", "/dev/full"),
                ("agent", "--health"), ("agent", "--health", "--config", "/nonexistent"),
                ("agent", "--no-kernel"), ("agent", "--config", "a", "--check", "b"), ("nosuch",), ("",),
                ("trace",), ("trace", "--"), ("trace", "-e")):
        out.append(Probe("subcommands", Case(sub, expect="either", why=" ".join(sub)[:60])))
    return out


CONFIG_BASE: dict = {
    "probe_sets": [{"name": "k", "entry": ["*sys_bpf"], "allow": ["bpf_check"], "deny": ["x*"], "mode": "stack",
                    "attach_mode": "auto", "user_attach_mode": "auto",
                    "filters": {"pids": [1], "no_pids": [2], "comms": ["a"], "no_comms": ["b"],
                                "min_duration_ms": 0, "allow_errors": ["EINVAL"], "deny_errors": ["ENOENT"]},
                    "sampling": {"success_probability": 0.1}, "capture_args": False, "app_context": True,
                    "user_stacks": False, "duration_range": {"min": "1us", "max": "10s"},
                    "inject": ["rawtp:sys_enter"]}],
    "exporter": {"otlp": {"endpoint": "http://127.0.0.1:4317", "protocol": "grpc", "headers": {"a": "b"},
                          "compression": "gzip", "timeout": 10, "insecure": True},
                 "console": False, "export_addresses": False, "service_name_from": "workload"},
    "metrics": {"listen": "127.0.0.1:0", "stall_after_s": 30, "otlp_interval": 60, "max_error_types": 10,
                "functions": ["*"], "duration_range": {"min": "1us", "max": "10s"}, "max_workloads": 10},
    "limits": {"max_spans_per_trace": 100, "export_queue_spans": 1000, "ringbuf_size": "8M", "max_sessions": 100,
               "user_stack_wait_s": 1},
    "logging": {"format": "json", "level": "info"},
}
CONFIG_VALUES = [None, True, [], {}, "", "x", -1, 0, 1e30, -1e30, 1 << 70, "1e30", "-5s", [[]], {"a": {"b": 1}},
                 "\x1b[31m", "a\nb", "{rep:y:50000}"]


def _set(cfg: dict, path: tuple, value: object) -> dict:
    cfg = json.loads(json.dumps(cfg))
    parent = cfg
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    return cfg


def config_probes() -> list[Probe]:
    """Every key of a full config with wrong values, unknown keys at every level, YAML tricks, outputs."""
    out = []
    leaves = config_paths(CONFIG_BASE)
    for i, path in enumerate(leaves):
        for j, value in enumerate(CONFIG_VALUES):
            if (i + j) % 3:  # a third of the grid: every key sees six values, every value every third key
                continue
            text = yaml.safe_dump(_set(CONFIG_BASE, path, value), allow_unicode=True)
            out.append(_config("config-keys", text, f"{'.'.join(map(str, path))}={str(value)[:20]!r}"))
    for path in [(), ("probe_sets", 0), ("probe_sets", 0, "filters"), ("exporter",), ("exporter", "otlp"),
                 ("metrics",), ("limits",), ("logging",), ("probe_sets", 0, "sampling")]:
        node = CONFIG_BASE
        for step in path:
            node = node[step]
        cfg = _set(CONFIG_BASE, (*path, "bogus_key"), 1) if path else {**CONFIG_BASE, "bogus_key": 1}
        out.append(_config("config-keys", yaml.safe_dump(cfg), f"unknown key under {'.'.join(map(str, path)) or '/'}"))
    yaml_tricks = {
        "duplicate top key": BASE_SET + "logging: {level: info}\nlogging: {level: debug}\n",
        "duplicate set key": "probe_sets:\n  - name: k\n    name: j\n    entry: ['*sys_bpf']\n",
        "duplicate set names": BASE_SET + "  - name: k\n    entry: ['*sys_bpf']\n",
        "anchor and alias": "x: &a ['*sys_bpf']\n" + BASE_SET,
        "alias as entry": "probe_sets:\n  - name: k\n    entry: &e ['*sys_bpf']\n    allow: *e\n",
        "merge key": "probe_sets:\n  - &b {name: k, entry: ['*sys_bpf']}\n  - <<: *b\n    name: j\n",
        "undefined alias": "probe_sets: *nope\n",
        "recursive alias": "probe_sets: &a [*a]\n",
        "deep nesting": "probe_sets: " + "[" * 5000 + "]" * 5000 + "\n",
        "deep mapping": "probe_sets: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n",
        "a tag": BASE_SET + "logging: !!python/object/apply:os.system ['true']\n",
        "binary tag": BASE_SET + "vmlinux: !!binary aGVsbG8=\n",
        "timestamp": BASE_SET + "metrics: {stall_after_s: 2001-12-14}\n",
        "empty document": "",
        "only a comment": "# nothing\n",
        "two documents": BASE_SET + "---\n" + BASE_SET,
        "a list at top": "- 1\n",
        "a scalar at top": "hello\n",
        "tabs": "probe_sets:\n\t- name: k\n",
        "huge int": BASE_SET + "limits: {max_sessions: " + "9" * 5000 + "}\n",
        "huge float": BASE_SET + "metrics: {stall_after_s: 1e999}\n",
        "negative duration range": BASE_SET + "metrics: {duration_range: {min: -1s, max: 1s}}\n",
        "inverted duration range": BASE_SET + "metrics: {duration_range: {min: 10s, max: 1s}}\n",
        "empty entry": "probe_sets:\n  - name: k\n    entry: []\n",
        "empty probe_sets": "probe_sets: []\n",
        "null probe_sets": "probe_sets:\n",
        "no name": "probe_sets:\n  - entry: ['*sys_bpf']\n",
        "name with newline": "probe_sets:\n  - name: \"a\\nb\"\n    entry: ['*sys_bpf']\n",
        "name with quotes": "probe_sets:\n  - name: 'a\"b'\n    entry: ['*sys_bpf']\n",
        "long name": "probe_sets:\n  - name: {rep:n:100000}\n    entry: ['*sys_bpf']\n",
        "non-utf8": {"hex": (BASE_SET + "vmlinux: ").encode().hex() + "ff fe".replace(" ", "") + "0a"},
        "BOM": {"hex": "efbbbf" + BASE_SET.encode().hex()},
        "NUL byte": {"hex": BASE_SET.encode().hex() + "00"},
        "CRLF": BASE_SET.replace("\n", "\r\n"),
        "headers CR/LF": BASE_SET + "exporter:\n  otlp:\n    endpoint: http://c:4318\n"
                                   "    headers: {a: \"x\\r\\nb: y\"}\n",
        "headers int": BASE_SET + "exporter:\n  otlp:\n    endpoint: http://c:4318\n    headers: {a: 1}\n",
        "headers bad name": BASE_SET + "exporter:\n  otlp:\n    endpoint: http://c:4318\n    headers: {'a b': x}\n",
        "headers empty name": BASE_SET + "exporter:\n  otlp:\n    endpoint: http://c:4318\n    headers: {'': x}\n",
        "timeout 1e30": BASE_SET + "exporter:\n  otlp:\n    endpoint: http://c:4318\n    timeout: 1e30\n",
        "timeout 0": BASE_SET + "exporter:\n  otlp:\n    endpoint: http://c:4318\n    timeout: 0\n",
        "metrics timeout 1e30": BASE_SET + "metrics:\n  otlp:\n    endpoint: http://c:4318\n    timeout: 1e30\n",
        "otlp_interval 0": BASE_SET + "metrics:\n  otlp:\n    endpoint: http://c:4318\n  otlp_interval: 0\n",
        "otlp_interval 1e30": BASE_SET + "metrics:\n  otlp:\n    endpoint: http://c:4318\n  otlp_interval: 1e30\n",
        "stall 1e30": BASE_SET + "metrics:\n  stall_after_s: 1e30\n",
        "keep_deleted 1e30": BASE_SET + "kubernetes:\n  metadata: false\n  keep_deleted: 1e30\n",
        "keep_deleted -1": BASE_SET + "kubernetes:\n  metadata: false\n  keep_deleted: -1\n",
        "user_stack_wait_s 1e30": BASE_SET + "limits:\n  user_stack_wait_s: 1e30\n",
        "user_stack_wait_s nan": BASE_SET + "limits:\n  user_stack_wait_s: .nan\n",
        "ringbuf 1T": BASE_SET + "limits:\n  ringbuf_size: 1T\n",
        "ringbuf 3M": BASE_SET + "limits:\n  ringbuf_size: 3M\n",
        "ringbuf 1.5M": BASE_SET + "limits:\n  ringbuf_size: 1.5M\n",
        "100 probe sets same name": "probe_sets:\n" + "  - name: k\n    entry: ['*sys_bpf']\n" * 100,
        "compression deflate": BASE_SET + "exporter:\n  otlp:\n    endpoint: http://c:4318\n    compression: deflate\n",
        "k8s api no scheme": BASE_SET + "kubernetes:\n  metadata: true\n  node_name: n\n  api_server: c:443\n",
        "k8s metadata without node": BASE_SET + "kubernetes:\n  metadata: true\n",
        "vmlinux missing": BASE_SET + "vmlinux: /nonexistent/vmlinux\n",
        "vmlinux a dir": BASE_SET + "vmlinux: /\n",
        "vmlinux fifo": BASE_SET + "vmlinux: {tmp}/fifo\n",
        "inject bad": BASE_SET + "    inject: ['kprobe:foo+99999999999999999999']\n",
        "inject @fifo": BASE_SET + "    inject: ['@{tmp}/fifo']\n",
        "inject @binary": BASE_SET + "    inject: ['@{tmp}/bin']\n",
        "inject @dir": BASE_SET + "    inject: ['@{tmp}/dir']\n",
        "entry @fifo": "probe_sets:\n  - name: k\n    entry: ['@{tmp}/fifo']\n",
        "entry @missing": "probe_sets:\n  - name: k\n    entry: ['@{tmp}/none']\n",
        "comm @fifo": BASE_SET + "    filters: {comms: ['@{tmp}/fifo']}\n",
        "u: binary a dir": "probe_sets:\n  - name: k\n    entry: ['u:{tmp}/dir:main']\n",
        "u: binary a fifo": "probe_sets:\n  - name: k\n    entry: ['u:{tmp}/fifo:main']\n",
        "u: binary /dev/zero": "probe_sets:\n  - name: k\n    entry: ['u:/dev/zero:main']\n",
        "u: glob matching nothing": "probe_sets:\n  - name: k\n    entry: ['u:/bin/true:zz_no_such_fn*']\n",
        "u: not ELF": "probe_sets:\n  - name: k\n    entry: ['u:{tmp}/bin:main']\n",
        "u: libc getpid": "probe_sets:\n  - name: k\n    entry: ['u:libc.so.6:getpid']\n",
        "u: libc short": "probe_sets:\n  - name: k\n    entry: ['u:libc:getpid']\n",
        "every entry denied": "probe_sets:\n  - name: k\n    entry: ['*sys_bpf']\n    deny: ['*']\n",
    }
    files = {"fifo": {"kind": "fifo"}, "dir": {"kind": "dir"}, "bin": {"hex": "00ff" * 50}}
    for why, text in yaml_tricks.items():
        out.append(_config("config-yaml", text, why, files))
    return out


def _config(category: str, text: object, why: str, files: dict | None = None) -> Probe:
    return Probe(category, Case(("agent", "--check", "{tmp}/a.yaml"), files={**(files or {}), "a.yaml": text},
                                expect="either", why=why), paired=True)


OUTPUT_KINDS: dict[str, tuple[str, dict]] = {
    "a directory": ("{tmp}/dir", {"dir": {"kind": "dir"}}),
    "a directory with slash": ("{tmp}/dir/", {"dir": {"kind": "dir"}}),
    "a FIFO": ("{tmp}/fifo", {"fifo": {"kind": "fifo"}}),
    "/dev/full": ("/dev/full", {}),
    "/dev/null": ("/dev/null", {}),
    "/dev/zero": ("/dev/zero", {}),
    "/dev/stdout": ("/dev/stdout", {}),
    "a missing parent": ("{tmp}/no/such/out", {}),
    "a parent that is a file": ("{tmp}/f/out", {"f": "x"}),
    "an unwritable directory": ("{tmp}/ro/out", {"ro": {"kind": "dir"}}),
    "an unwritable file": ("{tmp}/rofile", {"rofile": "x"}),
    "a symlink loop": ("{tmp}/loop", {}),
    "a dangling symlink": ("{tmp}/dangle", {}),
    "empty": ("", {}),
    "a space": (" ", {}),
    "/proc/self/status": ("/proc/self/status", {}),
    "a socket path": ("{tmp}/sock", {}),
    "a very long path": ("{tmp}/" + "d" * 5000, {}),
    "a newline in the name": ("{tmp}/a\nb", {}),
}


def output_probes() -> list[Probe]:
    """Every output path a user can name, of every kind: exporter.file, --trace-json, -J @, web config, -e @."""
    out = []
    for kind, (path, files) in OUTPUT_KINDS.items():
        out.append(_config("outputs", BASE_SET + f"exporter:\n  file: {json.dumps(path)}\n", f"exporter.file {kind}",
                           files))
        out.append(_config("outputs", BASE_SET + f"metrics:\n  listen: 127.0.0.1:0\n  web_config_file: "
                                      f"{json.dumps(path)}\n", f"web_config_file {kind}", files))
        out.append(_config("outputs", BASE_SET + f"vmlinux: {json.dumps(path)}\n", f"vmlinux {kind}", files))
        for argv in (("-T", "--trace-json", path), ("-J", "@" + path), ("-n", "@" + path), ("-e", "@" + path),
                     ("--web.config.file", path), ("-k", path), ("--cgroup", path)):
            out.append(Probe("outputs", Case((*TRACE, *argv), files=files, expect="either",
                                             why=f"{argv[-2]} {kind}")))
        out.append(Probe("outputs", Case(("agent", "--check", path), files=files, expect="either",
                                         why=f"agent --check {kind}")))
    return out


def env_probes() -> list[Probe]:
    """OTEL_* (warned about and ignored: the run still reaches the kernel refusal) and the tool's own variables."""
    names = ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
             "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_COMPRESSION",
             "OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_SERVICE_NAME",
             "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_SDK_DISABLED",
             "OTEL_TRACES_EXPORTER", "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_EXPORTER_OTLP_CLIENT_KEY"]
    values = ["", "\x01", "1e30", "-1", "nan", "a=%zz", "a=b\r\nc", "secret=SECRETPW,bad", "{rep:x:100000}",
              "http://[::1", "deflate", "/dev/zero", "{tmp}/fifo", "é"]
    out = []
    for i, name in enumerate(names):
        for j, value in enumerate(values):
            if (i + j) % 2:
                continue
            for argv, files in ((TRACE, {}), (("agent", "--check", "{tmp}/a.yaml"), {"a.yaml": BASE_SET})):
                out.append(Probe("env", Case(argv, {name: value}, {**files, "fifo": {"kind": "fifo"}},
                                             expect="either", secret="SECRETPW" if name in SECRET_VARS else "",
                                             why=f"{name}={value[:20]!r}"), paired=argv[0] == "agent"))
    for value in ("", "{tmp}/file", "/dev/null", "{tmp}/fifo", "{tmp}/ro", "/", "relative", "{tmp}/no/such/dir",
                  "{rep:c:5000}", "/proc/self"):
        for argv, files in ((TRACE, {}), (("agent", "--check", "{tmp}/a.yaml"), {"a.yaml": BASE_SET}),
                            (("features",), {})):
            out.append(Probe("env", Case(argv, {"RETSNOOP_OTEL_CACHE": value},
                                         {**files, "file": "x", "fifo": {"kind": "fifo"}, "ro": {"kind": "dir"}},
                                         expect="either", why=f"RETSNOOP_OTEL_CACHE={value[:20]!r} {argv[0]}"),
                             paired=argv[0] == "agent"))
    for value in ("", "x", "a,b", "{rep:a,:10000}", "\x01"):
        out.append(Probe("env", Case(TRACE, {"RETSNOOP_OTEL_THREAD_ATTRIBUTES": value}, expect="either",
                                     why=f"RETSNOOP_OTEL_THREAD_ATTRIBUTES={value[:20]!r}")))
    return out


def web_probes(tmp_certs: Path) -> list[Probe]:
    """Web config files (exporter-toolkit format) for the agent's /metrics: TLS and basic auth, broken."""
    cert, key = tmp_certs / "c.pem", tmp_certs / "k.pem"
    bcrypt31 = "$2b$31$" + "a" * 53
    texts = {
        "tls garbage cert": {"tls_server_config": {"cert_file": "{tmp}/junk", "key_file": "{tmp}/junk"}},
        "tls missing key": {"tls_server_config": {"cert_file": str(cert)}},
        "tls key is a dir": {"tls_server_config": {"cert_file": str(cert), "key_file": "{tmp}/dir"}},
        "tls key is a fifo": {"tls_server_config": {"cert_file": str(cert), "key_file": "{tmp}/fifo"}},
        "tls swapped": {"tls_server_config": {"cert_file": str(key), "key_file": str(cert)}},
        "tls min version bogus": {"tls_server_config": {"cert_file": str(cert), "key_file": str(key),
                                                        "min_version": "TLS99"}},
        "tls client auth bogus": {"tls_server_config": {"cert_file": str(cert), "key_file": str(key),
                                                        "client_auth_type": "Maybe"}},
        "tls client ca missing": {"tls_server_config": {"cert_file": str(cert), "key_file": str(key),
                                                        "client_auth_type": "RequireAndVerifyClientCert"}},
        "tls cipher bogus": {"tls_server_config": {"cert_file": str(cert), "key_file": str(key),
                                                   "cipher_suites": ["NOPE"]}},
        "tls a list": {"tls_server_config": ["x"]},
        "bcrypt cost 31": {"basic_auth_users": {"u": bcrypt31}},
        "bcrypt cost 3": {"basic_auth_users": {"u": "$2b$03$" + "a" * 53}},
        "not bcrypt": {"basic_auth_users": {"u": "plaintext"}},
        "empty user": {"basic_auth_users": {"": "$2b$10$" + "a" * 53}},
        "int hash": {"basic_auth_users": {"u": 5}},
        "user with colon": {"basic_auth_users": {"a:b": "$2b$10$" + "a" * 53}},
        "users a list": {"basic_auth_users": ["u"]},
        "headers CR/LF": {"http_server_config": {"headers": {"X-A": "a\r\nb: c"}}},
        "headers int": {"http_server_config": {"headers": {"X-A": 1}}},
        "headers reserved": {"http_server_config": {"headers": {"Content-Length": "5"}}},
        "http2 string": {"http_server_config": {"http2": "yes"}},
        "unknown top key": {"bogus": 1},
        "null": None,
        "a list": [1],
    }
    files = {"junk": "-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n", "dir": {"kind": "dir"},
             "fifo": {"kind": "fifo"}}
    out = []
    for why, doc in texts.items():
        web = yaml.safe_dump(doc)
        f = {**files, "web.yaml": web}
        out.append(_config("web-config", BASE_SET + "metrics:\n  listen: 127.0.0.1:0\n"
                                         "  web_config_file: {tmp}/web.yaml\n", f"web {why}", f))
        out.append(Probe("web-config", Case((*TRACE, "--web.listen-address", "127.0.0.1:0", "--web.config.file",
                                             "{tmp}/web.yaml"), files=f, expect="either", why=f"trace web {why}")))
    for listen in ("1.2.3.4:80", "999.1.1.1:1", "127.0.0.1:80", "[::1", "[::1]:99999", ":", "host-that-does-not"
                   "-resolve.invalid:9464", "127.0.0.1:-1", "127.0.0.1", "0.0.0.0:0x10", "{rep:9:5000}"):
        out.append(_config("web-config", BASE_SET + f"metrics:\n  listen: {json.dumps(listen)}\n",
                           f"listen {listen[:30]}"))
        out.append(Probe("web-config", Case((*TRACE, "--web.listen-address", listen), expect="either",
                                            why=f"--web.listen-address {listen[:30]}")))
    return out


# ---- running and judging ----

def _prepare(tmp: Path) -> None:
    """Kinds run_case cannot place: a symlink loop, a dangling link, unwritable ones, a socket."""
    os.symlink(tmp / "loop", tmp / "loop")
    os.symlink(tmp / "nowhere", tmp / "dangle")


@dataclass
class Result:
    probe: Probe
    out: Outcome
    run: Outcome | None
    findings: list[str]


def _lines(stderr: str) -> list[str]:
    """stderr without the warnings about OTEL_* variables (trace's and --check's lines, the agent's log events)."""
    return [x for x in stderr.splitlines() if not x.startswith(WARNING_PREFIXES)
            and not re.search(r"\bOTEL_[A-Z_]+\b.*ignored, as if unset", x)]


def _reached_kernel(out: Outcome) -> bool:
    return out.code == 1 and any(r in out.stderr for r in HOST_REFUSALS)


def judge(probe: Probe, out: Outcome, run: Outcome | None) -> list[str]:
    found = []
    for name, o in (("", out), ("run: ", run)):
        if o is None:
            continue
        if o.code is None:
            found.append(f"{name}hang (killed at {TIMEOUT_S:g} s)")
            continue
        text = o.stdout + o.stderr
        if "Traceback" in text or "Exception ignored" in text:
            found.append(f"{name}traceback")
        if probe.case.secret and probe.case.secret in text:
            found.append(f"{name}echoed a secret")
        lines = _lines(o.stderr)
        if o.code != 0 and len(lines) != 1:
            found.append(f"{name}{len(lines)} stderr lines")
        if any(len(x) > MAX_LINE for x in o.stderr.splitlines()):
            found.append(f"{name}a {max(len(x) for x in o.stderr.splitlines())}-char line")
        if o.code not in (0, 1, 2):
            found.append(f"{name}exit {o.code}")
        if o.code == 1 and not _reached_kernel(o) and not name:
            found.append(f"{name}exit 1 without a host refusal")
    if run is not None and run.code is not None and out.code is not None:
        if out.code == 0 and not _reached_kernel(run):
            found.append(f"check/run disagree: check 0, run {run.code}")
        if out.code != 0 and out.code != run.code:
            found.append(f"check/run disagree: check {out.code}, run {run.code}")
    return found


def execute(probe: Probe) -> Result:
    with tempfile.TemporaryDirectory(prefix="bb-") as d:
        tmp = Path(d)
        _prepare(tmp)
        out = _run(probe.case, tmp)
        run = None
        if probe.paired:
            argv = ("agent", "--config", *probe.case.argv[2:])
            run = _run(replace(probe.case, argv=argv), tmp)
    return Result(probe, out, run, judge(probe, out, run))


def _run(case: Case, tmp: Path) -> Outcome:
    """run_case in `tmp`, with the files placed fresh (a FIFO or directory replaced) and ro/ made unwritable."""
    for name in case.files:
        p = tmp / name
        if p.is_dir() and not p.is_symlink():
            os.chmod(p, 0o755)
            subprocess.run(["rm", "-rf", str(p)], check=False)
        elif p.exists() or p.is_symlink():
            p.unlink()
    try:
        for name, content in case.files.items():
            _place(tmp, name, content)
        for name in ("ro", "rofile"):
            if (tmp / name).exists():
                os.chmod(tmp / name, 0o500 if name == "ro" else 0o400)
        out = run_case(replace(case, files={}), tmp, TIMEOUT_S)
    finally:
        for name in ("ro",):
            if (tmp / name).exists():
                os.chmod(tmp / name, 0o755)
    return out


def signal_probes() -> list[tuple[tuple[str, ...], int, float]]:
    """(argv, signal, delay): signals during start-up, at several points of it."""
    out = []
    for argv in (TRACE, ("agent", "--config", "{cfg}"), ("agent", "--check", "{cfg}"), ("features",),
                 ("simfail", "-r", "1000", "--delay-ms", "10", "bpf-bad-map-type")):
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            for delay in (0.02, 0.1, 0.2, 0.3):
                out.append((argv, sig, delay))
    return out


def run_signal(argv: tuple[str, ...], sig: int, delay: float) -> tuple[int | None, str, float]:
    with tempfile.TemporaryDirectory(prefix="bb-sig-") as d:
        cfg = Path(d) / "a.yaml"
        cfg.write_text(BASE_SET)
        env = {k: os.environ[k] for k in KEPT_ENV if k in os.environ}
        env["PYTHONPATH"] = str(REPO)
        t0 = time.monotonic()
        proc = subprocess.Popen(["unshare", "--user", str(COMMAND), *(a.replace("{cfg}", str(cfg)) for a in argv)],
                                env=env, cwd=d, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, process_group=0)
        time.sleep(delay)
        try:
            os.kill(proc.pid, sig)  # unshare execs the command: this pid is it
        except ProcessLookupError:
            pass
        try:
            so, se = proc.communicate(timeout=TIMEOUT_S)
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            so, se = proc.communicate()
            code = None
        return code, se, time.monotonic() - t0


def in_pythons_start(sig: int, code: int | None, stderr: str) -> bool:
    """Ended by a signal in Python's own start, before the package's handler is in: Python's traceback with no frame
    of the package's but its __init__ (whose first imports come before the handler), and Python's exit (1, or killed
    by the signal). The documented limit (docs/reference/exit-codes.md), no code of the package's has run."""
    ours = [f for f in re.findall(r'File "([^"]+)"', stderr) if "/retsnoop_otel/" in f]
    return "Traceback" in stderr and code in (1, -sig) and all(f.endswith("retsnoop_otel/__init__.py") for f in ours)


def judge_signal(argv: tuple[str, ...], sig: int, code: int | None, stderr: str) -> list[str]:
    found = []
    if code is None:
        return ["hang"]
    if in_pythons_start(sig, code, stderr):
        return []
    if "Traceback" in stderr or "Exception ignored" in stderr:
        # before the console script runs (site, a .pth file): the interpreter's, no code of the package's yet
        found.append("traceback" if 'bin/retsnoop-otel"' in stderr else "traceback before the package loads")
    want = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}[sig]
    # killed by the signal itself (before the handlers, nothing attached yet): the shell's $? is the same 128+N
    allowed = {want, -sig, 1, 0}
    if code not in allowed:
        found.append(f"exit {code} (want {want}, or the run's own end)")
    if len(_lines(stderr)) > 1:
        found.append(f"{len(_lines(stderr))} stderr lines")
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="one category")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--show", type=int, default=60, help="findings printed in full")
    ap.add_argument("--no-signals", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bb-certs-") as certs:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-keyout", "k.pem", "-out", "c.pem", "-days", "2", "-subj", "/CN=bb"], cwd=certs, check=True,
                       capture_output=True)
        probes = [*flag_probes(), *config_probes(), *output_probes(), *env_probes(), *web_probes(Path(certs))]
        if args.only:
            probes = [p for p in probes if p.category == args.only]
        t0 = time.monotonic()
        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(execute, probes))
    table: dict[str, Counter] = defaultdict(Counter)
    findings = []
    for r in results:
        c = table[r.probe.category]
        c["inputs"] += 1
        c[f"exit {r.out.code}"] += 1
        c["max s"] = max(c["max s"], round(r.out.seconds, 1))
        c["max line"] = max(c["max line"], max((len(x) for x in r.out.stderr.splitlines()), default=0))
        if r.probe.paired:
            c["pairs"] += 1
        if r.findings:
            c["findings"] += 1
            findings.append(r)
    signals = []
    if not args.no_signals and args.only in (None, "signals"):
        for argv, sig, delay in signal_probes():
            code, se, secs = run_signal(argv, sig, delay)
            found = judge_signal(argv, sig, code, se)
            c = table["signals"]
            c["inputs"] += 1
            c[f"exit {code}"] += 1
            c["max s"] = max(c["max s"], round(secs, 1))
            if found:
                c["findings"] += 1
                signals.append(f"{' '.join(argv)} {signal.Signals(sig).name} at {delay}s: {'; '.join(found)} "
                               f"-> {code} {se.strip()[-300:]!r}")
    total = sum(c["inputs"] for c in table.values())
    print(f"{total} inputs in {time.monotonic() - t0:.0f} s")
    cols = ["inputs", "pairs", "findings", "exit 0", "exit 1", "exit 2", "exit None", "max s", "max line"]
    print(f"{'category':14}" + "".join(f"{c:>10}" for c in cols))
    for cat, c in table.items():
        print(f"{cat:14}" + "".join(f"{c.get(k, 0):>10}" for k in cols))
    kinds = Counter(f for r in findings for f in r.findings)
    print("\nfindings by kind:", dict(kinds.most_common()))
    for r in findings[:args.show]:
        print(f"- [{r.probe.category}] {r.probe.case.why}: {'; '.join(r.findings)}\n    check/cmd {r.out.code} "
              f"{r.out.stderr.strip()[-250:]!r}" + (f"\n    run {r.run.code} {r.run.stderr.strip()[-250:]!r}"
                                                   if r.run else ""))
    for s in signals[:args.show]:
        print(f"- [signals] {s}")
    sys.exit(1 if findings or signals else 0)


if __name__ == "__main__":
    main()
