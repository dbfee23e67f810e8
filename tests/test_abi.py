"""abi.h and pyobmem/abi.py agree: every constant, size and offset, as the C compiler sees them.

The test reads the enum and #define names out of the header itself, so a constant added on one
side only fails here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pyobmem import abi

HEADER = Path(__file__).resolve().parents[1] / "native" / "include" / "pyobmem" / "abi.h"

# C enum -> (Python enum, prefix stripped from the C names).
ENUMS = {
    "pyobmem_event_type": (abi.Ev, "PYOBMEM_EV_"),
    "pyobmem_alloc_kind": (abi.AllocKind, "PYOBMEM_ALLOC_"),
    "pyobmem_launch_flags": (abi.LaunchFlag, "PYOBMEM_LAUNCH_"),
    "pyobmem_copy_kind": (abi.CopyKind, "PYOBMEM_COPY_"),
    "pyobmem_untracked_kind": (abi.UntrackedKind, "PYOBMEM_UNTRACKED_"),
    "pyobmem_launch_source": (abi.LaunchSource, "PYOBMEM_SOURCE_"),
    "pyobmem_swap_in_cause": (abi.SwapInCause, "PYOBMEM_SWAP_IN_"),
    "pyobmem_action_kind": (abi.ActionKind, "PYOBMEM_ACT_"),
    "pyobmem_nccl_call": (abi.NcclCall, "PYOBMEM_NCCL_"),
    "pyobmem_rank_source": (abi.RankSource, "PYOBMEM_RANK_"),
}
# Enum members that are module constants in Python rather than enum members.
ENUM_EXTRAS = {"PYOBMEM_COPY_ASYNC": abi.COPY_ASYNC}
DEFINES = {
    "PYOBMEM_ABI_VERSION": abi.ABI_VERSION,
    "PYOBMEM_RING_MAGIC": abi.RING_MAGIC,
    "PYOBMEM_RECORD_SIZE": abi.RECORD_SIZE,
    "PYOBMEM_RING_HEADER_SIZE": abi.RING_HEADER_SIZE,
    "PYOBMEM_TEXT_LAST": abi.TEXT_LAST,
    "PYOBMEM_ACCESS_OFFSET_BITS": abi.ACCESS_OFFSET_BITS,
    "PYOBMEM_CONTROL_MAGIC": abi.CONTROL_MAGIC,
    "PYOBMEM_PLAN_MAX_OPS": abi.PLAN_MAX_OPS,
    "PYOBMEM_PLAN_MAX_ACTIONS": abi.PLAN_MAX_ACTIONS,
}
STRINGS = {
    "PYOBMEM_ENV_RING": abi.ENV_RING, "PYOBMEM_ENV_DISABLE": abi.ENV_DISABLE, "PYOBMEM_ENV_CUPTI": abi.ENV_CUPTI,
    "PYOBMEM_ENV_CONTROL": abi.ENV_CONTROL,
    "PYOBMEM_ENV_RELEASER": abi.ENV_RELEASER,
    "PYOBMEM_ENV_GPU_CLOCK_EVERY": abi.ENV_GPU_CLOCK_EVERY, "PYOBMEM_ENV_GPU_CLOCK_POOL": abi.ENV_GPU_CLOCK_POOL,
}
STRUCTS = {
    "pyobmem_record": abi.RECORD_DTYPE, "pyobmem_ring_header": abi.RING_HEADER_DTYPE,
    "pyobmem_action": abi.ACTION_DTYPE, "pyobmem_plan": abi.PLAN_DTYPE, "pyobmem_control": abi.CONTROL_DTYPE,
}


def _header_text() -> str:
    return re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)


def _c_enums() -> dict[str, list[str]]:
    return {
        name: re.findall(r"\b(PYOBMEM_\w+)\s*=", body)
        for name, body in re.findall(r"enum\s+(\w+)\s*\{(.*?)\};", _header_text(), flags=re.S)
    }


def _c_defines() -> list[str]:
    """Object-like macros with a value (not the include guard, not function-like macros)."""
    return re.findall(r"^#define\s+(PYOBMEM_\w+)[ \t]+\S", _header_text(), flags=re.M)


def _c_struct_fields() -> dict[str, list[str]]:
    out = {}
    for name, body in re.findall(r"struct\s+(\w+)\s*\{(.*?)\};", _header_text(), flags=re.S):
        fields = []
        for decl in filter(str.strip, body.split(";")):  # "uint64_t a, b, c;" "uint64_t _pad0[4];"
            first, *rest = decl.split(",")
            fields += [re.match(r"\s*(\w+)", n).group(1) for n in [first.split()[-1], *rest]]
        out[name] = fields
    return out


@pytest.fixture(scope="module")
def c_view(tmp_path_factory) -> dict[str, str]:
    """Compile a program that prints every constant, size and offset; returns name -> value."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    lines = []
    for members in _c_enums().values():
        lines += [f'printf("{m} %llu\\n", (unsigned long long){m});' for m in members]
    for d in _c_defines():
        if d in STRINGS:
            lines.append(f'printf("{d} %s\\n", {d});')
        else:
            lines.append(f'printf("{d} %llu\\n", (unsigned long long)({d}));')
    for struct, fields in _c_struct_fields().items():
        lines.append(f'printf("sizeof.{struct} %zu\\n", sizeof(struct {struct}));')
        for f in fields:
            lines.append(f'printf("offsetof.{struct}.{f} %zu\\n", offsetof(struct {struct}, {f}));')
            lines.append(f'printf("sizeof.{struct}.{f} %zu\\n", sizeof(((struct {struct} *)0)->{f}));')
    lines.append('printf("ACCESS_WORD %llu\\n", (unsigned long long)PYOBMEM_ACCESS_WORD(0xABCDEFu, 0x2345678901ull));')
    src = tmp_path_factory.mktemp("abi") / "abi_dump.c"
    src.write_text(
        "#include <stddef.h>\n#include <stdio.h>\n#include <pyobmem/abi.h>\nint main(void) {\n"
        + "\n".join("    " + line for line in lines)
        + "\n    return 0;\n}\n"
    )
    exe = src.with_suffix("")
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", f"-I{HEADER.parents[1]}", "-o", str(exe), str(src)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


