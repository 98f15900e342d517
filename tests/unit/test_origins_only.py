"""--origins-only (attach_mode: origin_exits): counts from the returns, no sessions, and one message for a setting
that needs sessions (bpf/origins.bpf.h; the VM scenarios count with it on real kernels)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from retsnoop_otel.agent.config_file import parse_config
from retsnoop_otel.command.errors import InputError
from retsnoop_otel.kernel import syscall_hooks
from retsnoop_otel.kernel.attach_modes import BY_NAME
from retsnoop_otel.runtime.config import AGENT_NAMES, Limits
from retsnoop_otel.runtime.probe_set import capture_config
from retsnoop_otel.runtime.settings import run_settings
from retsnoop_otel.trace.flags import parse
from tests.fakes import probe_set_config


def _trace(*argv: str) -> object:
    return run_settings(parse(["--syscalls", "--origins-only", *argv], environ={}).config, {}, "/",
                        lambda _s, _n: None)


@pytest.mark.parametrize(("flag", "named"), [(["-T"], "-T"), (["-A"], "-A"), (["-J", "kprobe:map_create"], "-J"),
                                             (["--lbr"], "--lbr"), (["-U"], "-U"), (["-S"], "-S"),
                                             (["-a", "u:/bin/true:main"], "u:BINARY:GLOB functions")])
def test_trace_refuses_what_needs_sessions_naming_the_flag(flag: list[str], named: str) -> None:
    with pytest.raises(InputError) as exc:
        _trace(*flag)
    assert exc.value.message.startswith(f"--origins-only counts error origins from the functions' returns and keeps "
                                        f"no sessions, so {named} has nothing to record: drop {named}"), \
        exc.value.message


def test_trace_takes_filters_and_allow_globs() -> None:
    """Filters apply where a failing call is counted; -a adds functions to look into."""
    settings = _trace("-n", "myservice", "-p", "1", "-a", "array_map_alloc_check")
    assert settings.config.probe_sets[0].attach_mode == "origin_exits"  # type: ignore[attr-defined]


def test_the_entry_functions_are_the_syscall_presets() -> None:
    """One chain per syscall: entry functions that call each other would each end it (bpf/origins.bpf.h)."""
    with pytest.raises(InputError) as exc:
        run_settings(parse(["-e", "*sys_bpf", "--origins-only"], environ={}).config, {}, "/", lambda _s, _n: None)
    assert exc.value.message == ("--origins-only counts error origins per syscall, over the syscall preset's "
                                 "functions: add --syscalls (and filter with -n, -p or --cgroup)"), exc.value.message
    with pytest.raises(InputError) as exc:
        _trace("-e", "__x64_sys_bpf")
    assert exc.value.message.startswith("--origins-only takes its entry functions from the syscall preset (every "
                                        "syscall), which never call each other: drop -e"), exc.value.message


def test_the_agent_names_the_key() -> None:
    cfg = parse_config("probe_sets:\n  p:\n    syscalls: true\n    attach_mode: origin_exits\n    capture_args: true\n")
    with pytest.raises(InputError) as exc:
        run_settings(cfg.runtime, {}, "/", lambda _s, _n: None)
    assert "attach_mode: origin_exits counts error origins" in exc.value.message, exc.value.message
    assert "so capture_args has nothing to record: drop capture_args" in exc.value.message, exc.value.message


def test_no_sessions_the_sys_exit_tracepoint_alone_no_per_call_counts() -> None:
    """What the kernel side is loaded with: the syscalls end at the sys_exit tracepoint (origin_sys_exit) and no
    session starts at sys_enter, nothing reported, no per-function counts (their maps would hold zeros), no
    thread-context hooks."""
    ps = probe_set_config(syscalls=True, attach_mode="origin_exits")
    cfg = capture_config(ps, "origin_exits", Limits(), AGENT_NAMES)
    assert not cfg.func_counts and not cfg.app_context and not cfg.emit_calls
    assert not cfg.capture_success and not cfg.kernel_stack
    sessions = capture_config(ps, "kprobe_session", Limits(), AGENT_NAMES)
    assert sessions.syscall_entries and sessions.func_counts
    assert cfg.syscall_entries == sessions.syscall_entries  # the same entries leave the mode's links for the tracepoint
    assert syscall_hooks.for_mode(BY_NAME["origin_exits"]) == {"origin_sys_exit": "sys_exit"}
    assert syscall_hooks.for_mode(BY_NAME["kprobe_session"]) == syscall_hooks.SESSIONS
    loads: dict[str, bool] = {}
    obj = SimpleNamespace(program=lambda name: SimpleNamespace(set_autoload=lambda on: loads.__setitem__(name, on)))
    syscall_hooks.configure(obj, {0: (321,)}, syscall_hooks.for_mode(BY_NAME["origin_exits"]))  # type: ignore[arg-type]
    assert loads == {"origin_sys_exit": True, "sys_exit_session": False, "sys_enter_session": False}


def test_no_application_watcher_without_sessions() -> None:
    """The watcher checks processes for thread context to join sessions to: a mode without sessions starts none."""
    from retsnoop_otel.appctx.watched import watches
    assert watches(probe_set_config(syscalls=True))
    assert not watches(probe_set_config(syscalls=True, attach_mode="origin_exits"))
