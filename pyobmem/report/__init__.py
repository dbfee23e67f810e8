"""The HTML report of a capture (``pyobmem report FILE -o report.html``): one self-contained file.

``render(capture) -> str`` builds it (report/html.py, plots in report/svg.py); the analysis it
shows comes from report/analysis.py.
"""

from __future__ import annotations

from .html import render


def write(capture, f) -> None:
    """Write the report of ``capture`` to the text file ``f``."""
    f.write(render(capture))


__all__ = ["render", "write"]
