"""The HTML report of a capture (``pyobmem report FILE -o report.html``): one self-contained file.

``render(capture) -> str`` builds it (report/html.py, plots in report/svg.py); the analysis it
shows is the model's (``pyobmem.model.analyse``, cached per capture), with the property rows and
the swap candidates table of report/analysis.py.
"""

from __future__ import annotations

from .html import render


def write(capture, f, ranks: str | None = None, subject: str | None = None) -> None:
    """Write the report of ``capture`` to the text file ``f`` (``ranks``, ``subject``: see render)."""
    f.write(render(capture, ranks=ranks, subject=subject))


__all__ = ["render", "write"]
