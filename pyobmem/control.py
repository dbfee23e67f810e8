"""The swap-mode control file (daemon -> shim), ``struct pyobmem_control`` of abi.h.

Created by the launcher next to the ring (same directory, mode 0600, named ``<ring>.ctl``) and
passed to the traced command in PYOBMEM_CONTROL; the daemon maps it and writes plans.

Double-buffer protocol (abi.h): the daemon writes ``plans[1 - active]`` whole (generation last
among the plan's fields), then stores ``active``. It writes again only when no plan is in force
(``plans[active].generation == 0``) or the shim has adopted the one in force (``adopted ==
plans[active].generation``), so the shim never reads a slot being written. numpy stores to the
shared mapping are plain stores in program order; on x86-64 (TSO) the store of ``active`` is seen
after the plan's stores, which is the release the protocol asks for.
"""

from __future__ import annotations

import mmap

import numpy as np

from . import abi
from .ring import map_file, map_new_file, unmap_file

SUFFIX = ".ctl"


class Control:
    """A mapped control file. ``Control.create`` makes one; ``Control.open`` maps an existing one.
    ``ctl`` is a 1-element numpy view of ``abi.CONTROL_DTYPE``."""

    def __init__(self, path: str, mm: mmap.mmap):
        self.path = path
        self._mm = mm
        self.ctl = np.frombuffer(mm, dtype=abi.CONTROL_DTYPE, count=1)
        if int(self.ctl["magic"][0]) != abi.CONTROL_MAGIC:
            raise ValueError(f"{path}: not a pyobmem control file")
        if int(self.ctl["abi_version"][0]) != abi.ABI_VERSION:
            raise ValueError(f"{path}: control ABI version {int(self.ctl['abi_version'][0])}, expected {abi.ABI_VERSION}")

    @classmethod
    def create(cls, path: str, budget_bytes: int = 0, min_swap_bytes: int = 0) -> "Control":
        """Create the file (mode 0600, refusing an existing one), zeroed, with the header.
        Raises OSError (ENOSPC when the directory is full)."""
        mm = map_new_file(path, abi.CONTROL_DTYPE.itemsize)
        ctl = np.frombuffer(mm, dtype=abi.CONTROL_DTYPE, count=1)
        ctl["abi_version"] = abi.ABI_VERSION
        ctl["budget_bytes"] = int(budget_bytes)
        ctl["min_swap_bytes"] = int(min_swap_bytes)
        ctl["magic"] = abi.CONTROL_MAGIC  # last: a reader that sees the magic sees a whole header
        del ctl
        return cls(path, mm)

    @classmethod
    def open(cls, path: str) -> "Control":
        """Map an existing control file. Raises OSError, or ValueError for a file that is no
        control file of this ABI version."""
        return cls(path, map_file(path))

    # --- fields ---------------------------------------------------------------------------------

    def _get(self, name: str) -> int:
        return int(self.ctl[name][0])

    @property
    def budget_bytes(self) -> int:
        return self._get("budget_bytes")

    @budget_bytes.setter
    def budget_bytes(self, value: int) -> None:
        self.ctl["budget_bytes"] = int(value)

    @property
    def min_swap_bytes(self) -> int:
        return self._get("min_swap_bytes")

    @property
    def active(self) -> int:
        return self._get("active")

    @property
    def adopted(self) -> int:
        return self._get("adopted")

    @property
    def plan_drops(self) -> int:
        return self._get("plan_drops")

    @property
    def generation(self) -> int:
        """Generation of the plan in force (0: none)."""
        return int(self.ctl["plans"]["generation"][0, self.active & 1])

    def can_write(self) -> bool:
        """The protocol lets the daemon write the inactive slot now."""
        g = self.generation
        return g == 0 or self.adopted == g

    def write_plan(self, plan, generation: int | None = None) -> int | None:
        """Write ``plan`` (a pyobmem.planner.Plan) into the inactive slot and flip ``active``.
        Returns the generation written (default: the one in force + 1), or None when the shim has
        not adopted the plan in force yet. Raises ValueError for a plan over the ABI limits."""
        if not self.can_write():
            return None
        keys, actions = np.asarray(plan.template_keys, np.uint64), plan.actions
        if not 0 < len(keys) <= abi.PLAN_MAX_OPS or len(actions) > abi.PLAN_MAX_ACTIONS:
            raise ValueError(f"plan of {len(keys)} ops and {len(actions)} actions exceeds the control file's limits")
        gen = self.generation + 1 if generation is None else int(generation)
        slot = 1 - (self.active & 1)
        p = self.ctl["plans"][0, slot : slot + 1]  # a view into the mapping
        p["generation"] = 0  # the slot is not a plan while it is written
        p["pid"], p["period"], p["n_actions"] = plan.pid, len(keys), len(actions)
        p["budget_bytes"] = plan.budget_bytes
        p["template_keys"][0, : len(keys)] = keys
        p["template_keys"][0, len(keys):] = 0
        p["actions"][0, : len(actions)] = actions
        p["actions"][0, len(actions):] = np.zeros(1, abi.ACTION_DTYPE)
        p["generation"] = gen
        self.ctl["active"] = slot  # the release: the shim reads the slot after it sees this
        return gen

    def close(self, unlink: bool = False) -> None:
        """Unmap the control file and, when ``unlink``, remove it."""
        self.ctl = None  # release the buffer export before closing the map
        unmap_file(self._mm, self.path, unlink)
