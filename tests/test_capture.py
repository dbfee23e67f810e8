"""The capture format: round trip, truncation, foreign and newer files (synthetic records)."""

import struct

import pytest

from pyobmem import abi
from pyobmem.capture import read_capture
from pyobmem.errors import CaptureError

from synth import Trace


def _trace():
    t = Trace()
    w = t.alloc(1 << 20)
    x = t.alloc(4096)
    t.text(abi.Ev.KERNEL_NAME, 0xABC, "ampere_sgemm_128x64_nn_with_a_long_name_over_32_bytes")
    t.text(abi.Ev.NOTE, 0, "device0.name=NVIDIA H200")
    t.launch(0xABC, [w, x], [16, 0])
    t.launch(0xABC, [x])
    t.free(x)
    return t, w, x


def test_round_trip(tmp_path):
    t, w, x = _trace()
    t.write(tmp_path / "a.pyobmem", exit_status=3)
    cap = read_capture(str(tmp_path / "a.pyobmem"))
    assert cap.complete and cap.exit_status == 3 and cap.dropped == 0
    assert list(cap.blocks["size"]) == [1 << 20, 4096]
    assert cap.blocks["t_free"][0] == -1 and cap.blocks["t_free"][1] > 0
    assert len(cap.ops) == 2 and list(cap.ops["n_touched"]) == [2, 1]
    assert cap.accesses.tolist() == [(0, 0, 16), (0, 1, 0), (1, 1, 0)]
    assert cap.kernel_name(0) == "ampere_sgemm_128x64_nn_with_a_long_name_over_32_bytes"
    assert cap.notes[100]["device0.name"] == "NVIDIA H200"


def test_killed_capture_reads_up_to_last_whole_record(tmp_path):
    t, _, _ = _trace()
    path = tmp_path / "k.pyobmem"
    t.write(path, end=False)
    with open(path, "ab") as f:
        f.write(b"\1" * 20)  # a record cut in half
    cap = read_capture(str(path))
    assert not cap.complete and cap.exit_status is None
    assert len(cap.ops) == 2


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "not a pyobmem capture"),
        (b"PYOB", "truncated capture"),
        (b"GIF89a........................", "not a pyobmem capture"),
        (struct.pack("<8sII", b"PYOBCAPT", 99, 2) + b"{}", "newer than this pyobmem reads"),
        (struct.pack("<8sII", b"PYOBCAPT", 1, 50) + b"{}", "metadata incomplete"),
    ],
)
def test_bad_files_one_line_error(tmp_path, content, message):
    path = tmp_path / "bad.pyobmem"
    path.write_bytes(content)
    with pytest.raises(CaptureError, match=message) as err:
        read_capture(str(path))
    assert "\n" not in str(err.value) and err.value.exit_code == 2


def test_missing_file(tmp_path):
    with pytest.raises(CaptureError, match="cannot read capture"):
        read_capture(str(tmp_path / "nope.pyobmem"))
