"""The three properties of the access pattern: iterative, regular, extremal (docs/model.md gives
the formulas). All are computed over the main regime's iterations, on blocks that are not arenas;
None means "not measurable" (no iteration, or nothing to measure)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .blocks import ARENA, BlockModel
from .iterations import IterationModel
from .tensors import TensorModel

TOP_SHARE = 0.1  # extremal: share of idle time in the longest 10% of intervals


@dataclass(frozen=True)
class Properties:
    """``iterative_blocks``/``iterative_bytes``: share (0..1) of the blocks (of their bytes)
    accessed in an iteration whose access signature repeats across iterations. ``regular``:
    1 - mean coefficient of variation of idle interval lengths (ns) per (role, interval index),
    clipped to [0, 1]; ``regular_ops``: the same on lengths in ops. ``extremal_top``: share of the
    total idle time in the longest 10% of the idle intervals; ``extremal_gini``: Gini coefficient
    of idle interval lengths. ``n_intervals``: intervals measured; ``n_groups``: (role, index)
    groups with at least two intervals."""

    iterative_blocks: float | None
    iterative_bytes: float | None
    regular: float | None
    regular_ops: float | None
    extremal_top: float | None
    extremal_gini: float | None
    n_intervals: int
    n_groups: int
    iterative_intervals: float | None = None
    level: str = "block"
    segment: "Properties | None" = None


NONE = Properties(None, None, None, None, None, None, 0, 0)


def gini(x: np.ndarray) -> float:
    """Gini coefficient of non-negative values (0: all equal, -> 1: one value holds everything)."""
    x = np.sort(np.asarray(x, np.float64))
    n, s = len(x), x.sum()
    if n == 0 or s <= 0:
        return 0.0
    return float(2.0 * np.sum(np.arange(1, n + 1) * x) / (n * s) - (n + 1) / n)


def top_share(x: np.ndarray, share: float = TOP_SHARE) -> float:
    """Share of sum(x) held by the largest ceil(share * n) values."""
    x = np.asarray(x, np.float64)
    if not len(x) or x.sum() <= 0:
        return 0.0
    k = int(np.ceil(share * len(x)))
    return float(np.sort(x)[::-1][:k].sum() / x.sum())


def in_iteration_intervals(it: IterationModel, bm: BlockModel) -> np.ndarray:
    """Mask of the idle intervals measured by the properties: both accesses in one iteration of
    the main regime, or the wrap into the next one when the two iterations are contiguous, and
    the block is not an arena."""
    iv = bm.intervals
    main = it.main_rows()
    if not len(main) or not len(iv):
        return np.zeros(len(iv), bool)
    contiguous = np.zeros(len(main), bool)
    contiguous[:-1] = it.end_op[main][:-1] == it.start_op[main][1:]
    i = iv.iteration
    ok = (i >= 0) & (iv.end_iteration >= 0)
    same = iv.end_iteration == i
    wrap = iv.wrap & contiguous[np.clip(i, 0, len(main) - 1)]
    return ok & (same | wrap) & (bm.cls[iv.block] != ARENA)


def _regularity(key: np.ndarray, x: np.ndarray) -> tuple[float | None, int]:
    if not len(x):
        return None, 0
    _, inv, cnt = np.unique(key, return_inverse=True, return_counts=True)
    inv = inv.ravel()
    x = x.astype(np.float64)
    s1 = np.bincount(inv, weights=x)
    s2 = np.bincount(inv, weights=x * x)
    mean = s1 / cnt
    var = np.maximum(s2 / cnt - mean * mean, 0.0)
    g = (cnt >= 2) & (mean > 0)
    if not np.any(g):
        return None, 0
    cv = np.sqrt(var[g]) / mean[g]
    # Each group scores 1 - min(CV, 1): a few groups with CV >> 1 (an interval that once spans a
    # host sync) must not drive the whole measure to 0, as 1 - mean(CV) did.
    return float(np.mean(1.0 - np.minimum(cv, 1.0))), int(np.count_nonzero(g))


def _iterative_shares(n_iterations, cls, iterative, size) -> tuple[float | None, float | None]:
    """Shares (by count, by bytes) of the iterative ones among the blocks or sub-blocks touched in
    a main iteration, arenas left out; (None, None) when there is none. Arguments: one row each."""
    touched = (n_iterations > 0) & (cls != ARENA)
    if not np.any(touched):
        return None, None
    return (float(np.count_nonzero(iterative & touched) / np.count_nonzero(touched)),
            float(size[iterative & touched].sum() / max(size[touched].sum(), 1)))


def compute_properties(it: IterationModel, bm: BlockModel) -> Properties:
    """The three properties (see Properties); NONE when the capture has no iteration."""
    if it.main < 0:
        return NONE
    it_blocks, it_bytes = _iterative_shares(bm.n_iterations, bm.cls, bm.iterative, bm.size)
    iv = bm.intervals
    m = in_iteration_intervals(it, bm)
    role = bm.role[iv.block[m]]
    index = iv.index[m].astype(np.int64)
    key = (role - role.min(initial=0)) * (int(index.max(initial=0)) + 1) + index
    regular, groups = _regularity(key, iv.ns[m])
    regular_ops, _ = _regularity(key, iv.ops[m])
    ns = iv.ns[m]
    return Properties(
        iterative_blocks=it_blocks, iterative_bytes=it_bytes, regular=regular, regular_ops=regular_ops,
        extremal_top=top_share(ns) if len(ns) else None, extremal_gini=gini(ns) if len(ns) else None,
        n_intervals=int(len(ns)), n_groups=groups,
    )


def compute_tensor_properties(it: IterationModel, bm: BlockModel, tm: TensorModel) -> Properties:
    """The three properties at tensor level (sub-blocks and their reuse intervals), with the
    block-level ones in ``segment``; NONE when the capture has no iteration."""
    seg = compute_properties(it, bm)
    if it.main < 0:
        return NONE
    it_blocks, it_bytes = _iterative_shares(tm.n_iterations, tm.cls, tm.iterative, tm.size)
    iv = tm.intervals
    m = iv.measured & (tm.cls[iv.sub] != ARENA) if len(iv) else np.zeros(0, bool)
    n_meas = int(np.count_nonzero(m))
    it_iv = float(np.count_nonzero(iv.recurring & m) / n_meas) if n_meas else None
    r = m & iv.recurring
    regular, groups = _regularity(iv.key[r], iv.ns[r])
    ns = iv.ns[m]
    return Properties(
        iterative_blocks=it_blocks, iterative_bytes=it_bytes, regular=regular, regular_ops=None,
        extremal_top=top_share(ns) if len(ns) else None, extremal_gini=gini(ns) if len(ns) else None,
        n_intervals=n_meas, n_groups=groups, iterative_intervals=it_iv, level="tensor", segment=seg,
    )
