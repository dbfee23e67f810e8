"""The event ABI of native/include/pyobmem/abi.h, mirrored as numpy dtypes and enums.

abi.h is the one definition; tests/test_abi.py compiles it and checks every constant, size and
offset here against the C compiler's view, so the two sides cannot drift.
"""

from __future__ import annotations

import enum

import numpy as np

ABI_VERSION = 1
RING_MAGIC = 0x474E4952424F5950  # "PYOBRING"
RECORD_SIZE = 64
RING_HEADER_SIZE = 4096
ACCESS_OFFSET_BITS = 40
ACCESS_OFFSET_MASK = (1 << ACCESS_OFFSET_BITS) - 1
TEXT_LAST = 0x8000

ENV_RING = "PYOBMEM_RING"
ENV_DISABLE = "PYOBMEM_DISABLE"
ENV_CUPTI = "PYOBMEM_CUPTI"
ENV_CONTROL = "PYOBMEM_CONTROL"
ENV_RELEASER = "PYOBMEM_RELEASER"  # swap mode: "0" turns the release thread off
ENV_GPU_CLOCK_EVERY = "PYOBMEM_GPU_CLOCK_EVERY"  # GPU time sample every N ops (default 32; 0: off)
ENV_GPU_CLOCK_POOL = "PYOBMEM_GPU_CLOCK_POOL"  # timing events per context (default 256)

CONTROL_MAGIC = 0x4C5254434F4259  # "YOBCTRL"
PLAN_MAX_OPS = 32768
PLAN_MAX_ACTIONS = 16384


class Ev(enum.IntEnum):
    """Event types (``pyobmem_event_type``); payload words per type are documented in abi.h."""

    NONE = 0
    PROCESS = 1
    ALLOC = 2
    FREE = 3
    LAUNCH = 4
    ACCESS = 5
    MEMCPY = 6
    MEMSET = 7
    GRAPH_LAUNCH = 8
    KERNEL_NAME = 9
    UNTRACKED = 10
    NOTE = 11
    DROPPED = 12
    CAPTURE_END = 13
    SWAP_OUT = 14
    SWAP_IN = 15
    PLAN = 16
    NCCL = 17
    GPU_TIME = 18


class NcclCall(enum.IntEnum):
    """Which NCCL call an NCCL record is (flags, ``pyobmem_nccl_call``)."""

    ALL_REDUCE = 1
    BROADCAST = 2
    REDUCE = 3
    ALL_GATHER = 4
    REDUCE_SCATTER = 5
    SEND = 6
    RECV = 7
    ALL_TO_ALL = 8
    GATHER = 9
    SCATTER = 10
    COMM_REGISTER = 11
    WINDOW_REGISTER = 12
    MEM_ALLOC = 13


class RankSource(enum.IntEnum):
    """Which environment variables gave a process its rank (``pyobmem_rank_source``)."""

    NONE = 0
    TORCH = 1
    OMPI = 2
    PMI = 3
    SLURM = 4


RANK_UNKNOWN = 0xFFFFFFFF  # rank or local rank not given (PROCESS d)


class SwapInCause(enum.IntEnum):
    """Why a block came back (flags of SWAP_IN, ``pyobmem_swap_in_cause``)."""

    PREFETCH = 1
    LATE = 2
    DEMAND = 3


class ActionKind(enum.IntEnum):
    """What a plan action does (``pyobmem_action_kind``)."""

    SWAP_OUT = 1
    PREFETCH = 2
    MARK = 3
    IDLE = 4


class AllocKind(enum.IntEnum):
    """How a block was allocated (``pyobmem_alloc_kind``)."""

    DRIVER = 0
    PITCH = 1
    ASYNC = 2
    VMM = 3
    MANAGED = 4
    HOST = 5  # pinned or mapped host memory: never swapped, not device memory


