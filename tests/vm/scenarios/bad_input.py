"""Guest side of the bad-input acceptance test (issue 3): each bad command line gets one clear message.

Every case runs `retsnoop-otel trace` with one thing wrong (and otherwise a small, valid function set,
so a wrongly accepted command would attach quickly), then lists the loaded BPF programs. Host-side
assertions: tests/vm/test_bad_input.py.
"""

from __future__ import annotations

import glob
import os
import socket
import time
from pathlib import Path

from tests.tls_certs import leaf, make_ca
from tests.vm.guest_batch import budget
from tests.vm.scenarios.filters import BPF_SET, PY
from tests.vm.traced_run import our_progs

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _kernel_cache_dirs() -> list[Path]:
    """Where tests/vm/fetch-kernel keeps unpacked kernels (the guest sees the host's filesystem)."""
    roots = [os.environ.get("RETSNOOP_OTEL_CACHE", ""), os.path.join(os.environ.get("XDG_CACHE_HOME", ""),
                                                                     "retsnoop-otel"),
             os.path.expanduser("~/.cache/retsnoop-otel"), "/root/.cache/retsnoop-otel"]
    return [Path(r) / "kernels" for r in roots if r and (Path(r) / "kernels").is_dir()]


def _other_kernel_files() -> dict[str, str]:
    """A DWARF vmlinux and a vmlinuz of a kernel other than the running one, when the cache has them."""
    release = os.uname().release
    found: dict[str, str] = {}
    for kdir in _kernel_cache_dirs():
        for path in sorted(glob.glob(str(kdir / "*/usr/lib/debug/boot/vmlinux-*"))):
            if not path.endswith(release):
                found.setdefault("vmlinux", path)
        for path in sorted(glob.glob(str(kdir / "*/boot/vmlinuz-*"))):
            if not path.endswith(release):
                found.setdefault("vmlinuz", path)
    return found


def _cases(others: dict[str, str]) -> dict[str, list[str]]:
    trace = [PY, "-m", "retsnoop_otel", "trace"]
    cases = {
        "unknown_flag": [*trace, *BPF_SET, "--no-such-flag"],
        "unknown_errno": [*trace, *BPF_SET, "-x", "-EWHATEVER"],
        "unbalanced_module_glob": [*trace, "-e", "*sys_bpf", "-a", "array_map_* [bpf"],
        "empty_glob": [*trace, "-e", ""],
        "entry_matches_nothing": [*trace, "-e", "retsnoop_otel_no_such_func*", "-a", "array_map_alloc_check"],
        # an ELF whose build-id is not the running kernel's: the other kernel's DWARF vmlinux if cached
        "vmlinux_other_build": [*trace, *BPF_SET, "-k", others.get("vmlinux", "/bin/ls")],
        "not_root": [*NOBODY, *trace, *BPF_SET],
        # QEMU exposes no LBR: --lbr must be refused before anything loads (issue 4)
        "lbr_unavailable": [*trace, *BPF_SET, "--lbr=any_return,call"],
        "lbr_bad_spec": [*trace, *BPF_SET, "--lbr=sometimes"],
        # issue 10: every input is checked before anything is loaded into the kernel
        "endpoint_scheme": [*trace, *BPF_SET, "--otlp-endpoint", "ftp://collector:4317"],
        # an OTEL_* variable is warned about and ignored: the run goes on, here to the refusal of a user without
        # privileges (as root it would attach and run)
        # (ENV below; through the environment of the run, not env(1), whose exec as nobody was refused where a parent
        # folder of the checkout is closed to others)
        "endpoint_env": [*NOBODY, *trace, *BPF_SET],
        "metrics_port_busy": [*trace, *BPF_SET, "--metrics-addr", "127.0.0.1", "--metrics-port", "{busy}"],
        "metrics_port_privileged": [*NOBODY, *trace, *BPF_SET, "--metrics-port", "80"],
        "trace_json_unwritable": [*trace, *BPF_SET, "-T", "--trace-json", "/proc/version/t.json"],
        "agent_config": [PY, "-m", "retsnoop_otel", "agent", "--config", "{bad_config}"],
        # issue 12: the web config of /metrics (TLS, basic auth) is loaded before anything else
        "web_config_key_mismatch": [*trace, *BPF_SET, "--metrics-addr", "127.0.0.1", "--metrics-port", "9464",
                                    "--web.config.file", "{web_mismatch}"],
        "agent_web_config": [PY, "-m", "retsnoop_otel", "agent", "--config", "{agent_web}"],
        # issue 47: --check is the run without attaching: a set whose every entry is denied is the same bad input
        "agent_check_all_denied": [PY, "-m", "retsnoop_otel", "agent", "--check", "{all_denied}"],
        "agent_all_denied": [PY, "-m", "retsnoop_otel", "agent", "--config", "{all_denied}"],
    }
    if "vmlinuz" in others:  # a compressed boot image is not an ELF vmlinux at all
        cases["vmlinux_not_elf"] = [*trace, *BPF_SET, "-k", others["vmlinuz"]]
    return cases


ENV = {"endpoint_env": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}}


def _web_configs(d: Path) -> dict[str, Path]:
    """A web config whose key belongs to another certificate, and an agent config naming a web config whose
    user has a password where its bcrypt hash belongs."""
    make_ca(d, "ca")
    leaf(d, "server", "ca", "IP:127.0.0.1")
    leaf(d, "other", "ca", "IP:127.0.0.1")
    mismatch, bad_hash, agent = d / "web-mismatch.yml", d / "web-hash.yml", d / "agent-web.yaml"
    mismatch.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: other.key\n")
    bad_hash.write_text("basic_auth_users:\n  alice: secret\n")
    agent.write_text("probe_sets:\n  - name: x\n    entry: ['*sys_bpf']\n    mode: metrics\n"
                     f"metrics:\n  listen: '127.0.0.1:9464'\n  web_config_file: {bad_hash}\nlogging:\n  format: text\n")
    return {"web_mismatch": mismatch, "agent_web": agent}


@budget(400)
def scenario_bad_input(ctx) -> dict:
    t0 = time.monotonic()
    others = _other_kernel_files()
    result: dict = {"other_kernel_files": others, "progs_before": our_progs(ctx), "cases": {}}
    bad_config = Path(ctx.tmpdir) / "agent.yaml"
    bad_config.write_text("probe_sets:\n  - name: x\n    entry: 5\n")
    web = _web_configs(Path(ctx.tmpdir))
    web["all_denied"] = Path(ctx.tmpdir) / "all-denied.yaml"
    web["all_denied"].write_text("probe_sets:\n  - name: x\n    entry: ['*sys_bpf']\n    deny: ['*sys_bpf']\n"
                                 "    mode: metrics\nlogging:\n  format: text\n")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    for name, cmd in _cases(others).items():
        cmd = [c.format(busy=busy.getsockname()[1], bad_config=bad_config, **web) for c in cmd]
        start = time.monotonic()
        rc, out, err = ctx.run(cmd, timeout=300, env=ENV.get(name))
        secs = round(time.monotonic() - start, 1)
        ctx.log(f"{name}: exit {rc} in {secs} s: {err.strip()[:200]}")
        result["cases"][name] = {"cmd": cmd, "rc": rc, "stdout": out, "stderr": err, "seconds": secs,
                                 "progs_after": our_progs(ctx)}
    result["guest_seconds"] = round(time.monotonic() - t0, 1)
    return result
