"""Guest side of the `make demo` check: run the demo exactly as the Makefile's `demo` target does.

`make demo` runs `tests/vm/run --kernel 6.12 -- python -m tests.demo`; here the same command line runs
in the batch's 6.12 boot (no boot of its own). On 6.1 it is not run. tests/test_demo_recipe.py keeps
DEMO_COMMAND and the Makefile recipe equal; host-side assertions: tests/vm/test_demo.py.
"""

from __future__ import annotations

import subprocess
import time

from tests.vm.guest_batch import budget

DEMO_KERNEL = "6.12"
DEMO_COMMAND = "python -m tests.demo"  # a shell command line, as tests/vm/run gets it from the Makefile
DEMO_TIMEOUT_S = 1500.0


@budget(DEMO_TIMEOUT_S + 300)
def scenario_demo(ctx) -> dict:
    start = time.monotonic()
    demo = ctx.spawn(DEMO_COMMAND)  # stdout and stderr merged, as in tests/vm/run's out.log
    try:
        demo.popen.wait(DEMO_TIMEOUT_S)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    rc = demo.terminate(timeout=60)  # exited already: reaps it and collects the last lines
    seconds = time.monotonic() - start
    ctx.log(f"demo exited {rc} in {seconds:.0f} s" + (" (timed out)" if timed_out else ""))
    return {"command": DEMO_COMMAND, "rc": rc, "timed_out": timed_out, "seconds": round(seconds, 1),
            "output": demo.output()}
