"""kernel_tables.c against a plain-Python statement of what it must return, on generated and real input.

The oracle is the regex parse the C replaced (the layout of the columns, the order by name, the module
runs); generated lines mix every shape the kernel prints with near misses (data symbols, [bpf] and
[__builtin__*] pseudo-modules, blanks inside brackets, upper-case hex, 17 hex digits). BTF blobs cut or
corrupted anywhere are refused with a message or parsed within bounds, never read past.
"""

from __future__ import annotations

import random
import re
import struct
from itertools import groupby, pairwise
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retsnoop_otel.symbols import kernel_tables as kt

_LINE = re.compile(r"^([0-9a-f]{1,16}) [tTwW] (\S+)(?:[ \t]+\[(?!bpf\])(\S+)\])?$", re.M)
_STABLE = re.compile(r"^([0-9a-f]{1,16}) [tTwW] (\S+)(?:[ \t]+\[(?!bpf\]|__builtin__)(\S+)\])?$", re.M)


def oracle(text: str, stable: bool) -> dict:
    rows = sorted((int(a, 16), n, m) for a, n, m in (_STABLE if stable else _LINE).findall(text))
    names = [n for _, n, _ in rows]
    order = sorted(range(len(rows)), key=lambda i: (names[i], i))
    runs = [(next(g)[0], mod) for mod, g in groupby(enumerate(m for *_, m in rows), key=lambda x: x[1])]
    return {"addrs": [a for a, _, _ in rows], "blob": "\n" + "".join(n + "\n" for n in names), "order": order,
            "dups": [k for k, (a, b) in enumerate(pairwise(order), 1) if names[a] == names[b]],
            "run_starts": [s for s, _ in runs], "run_mods": [m for _, m in runs]}


def columns(text: str, stable: bool) -> dict:
    c = kt.kallsyms_columns(text.encode(), stable)
    return {"addrs": list(c.addrs), "blob": c.names.blob, "order": list(c.order), "dups": c.dups,
            "run_starts": c.run_starts, "run_mods": c.run_mods}


_names = st.sampled_from(["f", "g", "do_sys_open", "_stext", "x.cold", "a]b", "__x64_sys_bpf", "bpf_prog_1_f",
                          "\u00e9t\u00e9"])
_mods = st.sampled_from(["", "\t[ext4]", "\t[bpf]", "\t[__builtin__ftrace]", " [kvm_intel]", "\t[a b]", "\t[]",
                         "\t[x]y", "  [nf_tables]"])


@st.composite
def kallsyms_text(draw: st.DrawFn) -> str:
    lines = []
    for _ in range(draw(st.integers(0, 40))):
        addr = draw(st.sampled_from(["ffffffff81000000", "ffffffffc0a01000", "10", "9", "0", "FFFF",
                                     "1ffffffffffffffff", "ffffffff81000010", ""]))
        kind = draw(st.sampled_from("tTwWdDbr"))
        sep = draw(st.sampled_from([" ", " ", " ", "  ", "\t"]))
        lines.append(f"{addr}{sep}{kind} {draw(_names)}{draw(_mods)}{draw(st.sampled_from(['', '', ' ', chr(13)]))}")
    return "\n".join(lines) + draw(st.sampled_from(["", "\n"]))


@settings(max_examples=400, deadline=None, derandomize=True)
@given(kallsyms_text(), st.booleans())
def test_kallsyms_columns_match_the_regex_parse(text: str, stable: bool) -> None:
    want = oracle(text, stable)
    if not want["addrs"]:
        with pytest.raises(kt.TableError, match="no function symbols"):
            columns(text, stable)
    elif want["addrs"][-1] == 0:
        with pytest.raises(kt.TableError, match="zero addresses"):
            columns(text, stable)
    else:
        assert columns(text, stable) == want


def test_real_kallsyms_match_the_regex_parse() -> None:
    text = Path("/proc/kallsyms").read_text()
    for stable in (False, True):
        want = oracle(text, stable)
        if want["addrs"] and want["addrs"][-1]:
            assert columns(text, stable) == want
        else:  # kernel.kptr_restrict hides the addresses from this user
            with pytest.raises(kt.TableError, match="zero addresses"):
                columns(text, stable)


@pytest.mark.parametrize("seed", range(6))
def test_large_tables_sort_by_name_as_python(seed: int) -> None:
    """Past the insertion sort's size: names sharing 8, 16 and more leading bytes, ending inside and on the
    8-byte prefixes, repeated at several addresses, some beyond ASCII: the order and repeats Python finds."""
    rng = random.Random(seed)
    heads = ["", "__pfx_", "__x64_sys_", "security_inode_", "abcdefgh", "abcdefghabcdefgh", "\u00e9t\u00e9_"]
    names = [rng.choice(heads) + "".join(rng.choice("ab_h") for _ in range(rng.randrange(0, 12)))
             for _ in range(rng.randrange(40, 3000))]
    names = [n or "x" for n in names] + rng.sample(names, 20) if names else names
    lines = [f"{0xffffffff81000000 + rng.randrange(1 << 20):x} t {n}" for n in names]
    text = "\n".join(lines) + "\n"
    assert columns(text, True) == oracle(text, True)
    aff = "".join(f"{n}\n" for n in names if n)
    assert kt.traceable_names(aff.encode()).blob == "\n" + "".join(n + "\n" for n in sorted(n for n in names if n))


