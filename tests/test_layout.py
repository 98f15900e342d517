"""The package's shape: no import cycle between modules or sub-packages, the layers import downwards only,
no module over 450 lines (nor a BPF source much over 500), and no private name of an OpenTelemetry package anywhere
in the product. Also the shape of bench/ (one package, run with `python -m bench.NAME`) and that no test module
imports another.

Imports are read from the source (every import statement, also those inside functions and under
TYPE_CHECKING), so a cycle hidden behind a lazy import fails here too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "retsnoop_otel"
MAX_LINES = 450  # a module of the package (issue 44)
MAX_BPF_LINES = 500  # a source of bpf/, give or take 5%
# Sub-packages from the bottom up: each may import only those before it (and the top-level __init__).
# command/ holds what every command shares (exit codes, refusals, event log, --help layout) and knows no tracing.
LAYERS = ("command", "inputs", "publisher", "capture", "kernel", "symbols", "appctx", "workload", "render", "export",
          "metrics", "runtime", "trace", "agent")
# code_bundle: how the package's own modules are loaded, installed by its __init__ before any layer is imported
TOP_LEVEL = {"retsnoop_otel", "retsnoop_otel.__main__", "retsnoop_otel.cli", "retsnoop_otel.simfail",
             "retsnoop_otel.code_bundle"}


def modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The package modules that `name` imports, resolved to module names."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: up node.level - 1 packages from this one
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: set(imports(name, path, known)) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules() -> None:
    assert cycles(graph()) == []


def test_sub_packages_import_downwards_only() -> None:
    wrong = []
    for module, targets in graph().items():
        here = layer(module)
        for target in targets:
            there = layer(target)
            if module in TOP_LEVEL or target == "retsnoop_otel":
                continue
            if there is None:
                wrong.append(f"{module} -> {target} (a command module)")
            elif here is not None and here != there and LAYERS.index(there) > LAYERS.index(here):
                wrong.append(f"{module} ({here}) -> {target} ({there})")
    assert wrong == []


# side by side rather than above one another: neither imports the other
SIBLINGS = {("export", "render"), ("render", "export"), ("metrics", "render")}


def test_exporters_and_the_console_view_are_independent() -> None:
    """export/ encodes and sends; render/ writes text for people: what both need lives below them."""
    wrong = [f"{m} -> {t}" for m, targets in graph().items() for t in targets if (layer(m), layer(t)) in SIBLINGS]
    assert wrong == []


def test_every_module_sits_in_a_layer() -> None:
    assert {m for m in modules() if layer(m) is None} == TOP_LEVEL


def test_no_module_of_the_package_is_over_450_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in PKG.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_no_bpf_source_is_much_over_500_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "bpf").glob("*.[ch]")
            if (n := len(p.read_text().splitlines())) > MAX_BPF_LINES * 1.05}
    assert long == {}


def test_no_private_name_of_an_opentelemetry_package() -> None:
    """Only public APIs: a private module or name breaks on the next release of the library."""
    private = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("opentelemetry"):
                names = [node.module, *(a.name for a in node.names)]
                private += [f"{name}: {n}" for n in names if any(p.startswith("_") for p in n.split("."))]
            if isinstance(node, ast.Import):
                private += [f"{name}: {a.name}" for a in node.names if a.name.startswith("opentelemetry")
                            and any(p.startswith("_") for p in a.name.split("."))]
    assert private == []


def test_bench_scripts_import() -> None:
    """The benchmarks are scripts nothing else runs: importing them at least keeps them in step with the code."""
    import importlib
    for path in sorted((ROOT / "bench").glob("[!_]*.py")):
        importlib.import_module(f"bench.{path.stem}")


def imported_modules(path: Path) -> Iterator[str]:
    """Every module an import statement of `path` names (`from a import b` names a.b too: b may be a module)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


