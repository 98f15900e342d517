"""Glob scans over name blobs agree with matching each name on its own, for any glob and names."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from retsnoop_otel.symbols.globs import glob_to_regex, lines_matching, name_blob

NAME = st.text(alphabet="ab_.$*?x", min_size=1, max_size=8)  # '*' and '?' may be parts of names too
GLOB = st.text(alphabet="ab_.*?x", min_size=1, max_size=6)


@settings(derandomize=not os.environ.get("FUZZ_RANDOM"))  # the same examples at every `make test`
@given(names=st.lists(NAME, max_size=30, unique=True), glob=GLOB)
def test_lines_matching_is_fullmatch_over_each_name(names: list[str], glob: str) -> None:
    rx = glob_to_regex(glob)
    assert lines_matching(glob, name_blob(names)) == {n for n in names if rx.fullmatch(n)}


def test_typical_kernel_globs() -> None:
    names = ["__x64_sys_bpf", "__sys_bpf", "bpf_sys_bpf", "bpf_map_update_elem", "htab_map_update_elem",
             "array_map_alloc", "sys_bpf_x", "map_create"]
    blob = name_blob(names)
    assert lines_matching("*sys_bpf", blob) == {"__x64_sys_bpf", "__sys_bpf", "bpf_sys_bpf"}
    assert lines_matching("bpf_*", blob) == {"bpf_sys_bpf", "bpf_map_update_elem"}
    assert lines_matching("*htab_*elem*", blob) == {"htab_map_update_elem"}
    assert lines_matching("map_create", blob) == {"map_create"}
    assert lines_matching("map_creat", blob) == set()
    assert lines_matching("*", blob) == set(names)
    assert lines_matching("*", name_blob([])) == set()
