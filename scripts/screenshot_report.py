#!/usr/bin/env python3
"""Render a pyobmem HTML report to PNG with headless Chromium.

    python scripts/screenshot_report.py REPORT.html -o OUT.png          # an existing report
    python scripts/screenshot_report.py --capture FILE.pyobmem -o OUT.png  # report + screenshot
    python scripts/screenshot_report.py --synthetic -o /tmp/report_example.png

``--synthetic`` builds the synthetic training loop of tests/test_report.py (no GPU needed).
Chromium is looked up as chromium, chromium-browser, google-chrome (or $CHROMIUM); on Debian:
``apt-get install -y chromium``. Nothing is fetched: the report is self-contained and the
browser runs with networking features off.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def find_chromium() -> str:
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    sys.exit("screenshot_report: no chromium found (apt-get install -y chromium, or set CHROMIUM)")


def screenshot(html_path: str, png_path: str, width: int = 1400, height: int = 2400) -> None:
    """Render ``html_path`` at width x height CSS pixels into ``png_path``."""
    with tempfile.TemporaryDirectory() as profile:
        cmd = [find_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
               f"--user-data-dir={profile}", f"--screenshot={os.path.abspath(png_path)}",
               f"--window-size={width},{height}", "file://" + os.path.abspath(html_path)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0 or not os.path.exists(png_path):
        sys.exit(f"screenshot_report: chromium failed ({r.returncode}): {r.stderr.strip()[-500:]}")


def synthetic_capture(path: str) -> str:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from test_report import training_trace  # noqa: E402

    t, _ = training_trace(iterations=8)
    t.write(path, meta={"argv": ["python", "train.py"], "command": "python train.py (synthetic)",
                        "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}})
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("html", nargs="?", help="report HTML to render")
    src.add_argument("--capture", help="capture file: write its report, then render it")
    src.add_argument("--synthetic", action="store_true", help="render the report of a synthetic training loop")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=2400)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        html = args.html
        if not html:
            from pyobmem.capture import read_capture
            from pyobmem.report import render

            cap_path = args.capture or synthetic_capture(os.path.join(tmp, "synthetic.pyobmem"))
            html = os.path.join(tmp, "report.html")
            with open(html, "w", encoding="utf-8") as f:
                f.write(render(read_capture(cap_path)))
        screenshot(html, args.output, args.width, args.height)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
