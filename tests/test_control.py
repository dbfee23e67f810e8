"""The control file (pyobmem.control) and its double-buffer protocol (abi.h)."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from pyobmem import abi
from pyobmem.control import Control
from pyobmem.planner import Plan


def _plan(n_ops=5, n_actions=2, pid=7, budget=1 << 30) -> Plan:
    actions = np.zeros(n_actions, abi.ACTION_DTYPE)
    actions["at"] = np.arange(n_actions)
    actions["kind"] = abi.ActionKind.SWAP_OUT
    actions["addr"] = 0x7F0000000000 + np.arange(n_actions) * 0x100000
    actions["size"] = 4 << 20
    return Plan(pid=pid, budget_bytes=budget, template_keys=np.arange(1, n_ops + 1, dtype=np.uint64) * 0x10,
                actions=actions, swaps=[])


@pytest.fixture
def ctl(tmp_path):
    c = Control.create(str(tmp_path / "r.ctl"), budget_bytes=123, min_swap_bytes=4 << 20)
    yield c
    c.close(unlink=True)


def test_header_and_mode(ctl):
    assert stat.S_IMODE(os.stat(ctl.path).st_mode) == 0o600
    assert os.path.getsize(ctl.path) == abi.CONTROL_DTYPE.itemsize
    other = Control.open(ctl.path)
    assert int(other.ctl["magic"][0]) == abi.CONTROL_MAGIC and int(other.ctl["abi_version"][0]) == abi.ABI_VERSION
    assert (other.budget_bytes, other.min_swap_bytes, other.active, other.adopted, other.generation) == (123, 4 << 20, 0, 0, 0)
    other.close()


def test_create_refuses_an_existing_file(ctl):
    with pytest.raises(FileExistsError):
        Control.create(ctl.path)


def test_open_refuses_a_foreign_file(tmp_path):
    p = tmp_path / "x"
    p.write_bytes(b"\0" * abi.CONTROL_DTYPE.itemsize)
    with pytest.raises(ValueError):
        Control.open(str(p))


def test_double_buffer_respects_adopted(ctl):
    shim = Control.open(ctl.path)  # the shim's view of the same file
    assert ctl.can_write()  # no plan in force
    assert ctl.write_plan(_plan(n_ops=5)) == 1
    assert shim.active == 1 and shim.generation == 1
    slot = shim.ctl["plans"][0, 1]
    assert (int(slot["pid"]), int(slot["period"]), int(slot["n_actions"]), int(slot["budget_bytes"])) == (7, 5, 2, 1 << 30)
    assert slot["template_keys"][:6].tolist() == [0x10, 0x20, 0x30, 0x40, 0x50, 0]
    assert slot["actions"][:3]["at"].tolist() == [0, 1, 0] and slot["actions"][1]["addr"] == 0x7F0000100000
    # The shim has not adopted generation 1: the daemon must not touch the other slot.
    before = bytes(shim._mm[:])
    assert not ctl.can_write() and ctl.write_plan(_plan(n_ops=3)) is None
    assert bytes(shim._mm[:]) == before
    shim.ctl["adopted"] = 1  # the shim follows plan 1 now
    assert ctl.write_plan(_plan(n_ops=3, n_actions=1)) == 2
    assert shim.active == 0 and shim.generation == 2
    s0 = shim.ctl["plans"][0, 0]
    assert int(s0["period"]) == 3 and s0["template_keys"][:4].tolist() == [0x10, 0x20, 0x30, 0]
    assert int(shim.ctl["plans"][0, 1]["generation"]) == 1  # the old plan, untouched
    shim.close()


def test_limits(ctl):
    with pytest.raises(ValueError):
        ctl.write_plan(_plan(n_ops=abi.PLAN_MAX_OPS + 1))
    with pytest.raises(ValueError):
        ctl.write_plan(_plan(n_ops=0))
    assert ctl.generation == 0