# Test support that benches use too (the SDK-object span oracle, the openssl test certificates). It lives in tests/
# and imports nothing of tests/ or bench/, so a bench that imports it is tied to nothing else of the tests.
SHARED_TEST_SUPPORT = {"tests.oracle_spans", "tests.tls_certs", "tests.command_runs"}


def test_bench_is_a_package_whose_benches_share_one_module() -> None:
    """Each bench runs as `python -m bench.NAME`: none edits sys.path, none imports another bench (what several use
    is in bench.harness), and of tests/ only SHARED_TEST_SUPPORT (the tests may import bench, not the reverse)."""
    libraries = {"bench.harness", "bench.kprofile", "bench.start_path", "bench.syscall_loop"}
    bad = []
    for path in sorted((ROOT / "bench").glob("*.py")):
        if "sys.path" in path.read_text():
            bad.append(f"{path.name}: sys.path")
        for name in imported_modules(path):
            shared = name in SHARED_TEST_SUPPORT or name.rpartition(".")[0] in SHARED_TEST_SUPPORT
            if name.split(".")[0] == "tests" and not shared or name.count(".") == 1 and name.startswith("bench.") and (
                    (ROOT / "bench" / f"{name.split('.')[1]}.py").exists() and name not in libraries):
                bad.append(f"{path.name}: {name}")
    assert bad == []


def test_the_test_support_benches_use_imports_neither_tests_nor_bench() -> None:
    bad = [f"{name}: {m}" for name in sorted(SHARED_TEST_SUPPORT)
           for m in imported_modules(ROOT / f"{name.replace('.', '/')}.py") if m.split(".")[0] in ("tests", "bench")]
    assert bad == []


# What a bench that measures the tool must not rebuild (issue 44 point 5): the pipeline below the runtime. Such a bench
# goes through the product's entry points instead, the command (`python -m retsnoop_otel trace|agent`) or the runtime
# started in process (bench/harness.py: discovered, started), so that it measures the start users run.
BELOW_RUNTIME = {"retsnoop_otel.kernel.tracer", "retsnoop_otel.symbols.discovery", "retsnoop_otel.symbols.user_funcs"}
PIPELINE_CALLS = {"Tracer", "discover", "discover_user", "in_binary"}
PIPELINE_IN_CODE_TEXT = ("Tracer(", "discovery.discover(", "kernel import tracer", "kernel.tracer import",
                         "symbols import discovery", "symbols.discovery import")  # code run as `python -c TEXT`
# The benches that may, and why. Each must still do it (a stale entry fails too).
BELOW_RUNTIME_BENCHES = {
    # compares BPF programs the product does not have (bench/probe_variants.bpf.c) with ours, in configurations no
    # flag asks for (its own process traced: the workload runs in it; no stack; no record), on an exact cut of the
    # function set; that set itself comes from the product's discovery (harness.discovered)
    "probe_cost.py",
    # --kernel-maps: the BPF object loaded for synthetic functions, nothing attached, its maps filled from user space:
    # a unit measurement of the scrape's map reads (the agent's own cost per call is measured on the agent command)
    "metrics_cost.py",
    # the kernel tables' readers and discovery timed as units over files (--root: a copy of a guest's), nothing
    # attached; the start's own phases are measured on the command (bench/start_compare.py)
    "kernel_tables_cost.py",
}


def pipeline_uses(path: Path) -> list[str]:
    """Where a bench builds the pipeline below the runtime itself: imports, calls, and code it runs as text."""
    found = [f"import {m}" for m in imported_modules(path) if m in BELOW_RUNTIME]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
            if name in PIPELINE_CALLS:
                found.append(f"line {node.lineno}: {name}()")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [f"line {node.lineno}: {t!r} in code text" for t in PIPELINE_IN_CODE_TEXT if t in node.value]
    return found


