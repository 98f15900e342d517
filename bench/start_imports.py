"""What a `trace` or `agent` start imports and opens before it touches the kernel: run on any host (no tracing needed).

    .venv/bin/python -m bench.start_imports [--list] [--base CHECKOUT]

Under tests/vm the package is read over 9p, where every stat and open an import makes is a round trip: the
number of modules and files a start touches is what its "python" and "imports" phases cost, more than their
size. Each run is a fresh interpreter that runs the package's `main` as `python -m retsnoop_otel ARGS` does, with
an audit hook (sys.addaudithook) counting the "open" events (a module's .pyc, an extension, a config, /proc) and
the import system's directory listings ("os.listdir", "os.scandir"); the modules imported and files opened by the
thread that reads the kernel's tables beside the start (symbols/read_ahead.py) are counted apart, as
"beside": they are not on the start's path. The counts are taken at the runtime's
privilege check, right after its inputs phase (flags or config, outputs) and before anything of the kernel: a
point a host that cannot trace reaches too, as root or not, before it refuses. The tree's bytecode and its code
bundle (retsnoop_otel/code_bundle.py) are written first, as tests/vm/run does. --base measures another checkout
(`git worktree add /tmp/base REV`) the same way. tests/unit/test_start_imports.py keeps the counts under a bound
with the same child.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from retsnoop_otel.code_bundle import write as write_bundle

ROOT = Path(__file__).resolve().parent.parent

# the child: the hook first, then the package as `python -m retsnoop_otel` would run it
CHILD = r"""
import sys, _thread
import atexit, os  # the harness's own, before the snapshot (json: when it writes, after it)
opens, listings, snap, beside_opens, beside_modules = [], [], {}, [], set()
main_thread = _thread.get_ident()
def hook(event, args):
    main = _thread.get_ident() == main_thread
    if event == "open" and isinstance(args[0], (str, bytes)):
        name = args[0] if isinstance(args[0], str) else args[0].decode(errors="replace")
        (opens if main else beside_opens).append(name)
    elif event in ("os.listdir", "os.scandir"):
        listings.append(str(args[0]))
    elif event == "import" and not main:
        beside_modules.add(args[0])
sys.addaudithook(hook)
before = set(sys.modules)
def snapshot(reached):
    if not snap:
        new = set(sys.modules) - before
        snap.update(reached=reached, modules=sorted(new - beside_modules), opens=list(opens),
                    listings=list(listings), interpreter_modules=len(before),
                    beside_modules=sorted(new & beside_modules), beside_opens=list(beside_opens))
from retsnoop_otel.runtime.deps import RuntimeDeps
init = RuntimeDeps.__init__
def deps_init(self, *args, **kwargs):
    init(self, *args, **kwargs)
    check = self.check_privileges
    def at_privileges():
        snapshot(True)
        return check()
    self.check_privileges = at_privileges
RuntimeDeps.__init__ = deps_init
out = sys.argv.pop(1)
def dump():
    import json
    snapshot(False)
    with open(out, "w") as f:
        json.dump(snap, f)
atexit.register(dump)
from retsnoop_otel.cli import main
sys.exit(main(sys.argv[1:]))
"""

# the runs: a text-only trace, a trace exporting OTLP, the minimal agent without and with an endpoint
RUNS: dict[str, tuple[list[str], dict[str, str]]] = {
    "trace text-only": (["trace", "--dry-run", "-e", "*sys_bpf"], {}),
    "trace --otlp-endpoint": (["trace", "--dry-run", "-e", "*sys_bpf", "--otlp-endpoint", "http://127.0.0.1:9"], {}),
    # no endpoint named: the agent exports to the OTLP default, http://localhost:4318
    "agent minimal": (["agent", "--config", "config/agent-minimal.yaml"], {}),
    "agent minimal, endpoint set": (["agent", "--config", "config/agent-minimal.yaml"],
                                    {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}),
    "agent minimal, OTLP off": (["agent", "--config", "config/agent-minimal.yaml"], {"OTEL_TRACES_EXPORTER": "none"}),
}
HEAVY = ("grpc", "google.protobuf", "opentelemetry", "prometheus_client", "yaml")
OURS_OPTIONAL = ("retsnoop_otel.export", "retsnoop_otel.workload", "retsnoop_otel.metrics", "retsnoop_otel.appctx")


@functools.cache
def prepare(root: Path) -> None:
    """The tree's bytecode and code bundle, once per process: every start measured reads the same."""
    subprocess.run([sys.executable, "-m", "compileall", "-qq", "retsnoop_otel"], cwd=root, check=False, timeout=300)
    write_bundle(str(root / "retsnoop_otel"))  # this interpreter's, as the child's


def measure(argv: Sequence[str], env: Mapping[str, str] = {}, root: Path = ROOT) -> dict:
    """One start in a fresh interpreter: the modules it imported and the files it opened up to the kernel step."""
    import tempfile
    prepare(root)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "snap.json")
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | dict(env)
        subprocess.run([sys.executable, "-c", CHILD, out, *argv], cwd=root, env=child_env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        with open(out) as f:
            return json.load(f)


def summary(snap: dict) -> dict:
    """Counts of one snapshot: modules (ours, the libraries'), files opened, directory listings."""
    mods = snap["modules"]
    return {"modules": len(mods), "ours": sum(m.startswith("retsnoop_otel") for m in mods),
            "opens": len(snap["opens"]), "listings": len(snap["listings"]),
            "beside": f"{len(snap.get('beside_modules', ()))}/{len(snap.get('beside_opens', ()))}",
            "heavy": sorted({h for h in HEAVY for m in mods if m == h or m.startswith(h + ".")}),
            "optional": sorted({o.split(".")[1] for o in OURS_OPTIONAL for m in mods if m.startswith(o + ".")})}


def main() -> int:
    args = sys.argv[1:]
    trees = {"this checkout": ROOT}
    if "--base" in args:
        trees["base"] = Path(args[args.index("--base") + 1]).resolve()
    print("| tree | run | modules imported (ours) | files opened | directory listings | beside: modules/files | "
          "libraries | our optional sub-packages |")
    print("|---|---|---|---|---|---|---|---|")
    snaps = {(tree, name): measure(argv, env, root)
             for tree, root in trees.items() for name, (argv, env) in RUNS.items()}
    for (tree, name), snap in snaps.items():
        s = summary(snap)
        reached = "" if snap["reached"] else " (privilege check not reached)"
        print(f"| {tree} | {name}{reached} | {s['modules']} ({s['ours']}) | {s['opens']} | {s['listings']} | "
              f"{s['beside']} | {', '.join(s['heavy']) or '-'} | {', '.join(s['optional']) or '-'} |")
    if "--list" in args:
        for (tree, name), snap in snaps.items():
            print(f"\n## {tree}: {name}\n" + "\n".join(snap["modules"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
