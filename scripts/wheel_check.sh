#!/usr/bin/env bash
# The wheel on a GPU machine: a pyobmem wheel built elsewhere (`python -m build --wheel`, into dist/)
# is installed into a fresh venv over the machine's torch (--system-site-packages) offline, with
# CUDA_HOME and PYTHONPATH unset, and its `pyobmem-run` traces the tiny GPT from outside the
# source tree:
#
#     scripts/wheel_check.sh [WHEEL]        (default: the one dist/pyobmem-*.whl)
#
# The wheels under .whl/ (runtime dependencies the machine lacks, e.g. cffi and pycparser; not
# pyobmem's own, which gpu_session.sh would put ahead of the source tree) are installed with it (--no-index --no-deps). Prints the capture's summary and one line
# "wheel check: ..."; exits 0 only if the installed copy (shim and package) traced the run and
# the capture has kernel launches attributed to blocks. With $OUT set, the capture is copied there.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PYTHON=${PYTHON:-python3}

shopt -s nullglob
if (( $# )); then
    WHEEL=$(realpath "$1")
else
    found=(dist/pyobmem-*.whl)
    (( ${#found[@]} == 1 )) || { echo "wheel check: want exactly one dist/pyobmem-*.whl, found ${#found[@]}" >&2; exit 2; }
    WHEEL=$REPO/${found[0]}
fi
DEPS=(.whl/*.whl)

unset CUDA_HOME PYTHONPATH PYOBMEM_SHIM VIRTUAL_ENV
WORK=$(mktemp -d /tmp/pyobmem-wheel.XXXXXX)
"$PYTHON" -m venv --system-site-packages "$WORK/venv"
# A python that is itself a venv (the H200's /opt/torch/.venv) keeps the machine's torch and numpy in
# its own site-packages, which --system-site-packages does not reach: lend it with a .pth, after
# the new venv's own site-packages (the wheel's pyobmem comes first).
outer=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
inner=$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[[ $outer == "$inner" ]] || echo "$outer" > "$inner/_machine_site.pth"
"$WORK/venv/bin/python" -m pip install -q --no-index --no-deps "$WHEEL" "${DEPS[@]}"
export PATH=$WORK/venv/bin:$PATH
mkdir "$WORK/run"
cd "$WORK/run"  # outside the source tree: only the installed copy can be imported

echo "wheel check: $(basename "$WHEEL") into $WORK/venv ($(python3 --version))"
rc=0
pyobmem-run -o gpt.pyobmem python3 "$REPO/scripts/workloads/gpt.py" --size tiny --steps 5 || rc=$?
(( rc == 0 )) || { echo "wheel check: FAILED, pyobmem-run exited $rc"; exit 1; }
pyobmem summary gpt.pyobmem
if [[ -n ${OUT:-} ]]; then cp gpt.pyobmem "$OUT/wheel_gpt.pyobmem"; fi
python3 - "$WORK/venv" <<'EOF'
import os
import sys

import pyobmem
from pyobmem.abi import Ev
from pyobmem.capture import read_capture

venv = os.path.realpath(sys.argv[1])
cap = read_capture("gpt.pyobmem")
launches = cap.ops[cap.ops["type"] == Ev.LAUNCH]
attributed = int((launches["n_touched"] > 0).sum())
installed = os.path.realpath(pyobmem.__file__).startswith(venv + os.sep)
shim_installed = os.path.realpath(cap.meta["shim"]).startswith(venv + os.sep)
ok = installed and shim_installed and cap.complete and attributed > 0
print(f"wheel check: {'OK' if ok else 'FAILED'}, {attributed} of {len(launches)} launches attributed, "
      f"{len(cap.blocks)} blocks, package {pyobmem.__file__}, shim {cap.meta['shim']}, complete {cap.complete}")
sys.exit(0 if ok else 1)
EOF
