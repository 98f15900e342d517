"""The documentation site: it builds with `mkdocs build --strict`, its generated reference pages are what
tests/gen_docs_reference.py writes from the code today, and every flag, config key, metric, environment
variable and span attribute the code has is in its reference page (adding one without its entry fails here)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import gen_docs_reference as gen

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PKG = REPO / "retsnoop_otel"


def _page(name: str) -> str:
    return (DOCS / "reference" / name).read_text()


@pytest.mark.parametrize("name", sorted(gen.PAGES))
def test_generated_pages_are_current(name: str) -> None:
    assert (DOCS / name).read_text() == gen.PAGES[name](), f"docs/{name} is stale: python -m tests.gen_docs_reference"


@pytest.mark.parametrize("name", sorted(gen.FILES))
def test_generated_files_are_current(name: str) -> None:
    assert (REPO / name).read_text() == gen.FILES[name](), f"{name} is stale: python -m tests.gen_docs_reference"


def test_every_trace_flag_has_its_row() -> None:
    from retsnoop_otel.trace.flags import build_parser
    page = _page("trace-flags.md")
    flags = {o for a in build_parser().declared for o in a.action.option_strings if o not in ("-h", "--help")}
    assert flags and not [f for f in flags if f"`{f}" not in page]


def test_every_config_key_is_in_the_configuration_reference() -> None:
    """The shipped example, the page's body, shows every declared key (set, or commented out at its default)."""
    from retsnoop_otel.runtime.config_keys import walk
    from retsnoop_otel.runtime.config_sections import TOP
    keys = {key.name for _, _, key in walk(TOP)}
    example = (REPO / "config" / "agent.yaml").read_text()
    assert len(keys) > 40 and not sorted(k for k in keys if not re.search(rf"\b{k}:", example))


def test_every_metric_is_in_the_metric_list() -> None:
    names = {n for p in (PKG / "metrics").glob("*.py") for n in re.findall(r'"(retsnoop_[a-z_]+)"', p.read_text())}
    page = _page("metric-list.md")
    assert len(names) > 25 and not sorted(n for n in names if f"`{n}" not in page)


def test_every_environment_variable_is_in_the_environment_reference() -> None:
    names = {n for p in PKG.rglob("*.py")
             for n in re.findall(r'"((?:OTEL|RETSNOOP_OTEL|K8S|KUBERNETES)_[A-Z_]+)"', p.read_text())}
    names.discard("OTEL_CTX")  # the process-context mapping's signature (OTEP 4719), not a variable
    page = _page("environment.md")
    assert len(names) > 20 and not sorted(n for n in names if f"`{n}`" not in page)


def test_every_span_attribute_is_in_the_attribute_reference() -> None:
    src = "".join(p.read_text() for d in ("export", "capture", "runtime", "workload") for p in (PKG / d).glob("*.py"))
    names = set(re.findall(r'"((?:code|error|thread|process|host|os|service|telemetry|k8s|container|retsnoop)'
                           r'\.[a-z_.]*[a-z_])"', src))
    page = _page("attributes.md")
    assert len(names) > 35 and not sorted(n for n in names if f"`{n}" not in page)


@pytest.mark.artifacts  # mkdocs is a docs extra, not in the lowest-versions venv
def test_the_site_builds_strict(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True,
                         env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "reference" / "trace-flags" / "index.html").exists()


def test_the_readme_is_a_front_page() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert "make demo" in readme and "make test" in readme and "docs/" in readme
