"""The agent with a probe set of about 10,000 functions: start, attach, RSS, per-call cost, SIGHUP reload, stop.

Run as root on a kernel that allows tracing (in the VM, one boot):

    flock /tmp/retsnoop-vm.lock tests/vm/run --kernel 6.12 -- python -m bench.agent_scale

The function set is found with globs: `*sys_bpf` as the entry, then globs of subsystems the VM leaves
idle (COLD_PREFIXES), in order of how many traceable functions each adds (available_filter_functions
minus the built-in deny list, as discovery counts them), until --functions is reached. The agent runs with one probe
set (stack mode, auto attach mode), JSON logs and /metrics; its own log line "agent started"
carries its start-up phases (Python, imports, kernel reads, discovery, load, attach), "config
reloaded" those of the reload. Reported: start (command to "agent started"), attach, RSS after
start and after each of --reloads reloads, BPF ns and workload slowdown per failing bpf(BPF_MAP_CREATE) call
(kernel.bpf_stats_enabled switched on only while the workload runs), reload (SIGHUP to "config
reloaded": the new set is attached before the old one is detached), and stop (SIGTERM to exit).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.harness import (
    BPF_STATS,
    ROOT,
    build_workload,
    discovered,
    prog_stats,
    run_workload,
    set_stats,
    trace_argv,
)

CONFIG = """\
probe_sets:
  - name: scale
    entry: ["*sys_bpf"]
    allow: {allow}
    mode: stack
metrics:
  listen: "127.0.0.1:{port}"
logging:
  format: json