def test_benches_measure_through_the_products_entry_points() -> None:
    """No bench constructs kernel.tracer.Tracer or runs symbols discovery itself, except BELOW_RUNTIME_BENCHES: when
    the runtime changes (a phase, the privilege check, the mode choice), a bench wiring its own pipeline would
    measure a start no user runs."""
    uses = {path.name: pipeline_uses(path) for path in sorted((ROOT / "bench").glob("*.py"))}
    assert {name: u for name, u in uses.items() if u and name not in BELOW_RUNTIME_BENCHES} == {}
    assert sorted(name for name in BELOW_RUNTIME_BENCHES if not uses.get(name)) == []


def test_no_module_of_the_tests_imports_a_test_module() -> None:
    """What several test modules share (fakes, oracle checks, dashboard readers) is in helper modules such as
    tests/fakes.py, never in a test module: importing one would tie its tests to the importer's."""
    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for name in imported_modules(path):
            if name.split(".")[0] == "tests" and name.rpartition(".")[2].startswith("test_"):
                bad.append(f"{path.relative_to(ROOT)}: {name}")
    assert bad == []


def test_no_two_test_modules_share_a_basename() -> None:
    """pytest imports test modules by basename (rootdir-relative packages are not used): a second
    test_x.py elsewhere stops the whole collection."""
    seen: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}


MODES_HOME = (PKG / "kernel" / "modes", PKG / "kernel" / "attach_modes.py")


def _outside_the_modes() -> Iterator[Path]:
    """The package's modules but the kernel modes' (kernel/modes/) and their registry."""
    for path in sorted(PKG.rglob("*.py")):
        if not any(path == home or home in path.parents for home in MODES_HOME):
            yield path


def test_the_attach_modes_are_listed_only_in_their_registry() -> None:
    """A new kernel attach mode is a module of kernel/modes/, a user mode a record of kernel/uprobes.py (issue 44): no
    module outside kernel/modes/ and the registry spells out the list of modes, kernel or user (three or more names
    in one tuple, list, set or dict literal). The benches' maps to a peer's nearest mode are theirs."""
    from retsnoop_otel.kernel.attach_modes import NAMES, USER_NAMES
    listed = []
    for path in _outside_the_modes():
        for node in ast.walk(ast.parse(path.read_text())):
            items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None) \
                if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else None
            for modes in (NAMES, USER_NAMES):
                names = {i.value for i in items or () if isinstance(i, ast.Constant) and i.value in modes}
                if len(names) >= min(3, len(modes)):
                    listed.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not listed, listed


# Mode names that are also the name of something else in a module: -J's injected probe kinds (kprobe:FUNC).
OTHER_MEANINGS = {"capture/inject.py": {"kprobe"}, "kernel/inject_attach.py": {"kprobe"}}


def mode_branches(tree: ast.AST, names: frozenset[str]) -> Iterator[tuple[int, str]]:
    """(line, name) where code decides by a mode's name: a comparison with it (==, !=, in, not in, also in a
    literal tuple, list or set compared with), a dict keyed by it, an index by it, or a match case on it."""
    def named(node: ast.AST | None) -> Iterator[str]:
        if isinstance(node, ast.Constant) and node.value in names:
            yield node.value
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            for elt in node.elts:
                yield from named(elt)

    for node in ast.walk(tree):
        found: list[ast.AST | None] = []
        if isinstance(node, ast.Compare):
            found = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):
            found = list(node.keys)
        elif isinstance(node, ast.Subscript):
            found = [node.slice]
        elif isinstance(node, ast.MatchValue):
            found = [node.value]
        for part in found:
            yield from ((node.lineno, name) for name in named(part))


def test_mode_branch_finder() -> None:
    code = ("if mode == 'kprobe': pass\nx = m in ('a', 'fentry')\nT = {'kprobe': 1}\ny = P['fentry']\n"
            "match mode:\n    case 'fentry': pass\nz = 'kprobe' if r else 'kretprobe'\nf(mode='fentry')\n")
    found = list(mode_branches(ast.parse(code), frozenset({"kprobe", "fentry"})))
    assert found == [(1, "kprobe"), (2, "fentry"), (3, "kprobe"), (4, "fentry"), (6, "fentry")]


