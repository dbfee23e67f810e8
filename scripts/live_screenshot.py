"""docs/live.png: a screenshot of ``pyobmem live`` in tmux, on tests/data/gpt_tiny.pyobmem growing.

    python3 scripts/live_screenshot.py [-o docs/live.png] [--records N]

Runs the view in a 120x40 tmux pane on a copy of the capture that has its header and its first N
records (a run in its 6th iteration), reads the pane with its colours (``capture-pane -e``), has
rich write it as SVG, and headless Chromium (Debian's ``chromium``) turn the SVG into PNG.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.text import Text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyobmem.capture import read_header  # noqa: E402

SOURCE = ROOT / "tests" / "data" / "gpt_tiny.pyobmem"
COLS, ROWS = 120, 40


def _tmux(sock: str, *args: str, env: dict) -> str:
    return subprocess.run(["tmux", "-u", "-S", sock, *args], env=env, check=True, capture_output=True,
                          text=True).stdout


def grab(records: int) -> str:
    """The pane, with its colours as ANSI escapes, once the view shows the figures of the records."""
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "LANG": "C.UTF-8", "TERM": "xterm-256color"}
        sock, cap = os.path.join(d, "sock"), os.path.join(d, "train.pyobmem")
        raw = SOURCE.read_bytes()
        offset = read_header(str(SOURCE))[1]
        _tmux(sock, "new-session", "-d", "-x", str(COLS), "-y", str(ROWS),
              f"cd {d} && {sys.executable} -m pyobmem live train.pyobmem; sleep 60", env=env)
        try:
            Path(cap).write_bytes(raw[: offset + 64 * records])
            deadline = time.monotonic() + 60
            while "current" not in _tmux(sock, "capture-pane", "-p", env=env):
                if time.monotonic() > deadline:
                    raise SystemExit("the view never showed the figures")
                time.sleep(0.2)
            time.sleep(1)  # one more tick: the state line settled
            return _tmux(sock, "capture-pane", "-p", "-e", env=env)
        finally:
            subprocess.run(["tmux", "-S", sock, "kill-server"], env=env, capture_output=True)


def to_png(ansi: str, out: Path) -> None:
    console = Console(record=True, width=COLS, file=io.StringIO(), force_terminal=True, color_system="truecolor")
    for line in ansi.rstrip("\n").split("\n")[:ROWS]:
        console.print(Text.from_ansi(line), no_wrap=True, crop=True)
    with tempfile.TemporaryDirectory() as d:
        svg = Path(d) / "live.svg"
        console.save_svg(str(svg), title="pyobmem live train.pyobmem")
        width, height = (round(float(v)) for v in re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', svg.read_text()).groups())
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if chromium is None:
            raise SystemExit("needs chromium (apt-get install -y chromium)")
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--window-size={width},{height}", f"--screenshot={out.resolve()}", svg.as_uri()],
                       check=True, capture_output=True, timeout=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--output", type=Path, default=ROOT / "docs" / "live.png")
    p.add_argument("--records", type=int, default=2400, help="records of the capture written when grabbed")
    args = p.parse_args()
    to_png(grab(args.records), args.output)
    print(args.output)


if __name__ == "__main__":
    main()