def test_names_sharing_hundreds_of_bytes_sort_on_a_small_thread_stack() -> None:
    """The sort goes a level deeper per 8 shared bytes: 500-byte heads (Rust's mangled names come close) on a
    thread of 256 KiB, as available_filter_functions is parsed beside kallsyms."""
    import threading

    names = ["q" * 500 + f"{i % 97:03d}" for i in range(300)]
    text = "".join(f"{n}\n" for n in names).encode()
    out: list = []
    old = threading.stack_size(256 * 1024)
    try:
        thread = threading.Thread(target=lambda: out.append(kt.traceable_names(text)))
        thread.start()
        thread.join()
    finally:
        threading.stack_size(old)
    assert out and out[0].blob == "\n" + "".join(n + "\n" for n in sorted(names))


def _btf(types: bytes, strings: bytes = b"\0f\0g\0") -> bytes:
    return struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings)) + types + strings


def test_btf_blobs_cut_or_corrupted_anywhere_never_crash() -> None:
    """Every cut and a thousand random byte flips of a small valid blob: a refusal or a result in bounds."""
    int_ = struct.pack("<IIII", 0, 1 << 24, 4, 1 << 24 | 32)
    proto = struct.pack("<III", 0, 13 << 24 | 1, 1) + struct.pack("<II", 0, 1)
    funcs = struct.pack("<III", 1, 12 << 24, 2) + struct.pack("<III", 3, 12 << 24 | 1, 2)
    blob = _btf(int_ + proto + funcs)
    good = kt.btf_funcs(blob)
    assert good.names.blob == "\nf\ng\n" and [v >> 4 for v in good.packed] == [3, 4]
    for cut in range(len(blob)):
        try:
            kt.btf_funcs(blob[:cut])
        except kt.TableError:
            pass
    rng = random.Random(7)
    for _ in range(1000):
        mutated = bytearray(blob)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        try:
            out = kt.btf_funcs(bytes(mutated))
        except kt.TableError as exc:
            assert str(exc)
        else:
            assert len(out.packed) == len(out.names.blob.split("\n")) - 2


def test_btf_refusals_say_what() -> None:
    with pytest.raises(kt.TableError, match="unknown BTF kind 25 at type 1"):
        kt.btf_funcs(_btf(struct.pack("<III", 0, 25 << 24, 0)))
    with pytest.raises(kt.TableError, match="runs past"):
        kt.btf_funcs(_btf(struct.pack("<III", 0, 4 << 24 | 5, 8)))  # a struct of 5 members, none there
    with pytest.raises(kt.TableError, match="out of bounds"):
        kt.btf_funcs(struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, 1 << 20, 0, 0))


@st.composite
def aff_text(draw: st.DrawFn) -> str:
    lines = []
    for _ in range(draw(st.integers(0, 40))):
        lead = draw(st.sampled_from(["", "", " ", "\t "]))
        mod = draw(st.sampled_from(["", " [ext4]", "\t[kvm]", " [a b]", " trailing words"]))
        lines.append(lead + draw(st.sampled_from(["f", "g", "do_sys_open", "__ftrace_invalid_address___996",
                                                  "a]b", "\u00e9t\u00e9", "", "x.cold"])) + mod)
    return "\n".join(lines) + draw(st.sampled_from(["", "\n"]))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(aff_text(), st.lists(st.sampled_from(["f", "g", "x.cold", "zz", "\u00e9t\u00e9"]), max_size=6))
def test_traceable_names_and_what_kallsyms_lacks_match_python(text: str, others: list[str]) -> None:
    from retsnoop_otel.kernel.tracefs import parse_available_filter_functions
    from retsnoop_otel.symbols.names import Names, SortedNames

    want = sorted(name for name, _ in parse_available_filter_functions(text))
    got = kt.traceable_names(text.encode())
    assert got.blob == "\n" + "".join(n + "\n" for n in want)
    assert Names.from_state(got).all() == want  # the starts agree with the blob, also past ASCII
    by_name = SortedNames.of(Names(others)).state()
    assert kt.missing(tuple(got), *by_name[:2]) == sorted(set(want).difference(others))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(["f", "g", "x.cold", "zz", "a", "ab", "\u00e9t\u00e9"]), max_size=12),
       st.lists(st.sampled_from(["f", "g", "", "ab", "b", "zz", "zzz", "\u00e9t\u00e9"]), max_size=8))
def test_many_lookups_at_once_answer_as_one_by_one(table: list[str], queries: list[str]) -> None:
    from retsnoop_otel.symbols.names import Names, SortedNames
    from retsnoop_otel.symbols.traceable import Traceable

    by_name = SortedNames.of(Names(table))
    assert by_name.positions_many(queries) == [[i for i, n in enumerate(table) if n == q] for q in queries]
    listed = Traceable(table)
    assert listed.count_many(queries) == [table.count(q) for q in queries]
