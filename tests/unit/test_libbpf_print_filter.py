"""libbpf's debug messages stop in C (kernel/print_filter.c); warnings still reach the captured log.

Each case runs in a fresh interpreter: libbpf's print hook is one per process, set when the binding loads.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel import libbpf_abi

OBJECT = Path(lb.__file__).resolve().parent.parent / "bpf" / "retsnoop.bpf.o"

SCRIPT = """
import json, sys
from retsnoop_otel.kernel import libbpf as lb, libbpf_abi
if sys.argv[1] == "missing":
    libbpf_abi.PRINT_FILTER = "/nonexistent/libprint_filter.so"
levels = []
on_print = lb._Libbpf._on_print
lb._Libbpf._on_print = lambda self, level, fmt, args: (levels.append(level), on_print(self, level, fmt, args))[1]
lb.BpfObject.open_file(sys.argv[2]).close()
try:
    lb.BpfObject.open_file(sys.argv[3])
    log = []
except lb.LibbpfError as exc:
    log = exc.log
print(json.dumps({"levels": sorted(set(levels)), "debug": levels.count(2), "log": log}))
"""


def _run(filter_lib: str, tmp_path: Path) -> dict:
    bad = tmp_path / "not-elf.bpf.o"
    bad.write_bytes(b"not an ELF file")
    out = subprocess.run([sys.executable, "-c", SCRIPT, filter_lib, str(OBJECT), str(bad)], capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_debug_messages_stop_in_c_and_warnings_reach_the_log(tmp_path: Path) -> None:
    assert Path(libbpf_abi.PRINT_FILTER).exists() and OBJECT.exists(), "`make bpf` builds them"
    unfiltered = _run("missing", tmp_path)
    assert unfiltered["debug"] > 10  # what the filter saves: opening the object alone prints this many
    filtered = _run("present", tmp_path)
    assert filtered["debug"] == 0 and 0 in filtered["levels"]  # warnings pass
    assert any("elf" in line.lower() for line in filtered["log"]), filtered["log"]