class LaunchFlag(enum.IntFlag):
    """Flags of a LAUNCH record (``pyobmem_launch_flags``)."""

    OPAQUE = 1 << 0
    NO_LAYOUT = 1 << 1
    EX = 1 << 2
    COOPERATIVE = 1 << 3
    VIA_CUPTI = 1 << 4
    TRUNCATED = 1 << 5
    UNKNOWN_ADDRESS = 1 << 6  # an argument word the driver knows as an address, in no recorded block


class CopyKind(enum.IntEnum):
    """Direction of a MEMCPY record (``pyobmem_copy_kind``, low byte of flags)."""

    HTOD = 1
    DTOH = 2
    DTOD = 3
    OTHER = 4


COPY_ASYNC = 0x100


class UntrackedKind(enum.IntEnum):
    """What an UNTRACKED record saw (``pyobmem_untracked_kind``)."""

    FREE = 1
    UNMAP = 2


class LaunchSource(enum.IntEnum):
    """Where a process's launches were attributed from (``pyobmem_launch_source``)."""

    HOOKS = 0
    CUPTI = 1


RECORD_DTYPE = np.dtype(
    [
        ("seq", "<u8"),
        ("type", "<u2"),
        ("flags", "<u2"),
        ("pid", "<u4"),
        ("ts_ns", "<u8"),
        ("a", "<u8"),
        ("b", "<u8"),
        ("c", "<u8"),
        ("d", "<u8"),
        ("e", "<u8"),
    ]
)

RING_HEADER_DTYPE = np.dtype(
    {
        "names": ["magic", "abi_version", "record_size", "capacity", "creator_pid", "head", "tail", "dropped"],
        "formats": ["<u8", "<u4", "<u4", "<u8", "<u8", "<u8", "<u8", "<u8"],
        "offsets": [0, 8, 12, 16, 24, 64, 128, 192],
        "itemsize": 256,
    }
)

def _struct(fields: list[tuple], itemsize: int) -> np.dtype:
    """A dtype with explicit offsets: (name, format, offset); C padding is left out."""
    return np.dtype(
        {"names": [f[0] for f in fields], "formats": [f[1] for f in fields], "offsets": [f[2] for f in fields],
         "itemsize": itemsize}
    )


ACTION_DTYPE = _struct([("at", "<u4", 0), ("kind", "<u2", 4), ("until", "<u2", 6), ("addr", "<u8", 8), ("size", "<u8", 16)], 24)
PLAN_DTYPE = _struct(
    [
        ("generation", "<u8", 0), ("pid", "<u4", 8), ("period", "<u4", 12), ("n_actions", "<u4", 16),
        ("budget_bytes", "<u8", 24), ("template_keys", ("<u8", (PLAN_MAX_OPS,)), 32),
        ("actions", (ACTION_DTYPE, (PLAN_MAX_ACTIONS,)), 32 + 8 * PLAN_MAX_OPS),
    ],
    32 + 8 * PLAN_MAX_OPS + ACTION_DTYPE.itemsize * PLAN_MAX_ACTIONS,
)
CONTROL_DTYPE = _struct(
    [
        ("magic", "<u8", 0), ("abi_version", "<u4", 8), ("budget_bytes", "<u8", 16), ("min_swap_bytes", "<u8", 24),
        ("active", "<u8", 32), ("adopted", "<u8", 40), ("plan_drops", "<u8", 48), ("plans", (PLAN_DTYPE, (2,)), 64),
    ],
    64 + 2 * PLAN_DTYPE.itemsize,
)

assert RECORD_DTYPE.itemsize == RECORD_SIZE


def op_key_copy(event_type: int, copy_kind: int) -> int:
    """Template key of a copy or set (``PYOBMEM_OP_KEY_COPY``); launches use their handle."""
    return (0xFF << 56) | (int(event_type) << 16) | int(copy_kind)


def access_word_split(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split access words (uint64 array) into (block ids, byte offsets); 0 words mean unused."""
    words = np.asarray(words, dtype=np.uint64)
    return words >> np.uint64(ACCESS_OFFSET_BITS), words & np.uint64(ACCESS_OFFSET_MASK)
