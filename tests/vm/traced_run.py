"""Guest-side helpers the scenarios share: which of our BPF programs are loaded, one tracer run around one
workload (started, or refused in one line; then stopped, and what it left loaded listed), and the outputs part of
an agent's config."""

from __future__ import annotations

import signal
import time

from retsnoop_otel.kernel.tracer import PROGRAM_NAMES

STARTED = r"Receiving data|retsnoop-otel: "  # trace's ready line, or its one-line refusal


def agent_outputs(endpoint: str, protocol: str | None = "grpc") -> str:
    """The end of a guest agent's config: spans to the OTLP `endpoint`, /metrics on 127.0.0.1 and logs as JSON
    (what the scenarios read). A template still: its `{metrics_port}` is filled by the config's own format()."""
    proto = f"    protocol: {protocol}\n" if protocol else ""
    return (f"exporter:\n  otlp:\n    endpoint: {endpoint}\n{proto}"
            'metrics:\n  listen: "127.0.0.1:{metrics_port}"\nlogging:\n  format: json\n')


def our_progs(ctx) -> list[str]:
    """Names of our programs loaded now (every name they have in the kernel): what a stop must leave none of."""
    return sorted(p.get("name", "") for p in ctx.bpf_prog_ids() if p.get("name", "") in PROGRAM_NAMES)


def traced_run(ctx, cmd: list[str], workload: list[str], wait_for: str, *, settle_s: float = 5.0,
               stop: signal.Signals = signal.SIGTERM, start_timeout: float = 300, wait_timeout: float = 180,
               workload_timeout: float = 120, progs_while_attached: bool = False) -> dict:
    """Start the tracer; once it is receiving, run the workload, wait for `wait_for` in the tracer's output and for
    its output to settle; stop it with `stop`. A tracer that refuses exits on its own, with its own code (a signal
    then would race that exit).

    Returns {"cmd", "started", "workload": {"rc", "out", "err"} (when started), "progs_while_attached" (when
    asked), "rc", "output", "progs_after"}."""
    tracer = ctx.spawn(cmd)
    result: dict = {"cmd": cmd}
    try:
        line = tracer.wait_for_line(STARTED, timeout=start_timeout)
        result["started"] = "Receiving data" in line.group(0)
        if result["started"]:
            if progs_while_attached:
                result["progs_while_attached"] = our_progs(ctx)
            rc, out, err = ctx.run(workload, timeout=workload_timeout)
            result["workload"] = {"rc": rc, "out": out, "err": err}
            tracer.wait_for_line(wait_for, timeout=wait_timeout)
            tracer.wait_output_settled(settle_s, timeout=120)
        else:
            tracer.wait(120)
    finally:
        result["rc"] = tracer.terminate(timeout=300, sig=stop)
        result["output"] = tracer.output()
    time.sleep(1)
    result["progs_after"] = our_progs(ctx)
    return result