"""


# Subsystems a VM that only runs the workload leaves idle (no network traffic, no disks, no devices
# being probed): a large set of them is the agent's common case, a few hot functions among many cold
# ones. Whole letters (`s*`) would take in the scheduler, locking and page-fault paths, whose calls
# under emulation slow everything the bench times by orders of magnitude.
COLD_PREFIXES = (
    "tcp_", "udp", "inet", "ip_", "ip6", "ipv6_", "ipv4_", "icmp", "ping_", "raw_", "arp_", "neigh_",
    "fib", "rtnl_", "rtm_", "netlink_", "genl_", "nla_", "netdev_", "dev_", "ethtool", "devlink_",
    "sk_", "skb_", "sock_", "unix_", "xfrm", "nf_", "qdisc_", "tcf_", "tc_", "xdp_", "page_pool",
    "acpi_", "pci", "efi", "pnp_", "platform_", "driver_", "bus_", "device_", "of_",
    "input_", "hid_", "serio_", "usb_", "clk_", "regulator_", "gpio", "i2c_", "thermal_", "cpufreq_",
    "pm_", "rtc_", "crypto_", "blk", "bio_", "bdev_", "elv_", "scsi_", "ata_", "md_", "dm_",
    "ext4_", "jbd2_", "fat_", "nfs", "key_", "keyring_", "x509_", "pkcs7_", "asymmetric_",
    "audit_", "mce_", "iommu_", "intel_", "amd_", "kvm_", "hugetlb", "swap_", "zswap", "zpool_",
    "shmem_", "ipc_", "msg_", "mq_", "shm_", "seccomp_", "cgroup_", "perf_", "ring_buffer_",
)


def pick_globs(target: int, mode: str = "kprobe_multi") -> tuple[list[str], int]:
    """Cold-subsystem globs, largest first, until discovery would attach at least `target` functions (the
    product's own discovery: `trace --dry-run` on all the candidates, bench/harness.py discovered)."""
    cands = [f"{p}*" for p in COLD_PREFIXES]
    disc, _btf_id = discovered(trace_argv(["*sys_bpf"], cands, mode=mode))
    per_glob: dict[str, int] = {}
    for f in disc.funcs:
        if not f.is_entry:
            first = next((g for g in cands if f.name.startswith(g[:-1])), None)
            if first:
                per_glob[first] = per_glob.get(first, 0) + 1
    count = disc.entry_count
    globs: list[str] = []
    for glob, n in sorted(per_glob.items(), key=lambda kv: -kv[1]):
        if count >= target:
            break
        globs.append(glob)
        count += n
    return globs, count


class Log:
    """The agent's JSON log lines (stderr) as they arrive."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.events: list[tuple[float, dict]] = []
        self.text: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:  # noqa: ANN001 - a text pipe
        for line in stream:
            with self._cond:
                self.text.append(line.rstrip())
                try:
                    self.events.append((time.monotonic(), json.loads(line)))
                except ValueError:
                    pass
                self._cond.notify_all()

    def wait(self, msg: str, timeout: float, after: int = 0) -> tuple[float, dict] | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for t, e in self.events[after:]:
                    if e.get("msg") == msg:
                        return t, e
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 1.0))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def phases_of(event: dict) -> dict[str, float]:
    return {k[:-3]: v for k, v in event.items() if k.endswith("_ms")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--functions", type=int, default=10_000)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--port", type=int, default=9479)
    ap.add_argument("--reloads", type=int, default=3, help="SIGHUPs in a row (RSS reported after each)")
    args = ap.parse_args()
    globs, count = pick_globs(args.functions)
    print(json.dumps({"globs": globs, "functions": count}), flush=True)
    out: dict = {"release": os.uname().release, "globs": globs, "discovered": count}
    with tempfile.TemporaryDirectory(prefix="agent-scale-") as tmpdir:
        tmp = Path(tmpdir)
        workload = build_workload(tmp)
        set_stats(False)
        base = sorted(run_workload(workload, args.calls) for _ in range(3))[1]
        cfg = tmp / "agent.yaml"
        cfg.write_text(CONFIG.format(allow=json.dumps(globs), port=args.port))
        env = dict(os.environ, RETSNOOP_OTEL_CACHE=str(tmp / "cache"))
        for run in ("cold", "warm"):  # the first start fills the kernel cache, the second uses it
            before = set(prog_stats())
            t0 = time.monotonic()
            proc = subprocess.Popen([sys.executable, "-m", "retsnoop_otel", "agent", "--config", str(cfg)], cwd=ROOT,
                                    env=env, text=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE)
            log = Log(proc)
            r: dict = {}
            try:
                started = log.wait("agent started", args.timeout)
                if started is None:
                    r["error"] = "never started: " + " | ".join(log.text[-10:])
                    out[run] = r
                    continue
                r["start_s"] = started[0] - t0
                r["start_phases_ms"] = phases_of(started[1])
                attached = log.wait("probe set attached", 10)
                r["attached"] = attached[1].get("functions") if attached else None
                r["attach_mode"] = attached[1].get("attach_mode") if attached else None
                r["rss_mb_started"] = rss_mb(proc.pid)
                if run == "warm":
                    ours = [i for i in prog_stats() if i not in before]
                    s0 = prog_stats()
                    set_stats(True)
                    r["ns_per_call"] = run_workload(workload, args.calls)
                    set_stats(False)
                    s1 = prog_stats()
                    both = [i for i in ours if i in s0 and i in s1]
                    r["bpf_ns_per_call"] = sum(s1[i][1] - s0[i][1] for i in both) / args.calls
                    r["probe_runs_per_call"] = sum(s1[i][2] - s0[i][2] for i in both) / args.calls
                    r["untraced_ns_per_call"] = base
                    time.sleep(5)  # let the agent export what the workload produced
                    for i in range(args.reloads):  # RSS after each: a leak grows, allocator slack levels off
                        n = len(log.events)
                        t1 = time.monotonic()
                        proc.send_signal(signal.SIGHUP)
                        reloaded = log.wait("config reloaded", args.timeout, after=n)
                        if reloaded is None:
                            r["reload_error"] = " | ".join(log.text[-10:])
                            break
                        if i == 0:
                            r["reload_s"] = reloaded[0] - t1
                            r["reload_phases_ms"] = phases_of(reloaded[1])
                        r.setdefault("rss_mb_reloads", []).append(rss_mb(proc.pid))
                t2 = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=args.timeout)
                r["stop_s"] = time.monotonic() - t2
            finally:
                set_stats(False)
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            out[run] = r
            print(json.dumps({run: r}), flush=True)
    print(report(out))
    return 0


def report(out: dict) -> str:
    w = out.get("warm", {})
    c = out.get("cold", {})
    lines = [f"kernel {out['release']}; {out['discovered']:,} functions (globs {' '.join(out['globs'])}), "
             f"attached {w.get('attached')} in {w.get('attach_mode')} mode", "",
             "| | value |", "|---|---|"]

    def row(label: str, value: object) -> None:
        lines.append(f"| {label} | {value} |")

    def ms(d: dict, key: str) -> str:
        v = d.get(key)
        return "-" if v is None else f"{v / 1000:.2f} s"

    row("start, empty kernel cache (command to \"agent started\")", f"{c.get('start_s', 0):.1f} s")
    row("start, kernel cache filled", f"{w.get('start_s', 0):.1f} s")
    sp = w.get("start_phases_ms", {})
    row("of which Python's own start", ms(sp, "python"))
    for name in ("imports", "inputs", "btf", "features", "symbols", "discovery", "load", "attach", "outputs"):
        row(f"of which {name}", ms(sp, name))
    row("RSS after start", f"{w.get('rss_mb_started', 0):.0f} MB")
    if "ns_per_call" in w:
        slow = w["ns_per_call"] - w["untraced_ns_per_call"]
        row("workload per call, untraced / traced", f"{w['untraced_ns_per_call'] / 1000:.1f} us / "
            f"{w['ns_per_call'] / 1000:.1f} us (+{slow / 1000:.1f} us)")
        row("BPF ns per workload call (probe runs per call)", f"{w['bpf_ns_per_call']:,.0f} "
            f"({w['probe_runs_per_call']:.1f})")
    rp = w.get("reload_phases_ms", {})
    row("SIGHUP reload, the first (new set attached, then the old one detached)", f"{w.get('reload_s', 0):.1f} s")
    for name in ("symbols", "discovery", "load", "attach", "btf"):
        row(f"of which {name}", ms(rp, name))
    row("RSS after each reload", " / ".join(f"{m:.0f} MB" for m in w.get("rss_mb_reloads", [])) or "-")
    row("stop (SIGTERM to exit)", f"{w.get('stop_s', 0):.1f} s")
    for key in ("error", "reload_error"):
        for d in (c, w):
            if key in d:
                lines.append(f"\n{key}: {d[key]}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main() if BPF_STATS.parent.exists() else 2)
