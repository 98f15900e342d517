"""Print pip constraints that pin every lower bound of pyproject.toml, so CI can test the bounds are true.

Covers the runtime dependencies and the OpenTelemetry packages of the test oracle: `name>=X` becomes `name==X`.
Run: python tests/lowest_constraints.py > constraints.txt; pip install -c constraints.txt -e '.[dev]'
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def lowest(pyproject: Path = PYPROJECT) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    wanted = list(project["dependencies"])
    wanted += [d for d in project["optional-dependencies"]["dev"] if d.startswith("opentelemetry")]
    pins = []
    for dep in wanted:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*>=\s*([0-9][^,;\s]*)\s*", dep)
        if not m:
            sys.exit(f"{pyproject}: '{dep}' has no plain lower bound (NAME>=VERSION): the lowest versions are untested")
        pins.append(f"{m.group(1)}=={m.group(2)}")
    return pins


if __name__ == "__main__":
    print("\n".join(lowest()))