def test_no_module_decides_by_an_attach_modes_name() -> None:
    """What a mode does differently is in its module (issue 44): outside kernel/modes/ and the registry no code
    compares with a mode's name, keys a table by it or looks something up by it; it asks the mode's object
    (attach_modes.BY_NAME, uprobes.BY_NAME) instead. The words that mean something else in a module are listed in
    OTHER_MEANINGS."""
    from retsnoop_otel.kernel.attach_modes import NAMES, USER_NAMES
    names = frozenset((*NAMES, *USER_NAMES))
    found = []
    for path in _outside_the_modes():
        other = OTHER_MEANINGS.get(str(path.relative_to(PKG)), set())
        found += [f"{path.relative_to(ROOT)}:{line}: {name}" for line, name in mode_branches(
            ast.parse(path.read_text()), names) if name not in other]
    assert not found, found


def test_no_test_module_defines_a_fake_that_tests_fakes_has() -> None:
    """Shared fakes live in tests/fakes.py (issue 44): a test module uses them, it does not define its own copy."""
    import ast

    def classes(path: Path) -> set[str]:
        return {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)}

    shared = classes(ROOT / "tests" / "fakes.py")
    copies = {str(p.relative_to(ROOT)): sorted(classes(p) & shared) for p in (ROOT / "tests").rglob("test_*.py")}
    assert not {p: c for p, c in copies.items() if c}


def test_every_otel_variable_name_is_a_constant_of_one_module() -> None:
    """OTEL_* names are spelled in export/otel_env.py only (issue 44), and read from the environment each reader is
    given. The publisher is the exception: it runs inside the user's application and imports nothing of the tool."""
    import ast
    import re

    spelled = []
    for path in PKG.rglob("*.py"):
        if path == PKG / "export" / "otel_env.py" or (PKG / "publisher") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    re.fullmatch(r"OTEL_[A-Z0-9_]+", node.value):
                spelled.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}")
    assert not spelled, spelled


def test_the_runtime_hub_stays_small() -> None:
    """runtime.py sequences the steps; what each step builds lives in its own module (issue 44)."""
    assert len((PKG / "runtime" / "runtime.py").read_text().splitlines()) <= 350


# The modules that may read the process's environment themselves; every other one takes the run's (RuntimeDeps.environ,
# injected by the tests), so that each OTEL_* variable is read from one mapping. publisher/ runs inside the user's
# applications, not in a run of this tool, and reads their environment.
ENVIRON_READERS = {
    "retsnoop_otel.runtime.deps": "the injected environment's default: the process's own, for the commands",
    "retsnoop_otel.cli": "the cache directory of the kernel tables read beside the start (symbols/read_ahead.py), "
                         "before RuntimeDeps is imported; a run takes them only when its own resolves the same",
    "retsnoop_otel.command.help_format": "COLUMNS, the terminal's width, in the formatter argparse builds itself",
    "retsnoop_otel.symbols.dwarf": "the cache directory of its own command, python -m retsnoop_otel.symbols.dwarf",
}
_ENVIRON_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def _reads_environ(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in _ENVIRON_NAMES and \
                isinstance(node.value, ast.Name) and node.value.id == "os":
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "os" and \
                any(alias.name in _ENVIRON_NAMES for alias in node.names):
            return True
    return False


def test_only_a_short_list_of_modules_reads_the_process_environment() -> None:
    readers = {m for m, p in modules().items() if layer(m) != "publisher" and _reads_environ(p)}
    assert readers == set(ENVIRON_READERS)


def test_the_environment_check_sees_each_way_of_reading_it(tmp_path: Path) -> None:
    for text in ("import os\nos.environ.get('X')\n", "import os\nos.getenv('X')\n", "from os import environ\n"):
        (tmp_path / "m.py").write_text(text)
        assert _reads_environ(tmp_path / "m.py"), text
    (tmp_path / "m.py").write_text("def f(environ):\n    return environ.get('X')\n")
    assert not _reads_environ(tmp_path / "m.py")
