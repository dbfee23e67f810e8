"""pyobmem/abi.py, derived from abi.h with cffi, agrees with the C compiler's view of the header:
every enum member, constant, struct size and field offset, and every numpy dtype field.

The names of enums, #defines and structs are read out of the header text itself, so something
the derivation leaves out (an enum missing from abi._ENUMS, a define cdef does not take) fails here.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from pyobmem import abi

PADDING = re.compile(r"_pad")


def _header_text() -> str:
    return re.sub(r"/\*.*?\*/", "", abi.HEADER.read_text(), flags=re.S)


def _c_enums() -> dict[str, list[str]]:
    return {
        name: re.findall(r"\b(PYOBMEM_\w+)\s*=", body)
        for name, body in re.findall(r"enum\s+(\w+)\s*\{(.*?)\};", _header_text(), flags=re.S)
    }


def _c_defines() -> dict[str, bool]:
    """Object-like macros with a value (not the guard, not function-like): name -> is a string."""
    return {name: value.startswith('"')
            for name, value in re.findall(r"^#define\s+(PYOBMEM_\w+)[ \t]+(\S)", _header_text(), flags=re.M)}


def _c_structs() -> set[str]:
    return set(re.findall(r"^struct\s+(\w+)\s*\{", _header_text(), flags=re.M))


def _fields(struct: str) -> list[tuple[str, object]]:
    """(C member designator, cffi type) of every field of `struct`, nested structs and the
    record's union members included."""
    out = []
    for name, f in abi.ffi.typeof(f"struct {struct}").fields:
        out.append((name, f.type))
        if f.type.kind == "struct":
            out += [(f"{name}.{sub}", t) for sub, t in _fields(f.type.cname.split()[1])]
    return out


def _dtype_fields(dtype: np.dtype, member: str | None):
    """(dtype field name, C designator in struct pyobmem_record) of a record dtype; ``member``:
    the union member its payload fields are in."""
    head = {n for n, f in abi.ffi.typeof("struct pyobmem_record").fields if f.type.kind != "struct"}
    return [(n, n if n in head else f"{member}.{n}") for n in dtype.names]


RECORD_DTYPES = {"words": abi.RECORD_DTYPE} | {ev.name.lower(): dt for ev, dt in abi.EVENT_DTYPES.items()}
STRUCT_DTYPES = {"pyobmem_ring_header": abi.RING_HEADER_DTYPE, "pyobmem_action": abi.ACTION_DTYPE,
                 "pyobmem_plan": abi.PLAN_DTYPE, "pyobmem_control": abi.CONTROL_DTYPE}


