"""What the runtime reaches outside itself through: the kernel, the network, the clock and the host's files.

One record of callables, so the whole lifecycle runs in unit tests with fakes (tests/fakes.py) and the
product passes nothing.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TextIO

from retsnoop_otel.export.otlp_settings import OtlpSettings
from retsnoop_otel.export.resource import Resource, build_resource
from retsnoop_otel.runtime.config import SymbolsConfig
from retsnoop_otel.runtime.environment import (
    KernelEnv,
    check_privileges,
    find_vmlinux,
    kernel_state,
    load_kernel_env,
)
from retsnoop_otel.runtime.probe_set import TracerFactory, real_tracer_factory
from retsnoop_otel.workload.k8s_settings import KubeSettings

if TYPE_CHECKING:
    from retsnoop_otel.appctx.process_readers import AppSources
    from retsnoop_otel.workload.resolver import WorkloadResolver


def _build_sender(settings: OtlpSettings) -> Any:
    from retsnoop_otel.export.senders import build_sender  # grpc and protobuf load only for OTLP runs
    return build_sender(settings)


def _app_sources(proc_root: str, stacks: bool, lines: bool) -> AppSources:
    from retsnoop_otel.appctx.process_readers import AppSources  # only when a probe set reads the application
    return AppSources.from_proc(proc_root, stacks, lines)


def _build_resolver(root: str, monotonic: Callable[[], float], kube: KubeSettings | None, log: Any) -> WorkloadResolver:
    from retsnoop_otel.workload.resolver import build_resolver
    return build_resolver(root, monotonic, kube, log)


def _boot_to_wall_offset() -> int:
    from retsnoop_otel.capture.clock import measure_boot_to_wall_offset
    return measure_boot_to_wall_offset()


class RuntimeDeps:
    """Everything that touches the kernel, the network, the clock or the host's files."""

    __slots__ = ("load_env", "kernel_state", "find_vmlinux", "check_privileges", "tracer_factory", "make_sender",
                 "boot_to_wall_offset", "make_resource", "console", "monotonic", "environ", "root", "app_sources",
                 "make_workloads")

    def __init__(self, load_env: Callable[[SymbolsConfig, str | None, tuple[str, str | None] | None], KernelEnv]
                 = load_kernel_env, kernel_state: Callable[[], object] = kernel_state,
                 find_vmlinux: Callable[[SymbolsConfig, str], str | None] = find_vmlinux,
                 check_privileges: Callable[[], None] = check_privileges,
                 tracer_factory: TracerFactory = real_tracer_factory,
                 make_sender: Callable[[OtlpSettings], Any] = _build_sender,
                 boot_to_wall_offset: Callable[[], int] = _boot_to_wall_offset,
                 make_resource: Callable[[Mapping[str, str]], Resource] = build_resource, console: TextIO | None = None,
                 monotonic: Callable[[], float] = time.monotonic, environ: Mapping[str, str] | None = None,
                 root: str = "/", app_sources: Callable[[str, bool, bool], AppSources] = _app_sources,
                 make_workloads: Callable[[str, Callable[[], float], KubeSettings | None, Any], WorkloadResolver]
                 = _build_resolver) -> None:
        self.load_env = load_env
        self.kernel_state = kernel_state  # a reload keeps the loaded env while this is unchanged
        self.find_vmlinux = find_vmlinux
        self.check_privileges = check_privileges
        self.tracer_factory = tracer_factory
        self.make_sender = make_sender  # -> export.senders.Sender
        self.boot_to_wall_offset = boot_to_wall_offset
        self.make_resource = make_resource
        self.console = sys.stdout if console is None else console  # sys.stdout as of construction
        self.monotonic = monotonic
        self.environ = os.environ if environ is None else environ
        self.root = root  # where /proc is read for the process and BPF statistics metrics
        self.app_sources = app_sources  # (proc root, user stacks, lines)
        # (root, clock, pod watch settings or None, log) -> the workload resolver; the watch starts with it
        self.make_workloads = make_workloads
