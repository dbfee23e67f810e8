"""The pattern model of a capture: iterations, per-block model, properties, swap saving bound.

    from pyobmem.model import analyse, patterns_json
    a = analyse(capture)              # Analysis (frozen, cached on the capture); a.iterations, a.blocks,
                                      # a.properties, a.saving, and the views the report and exports draw
    patterns_json(capture)            # the per-workload figures (dict of JSON values)

Modules: iterations (period and phase from the launch stream), blocks (classes, accesses, idle
intervals), properties (iterative / regular / extremal), saving (the swap saving bound, shared
with the planner), inefficiency (early allocation, late free, long idle, never accessed, leaked),
queries (time spans, live and resident bytes, op names: plain queries over the capture's tables).
Definitions and formulas: docs/model.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..progress import Progress
from .blocks import CLASSES, BlockModel, build_blocks, segment_subranges
from .inefficiency import Finding, find_inefficiencies
from .iterations import IterationModel, Regime, detect_iterations
from .properties import Properties, compute_properties, compute_tensor_properties
from .saving import DEFAULT_BANDWIDTH, TIME_RATIOS, SavingCurve, saving_curve
from .tensors import TensorModel, build_tensors

__all__ = [
    "Analysis", "BlockModel", "CLASSES", "DEFAULT_BANDWIDTH", "Finding", "IterationModel", "Properties",
    "Regime", "SavingCurve", "TIME_RATIOS", "analyse", "build_blocks", "compute_properties",
    "TensorModel", "build_tensors", "detect_iterations", "find_inefficiencies", "patterns_json", "saving_curve", "segment_subranges",
]


@dataclass(frozen=True)
class Analysis:
    """Everything the model says about one capture (see each part's docstring for fields and
    units), with the views the report and the exports draw. ``saving`` is None when no iteration
    was found."""

    capture: object = field(repr=False)
    iterations: IterationModel
    blocks: BlockModel
    properties: Properties
    saving: SavingCurve | None
    tensors: TensorModel | None = None

    def findings(self, **kw) -> list:
        """Inefficiencies, largest first (keyword arguments: slack_pct, idle_pct)."""
        return find_inefficiencies(self.capture, self.iterations, self.blocks, **kw)

    @cached_property
    def iteration_windows(self) -> np.ndarray:
        """(k, 2) int64 [start, end) ns of the main regime's iterations; (0, 2) when none."""
        it = self.iterations
        rows = it.main_rows()
        if not len(rows):
            return np.zeros((0, 2), np.int64)
        return np.stack([it.t_start[rows], it.t_end[rows]], axis=1).astype(np.int64)

    @property
    def iteration_ops(self) -> int | None:
        """Ops of the main sequence per iteration; None when no iteration was found."""
        main = self.iterations.main_regime
        return main.period_ops if main else None

    @property
    def window(self) -> tuple[int, int] | None:
        """The analysed iteration (the saving bound's) as [start, end) ns on the host's clock, as the
        access times are; None without one."""
        sav = self.saving
        if sav is None:
            return None
        r = int(self.iterations.main_rows()[sav.iteration])
        return int(self.iterations.t_start[r]), int(self.iterations.t_end[r])

    @cached_property
    def block_class(self) -> np.ndarray:
        """One class name (CLASSES) per block row, an object array of str."""
        return np.array(self.blocks.class_names(), dtype=object)

    def accesses_of(self, row: int) -> np.ndarray:
        """Access times (ns) of block ``row``, in op order."""
        bm = self.blocks
        return bm.acc_t[bm.acc_ptr[row]: bm.acc_ptr[row + 1]]

    def idle_intervals(self, row: int) -> list[tuple[int, int]]:
        """(start, end) ns between consecutive accesses of block ``row`` (gaps of zero left out)."""
        t = self.accesses_of(row)
        keep = np.diff(t) > 0
        return list(zip(t[:-1][keep].tolist(), t[1:][keep].tolist()))


