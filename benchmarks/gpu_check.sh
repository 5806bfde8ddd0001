#!/usr/bin/env bash
# The GPU checks in one go on a lent, offline machine that has torch with CUDA, accelerate and
# lightning but not accelify: the gpu-marked tests, then the benchmark's GPU section (quick mode).
#
#     OUT=folder benchmarks/gpu_check.sh [tests] [bench] [fingerprint]   (none named: all)
#
# accelify is imported from this checkout through a symlink (an editable install would fetch its
# build backend and write into the machine's site-packages), and the wheels in .whl/, if any,
# supply what the machine lacks (libcst, pytest-regressions, typer, jsonschema). Logs and results
# land flat in $OUT. A part that fails leaves the next to run; the exit status is the last nonzero
# one. The parts' time limits keep the whole under 8 minutes (typically ~5 on an H100).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
PY=$(command -v "${PYTHON:-python3}")
PARTS=${*:-tests bench fingerprint}
WORK=$(mktemp -d /tmp/accelify-gpu.XXXXXX)
LOG=$OUT/gpu_check.log
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
status=0

{ date -u; nvidia-smi -L; "$PY" --version; } 2>&1 | tee "$LOG"

# Wheels first on the path, so their versions win over older ones the machine may have.
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$WORK/site" .whl/*.whl 2>&1 | tee -a "$LOG" || status=$?
fi

# pyproject.toml maps transform/, runtime/ and rules/ to accelify.* and leaves `accelify` an
# implicit namespace package: a folder named accelify that is this checkout gives the same names.
mkdir -p "$WORK/path" "$WORK/bin"
ln -sfn "$PWD" "$WORK/path/accelify"
# The CLIs' --version reads the package's metadata, which only an install writes.
info="$WORK/path/accelify-0.dist-info"
mkdir -p "$info"
printf 'Metadata-Version: 2.1\nName: accelify\nVersion: %s\n' \
    "$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)" >"$info/METADATA"
export PYTHONPATH=$WORK/site:$WORK/path${PYTHONPATH:+:$PYTHONPATH}

# Console scripts on PATH, written the way pip writes them (pyproject.toml's [project.scripts]).
script() {
    printf '#!%s\nimport sys\nfrom %s import %s\nsys.exit(%s())\n' "$PY" "$2" "$3" "$3" >"$WORK/bin/$1"
    chmod +x "$WORK/bin/$1"
}
script accel-run accelify.runtime.launch.cli main
script accel-convert accelify.transform.startup convert
script accel-lint accelify.transform.startup lint
command -v torchrun >/dev/null || script torchrun torch.distributed.run main
command -v accelerate >/dev/null || script accelerate accelerate.commands.accelerate_cli main
export PATH=$WORK/bin:$PATH

"$PY" - <<'EOF' 2>&1 | tee -a "$LOG" || status=$?
import os, shutil, sys
from importlib import metadata
import torch
import accelify.rules, accelify.runtime, accelify.transform
print("accelify from", os.path.dirname(accelify.runtime.__file__))
print("torch", torch.__version__, "CUDA", torch.version.cuda, torch.cuda.is_available())
for dist in ("accelerate", "lightning", "libcst", "typer", "click", "pytest-regressions"):
    try:
        print(dist, metadata.version(dist))
    except metadata.PackageNotFoundError:
        print(dist, "not installed")
tools = ("accel-run", "torchrun", "accelerate")
print("on PATH:", {name: shutil.which(name) for name in tools})
# benchmarks/timing.py's tool() looks beside the interpreter; the GPU section needs none of them.
here = os.path.dirname(sys.executable)
print("beside", sys.executable, [n for n in tools if os.path.exists(os.path.join(here, n))])
EOF

for part in $PARTS; do
    echo "=== $part, $(date -u +%T)" | tee -a "$LOG"
    case $part in
        tests)
            # Every module is collected; one that cannot import must not stop the GPU tests.
            flags=(-m gpu -q -rfEs -p no:cacheprovider --continue-on-collection-errors)
            "$PY" -c "import pytest_timeout" 2>/dev/null && flags+=(--timeout=120)
            timeout -k 10 150 "$PY" -m pytest "${flags[@]}" tests/ 2>&1 \
                | tee "$OUT/gpu_tests.log" || status=$?
            ;;
        bench)
            timeout -k 10 330 "$PY" benchmarks/run.py --quick --only gpu --out "$OUT/bench" 2>&1 \
                | tee "$OUT/bench.log" || status=$?
            ;;
        fingerprint)
            # One GPU runs one process, where the replica check never runs: time what it would
            # add, the fingerprint of GPT-2 small's parameters, to set beside the step time.
            timeout -k 10 120 "$PY" - <<'PY' 2>&1 | tee "$OUT/fingerprint.log" || status=$?
import sys, time
import torch
sys.path.insert(0, "benchmarks")
from loops import GPT, GPTS
from accelify.runtime import replicas
params = list(GPT(GPTS["gpt2"]).cuda().parameters())
device = torch.device("cuda")
runs = []
for _ in range(25):
    torch.cuda.synchronize()
    start = time.perf_counter()
    replicas._fingerprint(params, device).cpu()
    runs.append((time.perf_counter() - start) * 1e3)
runs = sorted(runs[5:])
print(f"fingerprint of {sum(p.numel() for p in params):,} parameters: median {runs[10]:.2f} ms")
PY
            ;;
        *)
            echo "unknown part $part (tests, bench, fingerprint)" | tee -a "$LOG"
            status=2
            ;;
    esac
    echo "=== $part done, $(date -u +%T), status so far $status" | tee -a "$LOG"
done
rm -rf "$WORK"
exit "$status"