@pytest.fixture(scope="module")
def c_view(tmp_path_factory) -> dict[str, str]:
    """Compile a program that prints every constant, size and offset; returns name -> value."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    lines = []
    for members in _c_enums().values():
        lines += [f'printf("{m} %llu\\n", (unsigned long long){m});' for m in members]
    for d, is_string in _c_defines().items():
        lines.append(f'printf("{d} %s\\n", {d});' if is_string else f'printf("{d} %llu\\n", (unsigned long long)({d}));')
    for struct in _c_structs():
        lines.append(f'printf("sizeof.{struct} %zu\\n", sizeof(struct {struct}));')
        for f, _ in _fields(struct):
            lines.append(f'printf("offsetof.{struct}.{f} %zu\\n", offsetof(struct {struct}, {f}));')
            lines.append(f'printf("sizeof.{struct}.{f} %zu\\n", sizeof(((struct {struct} *)0)->{f}));')
    lines.append('printf("ACCESS_WORD %llu\\n", (unsigned long long)PYOBMEM_ACCESS_WORD(0xABCDEFu, 0x2345678901ull));')
    lines.append('printf("OP_KEY_COPY %llu\\n", (unsigned long long)PYOBMEM_OP_KEY_COPY(PYOBMEM_EV_MEMCPY, 3));')
    src = tmp_path_factory.mktemp("abi") / "abi_dump.c"
    src.write_text(
        "#include <stddef.h>\n#include <stdio.h>\n#include <pyobmem/abi.h>\nint main(void) {\n"
        + "\n".join("    " + line for line in lines)
        + "\n    return 0;\n}\n"
    )
    exe = src.with_suffix("")
    include = abi.HEADER.parents[1]
    subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-pedantic", "-Werror", f"-I{include}", "-o", str(exe), str(src)],
                   check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


def test_header_parsed():
    """The regexes see what is in the header, and cffi every struct of it."""
    assert set(_c_enums()) == set(abi._ENUMS)  # every C enum has its Python class
    assert len(_c_defines()) >= 30 and "PYOBMEM_NOTE_GPU_CLOCK" in _c_defines()
    assert _c_structs() == set(abi.ffi.list_types()[1])
    assert "pyobmem_ev_process" in _c_structs()


@pytest.mark.parametrize("c_enum", sorted(abi._ENUMS))
def test_enum_matches(c_view, c_enum):
    py_name, prefix, base, _ = abi._ENUMS[c_enum]
    py_enum = getattr(abi, py_name)
    assert issubclass(py_enum, base)
    c_values = {m[len(prefix):]: int(c_view[m]) for m in _c_enums()[c_enum]}
    assert c_values == {m.name: int(m.value) for m in py_enum}
    assert len(c_values) >= 2


def test_defines_match(c_view):
    for name, is_string in _c_defines().items():
        value = getattr(abi, name[len("PYOBMEM_"):])
        assert (value if is_string else str(value)) == c_view[name], name
    assert abi.RECORD_SIZE == 64 and abi.ABI_VERSION >= 1 and abi.RANK_UNKNOWN == 0xFFFFFFFF
    assert abi.ENV_RING == "PYOBMEM_RING" and abi.NOTE_SWAP_PINNED_BYTES == "swap.pinned_bytes"
    assert abi.ACCESS_OFFSET_MASK == (1 << int(c_view["PYOBMEM_ACCESS_OFFSET_BITS"])) - 1


@pytest.mark.parametrize("struct", sorted(_c_structs()))
def test_cffi_layout_is_the_compilers(c_view, struct):
    """cffi lays out every struct as gcc does (sizes and the offset of every field)."""
    assert abi.ffi.sizeof(f"struct {struct}") == int(c_view[f"sizeof.{struct}"])
    for f, ctype in _fields(struct):
        assert abi.ffi.offsetof(f"struct {struct}", *f.split(".")) == int(c_view[f"offsetof.{struct}.{f}"]), f
        assert abi.ffi.sizeof(ctype) == int(c_view[f"sizeof.{struct}.{f}"]), f


def _check_dtype(c_view, dtype: np.dtype, struct: str, designators) -> None:
    assert dtype.itemsize == int(c_view[f"sizeof.{struct}"])
    for name, c_name in designators:
        fmt, offset = dtype.fields[name][:2]
        assert offset == int(c_view[f"offsetof.{struct}.{c_name}"]), name
        assert fmt.itemsize == int(c_view[f"sizeof.{struct}.{c_name}"]), name
        assert fmt.base.kind in "ui" and fmt.base.byteorder in "<=|" or fmt.base.kind == "V", name


@pytest.mark.parametrize("member", sorted(RECORD_DTYPES))
def test_record_dtypes(c_view, member):
    """Each record dtype is the record with one payload struct's fields, where gcc puts them;
    only padding is left out."""
    dtype = RECORD_DTYPES[member]
    _check_dtype(c_view, dtype, "pyobmem_record", _dtype_fields(dtype, member))
    c_named = [f for f, t in _fields("pyobmem_record") if f.startswith(member + ".") and f.count(".") == 1]
    assert [n for n, _ in _dtype_fields(dtype, member)][5:] == [f.split(".")[1] for f in c_named if not PADDING.search(f)]


@pytest.mark.parametrize("struct", sorted(STRUCT_DTYPES))
def test_struct_dtypes(c_view, struct):
    dtype = STRUCT_DTYPES[struct]
    _check_dtype(c_view, dtype, struct, [(n, n) for n in dtype.names])
    assert list(dtype.names) == [n for n, _ in abi.ffi.typeof(f"struct {struct}").fields if not PADDING.match(n)]


def test_one_payload_per_event_type(c_view):
    """Every event type but NONE has its union member, every payload is the size of the five
    words, and the union holds nothing else."""
    members = {n for n, f in abi.ffi.typeof("struct pyobmem_record").fields if f.type.kind == "struct"}
    assert members == {"words"} | {ev.name.lower() for ev in abi.Ev if ev != abi.Ev.NONE}
    for m in members:
        assert int(c_view[f"sizeof.pyobmem_record.{m}"]) == 40, m
    assert int(c_view["offsetof.pyobmem_record.words"]) == 24


def test_cdef_text_strips_what_cffi_does_not_take():
    text = abi.cdef_text(abi.HEADER.read_text())
    assert "#include" not in text and "#ifndef" not in text and "_Static_assert" not in text
    assert "PYOBMEM_ACCESS_WORD" not in text and '"' not in text
    assert "#define PYOBMEM_RING_MAGIC 0x474e4952424f5950ull" in text  # cdef reads the suffix


def test_records_round_trip_by_name():
    """A record written by field names reads back as the same words (little-endian halves)."""
    rec = abi.records(abi.Ev.NCCL)
    rec["send"], rec["peer"], rec["comm"] = 0x1234, 3, abi.RANK_UNKNOWN
    raw = rec.view(abi.RECORD_DTYPE)
    assert int(raw["type"][0]) == abi.Ev.NCCL and int(raw["a"][0]) == 0x1234
    assert int(raw["e"][0]) == (0xFFFFFFFF << 32) | 3
    assert int(abi.view(raw, abi.Ev.NCCL)["comm"][0]) == abi.RANK_UNKNOWN


def test_access_word(c_view):
    word = np.array([int(c_view["ACCESS_WORD"])], dtype=np.uint64)
    block, offset = abi.access_word_split(word)
    assert int(block[0]) == 0xABCDEF and int(offset[0]) == 0x2345678901


def test_op_key_copy(c_view):
    assert abi.op_key_copy(abi.Ev.MEMCPY, 3) == int(c_view["OP_KEY_COPY"])