def analyse(capture, *, bandwidth: float | None = None, ratios=TIME_RATIOS, progress: bool | None = None,
            min_swap_bytes: int | None = None) -> Analysis:
    """Run the whole model on a capture, once per capture and options: the Analysis is cached on
    the capture, so the report, the exports and the verbs share it. ``bandwidth`` (B/s) overrides
    the capture's and the default 55e9; ``progress`` draws a bar on stderr (default: when it is a
    terminal) when the model runs."""
    key = (bandwidth, tuple(ratios), min_swap_bytes)
    cache = getattr(capture, "_pyobmem_analyses", None)
    if cache is None:
        cache = capture._pyobmem_analyses = {}
    if key not in cache:
        cache[key] = _analyse(capture, bandwidth, ratios, progress, min_swap_bytes)
    return cache[key]


def _analyse(capture, bandwidth, ratios, progress, min_swap_bytes) -> Analysis:
    with Progress("analysing", 5, enabled=progress) as p:
        p.step("iterations", 0)
        it = detect_iterations(capture)
        p.step("blocks")
        bm = build_blocks(capture, it)
        p.step("tensors")
        tm = build_tensors(capture, it, bm)
        p.step("properties")
        props = compute_tensor_properties(it, bm, tm)
        p.step("saving bound")
        kw = {} if min_swap_bytes is None else {"min_bytes": min_swap_bytes}
        sav = saving_curve(capture, it, bm, bandwidth=bandwidth, ratios=ratios, tm=tm, **kw)
        p.step("done")
    return Analysis(capture=capture, iterations=it, blocks=bm, properties=props, saving=sav, tensors=tm)


def blocks_by_class(bm) -> dict:
    """class name -> {"count", "bytes"} for every class (zeros included), of a BlockModel or a
    TensorModel (sub-blocks)."""
    cnt = np.bincount(bm.cls.astype(np.int64), minlength=len(CLASSES))
    byt = np.bincount(bm.cls.astype(np.int64), weights=bm.size.astype(np.float64), minlength=len(CLASSES))
    return {c: {"count": int(cnt[i]), "bytes": int(byt[i])} for i, c in enumerate(CLASSES)}


def patterns_json(capture_or_analysis, **kw) -> dict:
    """The figures committed per workload: iterations_detected, period_launches, iterative
    ({blocks, bytes} shares), regular (0..1), extremal ({top10_share, gini}), blocks_by_class,
    saving_curve ([[time_ratio, bytes_saved], ...]), peak_live_bytes. None where not measurable."""
    a = capture_or_analysis if isinstance(capture_or_analysis, Analysis) else analyse(capture_or_analysis, **kw)
    it, pr = a.iterations, a.properties
    main = it.main_regime
    seg = pr.segment if pr.segment is not None else pr
    return {
        "iterations_detected": int(main.count) if main else 0,
        "period_launches": int(main.period_ops) if main else None,
        "iterative": None if pr.iterative_bytes is None else {
            "blocks": round(pr.iterative_blocks, 4), "bytes": round(pr.iterative_bytes, 4),
            "intervals": None if pr.iterative_intervals is None else round(pr.iterative_intervals, 4)},
        "regular": None if pr.regular is None else round(pr.regular, 4),
        "extremal": None if pr.extremal_top is None else {
            "top10_share": round(pr.extremal_top, 4), "gini": round(pr.extremal_gini, 4)},
        "level": pr.level,
        "blocks_by_class": blocks_by_class(a.tensors if a.tensors is not None else a.blocks),
        "segment_level": {
            "iterative": None if seg.iterative_bytes is None else {
                "blocks": round(seg.iterative_blocks, 4), "bytes": round(seg.iterative_bytes, 4)},
            "regular": None if seg.regular is None else round(seg.regular, 4),
            "extremal": None if seg.extremal_top is None else {
                "top10_share": round(seg.extremal_top, 4), "gini": round(seg.extremal_gini, 4)},
            "blocks_by_class": blocks_by_class(a.blocks),
        },
        "saving_curve": [[r, b] for r, b in a.saving.points] if a.saving else [],
        "peak_live_bytes": int(a.blocks.peak_live_bytes),
    }
