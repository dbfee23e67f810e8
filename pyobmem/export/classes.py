"""The block class of each block (persistent, iteration-scoped, transient, arena, never-accessed),
for labelling exports. Comes from the report's analysis (pyobmem.report.analysis), which uses
pyobmem.model."""

from __future__ import annotations


def block_classes(capture) -> list[str]:
    """One class name per row of ``capture.blocks``."""
    from ..report.analysis import analyse

    return list(analyse(capture).block_class)