def test_header_parsed():
    """The regexes below see what is in the header (guards against a silently empty test)."""
    assert set(_c_enums()) == set(ENUMS)
    assert set(_c_defines()) == set(DEFINES) | set(STRINGS)
    assert set(_c_struct_fields()) == set(STRUCTS)


@pytest.mark.parametrize("c_enum", sorted(ENUMS))
def test_enum_matches(c_view, c_enum):
    py_enum, prefix = ENUMS[c_enum]
    c_members = _c_enums()[c_enum]
    c_values = {m[len(prefix):]: int(c_view[m]) for m in c_members if m not in ENUM_EXTRAS}
    assert c_values == {m.name: int(m.value) for m in py_enum}
    for m in c_members:
        if m in ENUM_EXTRAS:
            assert int(c_view[m]) == ENUM_EXTRAS[m]


def test_defines_match(c_view):
    for name, value in DEFINES.items():
        assert int(c_view[name]) == value, name
    for name, value in STRINGS.items():
        assert c_view[name] == value, name
    assert abi.RECORD_DTYPE.itemsize == abi.RECORD_SIZE == int(c_view["sizeof.pyobmem_record"])
    assert abi.ACCESS_OFFSET_MASK == (1 << int(c_view["PYOBMEM_ACCESS_OFFSET_BITS"])) - 1


@pytest.mark.parametrize("struct", sorted(STRUCTS))
def test_struct_layout(c_view, struct):
    dtype = STRUCTS[struct]
    assert dtype.itemsize == int(c_view[f"sizeof.{struct}"])
    c_fields = _c_struct_fields()[struct]
    named = [f for f in c_fields if not f.startswith("_pad")]
    assert list(dtype.names) == named  # same fields, same order; padding is only in C
    for f in named:
        fmt, offset = dtype.fields[f][:2]
        assert offset == int(c_view[f"offsetof.{struct}.{f}"]), f
        assert fmt.itemsize == int(c_view[f"sizeof.{struct}.{f}"]), f
        base = fmt.base  # the element of an array field
        # every field is unsigned little-endian, or a struct of this header (arrays of them)
        assert (base.kind == "u" and base.byteorder in "<=|") or base in STRUCTS.values(), f


def test_ring_header_fits_its_page(c_view):
    assert int(c_view["sizeof.pyobmem_ring_header"]) <= abi.RING_HEADER_SIZE


def test_access_word(c_view):
    word = np.array([int(c_view["ACCESS_WORD"])], dtype=np.uint64)
    block, offset = abi.access_word_split(word)
    assert int(block[0]) == 0xABCDEF and int(offset[0]) == 0x2345678901
