#!/usr/bin/env bash
# The GPU check of evdb's CUDA kernels, in one run of at most 8 minutes:
#   1. find a Python with cupy (installing cupy-cuda<major>x, the driver's CUDA major, if
#      missing) and evdb's own dependencies (from wheels in .whl/ when there is no network);
#   2. pytest tests/gpu tests/kernels (the GPU parity suite, then the CPU one as a control);
#   3. the table suite with its HBM tier on device 0 (EVDB_REAL_CUPY=1: the device=0 tests
#      that CI runs on the cupy stand-in, here on the GPU);
#   4. bench/bench_gpu.py: hash find / find_or_insert / insert_or_assign throughput against a
#      cupy take gather, a device copy and HierarchicalKV's published A100 figures;
#   5. bench/bench_gpu_train.py: a training step with the hot rows in HBM against
#      torch.nn.EmbeddingBag(sparse=True) on CUDA (skipped without CUDA torch).
# Each stage runs under `timeout`; logs go to the directory given as the first argument.
# Without a GPU it prints "no GPU: skipped" and exits 0.
#
# Usage: bash bench/gpu_check.sh LOGDIR
# Offline machines: put wheels in .whl/ first (e.g. rocksdict for the machine's Python).
set -u -o pipefail
LOG=${1:?usage: bash bench/gpu_check.sh LOGDIR}
mkdir -p "$LOG"
LOG=$(cd "$LOG" && pwd)
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
START=$SECONDS

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >"$LOG/nvidia-smi.txt" 2>&1; then
    echo "no GPU: skipped (nvidia-smi finds no device)"
    exit 0
fi
nvidia-smi >>"$LOG/nvidia-smi.txt" 2>&1
CUDA_MAJOR=$(sed -n 's/.*CUDA Version: *\([0-9]*\)\..*/\1/p' "$LOG/nvidia-smi.txt" | head -n 1)
CUDA_MAJOR=${CUDA_MAJOR:-12}
echo "driver supports CUDA $CUDA_MAJOR; logs in $LOG"

# -- 1. a Python with cupy and evdb's dependencies -------------------------------------------
has_cupy() { timeout 60 "$1" -c "import cupy; assert cupy.cuda.runtime.getDeviceCount() > 0" >/dev/null 2>&1; }
PY=""
for candidate in .venv/bin/python python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "import numpy" >/dev/null 2>&1; then
        PY=$candidate
        break
    fi
done
if [ -z "$PY" ]; then
    echo "no Python with numpy found" | tee "$LOG/install.log"
    exit 1
fi
if ! has_cupy "$PY"; then
    echo "installing cupy-cuda${CUDA_MAJOR}x into $PY" | tee -a "$LOG/install.log"
    if ls .whl/cupy*.whl >/dev/null 2>&1; then
        timeout 120 "$PY" -m pip install -q --no-index --find-links .whl "cupy-cuda${CUDA_MAJOR}x" >>"$LOG/install.log" 2>&1
    else
        timeout 120 "$PY" -m pip install -q "cupy-cuda${CUDA_MAJOR}x" >>"$LOG/install.log" 2>&1
    fi
fi
if ! has_cupy "$PY" && [ "$PY" != python3 ] && has_cupy python3; then
    echo "using python3, which has cupy" | tee -a "$LOG/install.log"
    PY=python3
fi
if ! has_cupy "$PY"; then
    echo "FAILED: no working cupy for $PY (see $LOG/install.log)"
    exit 1
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import evdb" >>"$LOG/install.log" 2>&1; then
    # A fresh machine: evdb's dependencies into a private folder, from .whl/ or the network.
    SITE=/tmp/evdb-gpu-check-site
    if ls .whl/*.whl >/dev/null 2>&1; then
        timeout 120 "$PY" -m pip install -q --no-index --no-deps --target "$SITE" .whl/*.whl >>"$LOG/install.log" 2>&1
    else
        timeout 120 "$PY" -m pip install -q --target "$SITE" rocksdict xxhash click >>"$LOG/install.log" 2>&1
    fi
    export PYTHONPATH="$PYTHONPATH:$SITE"
    if ! "$PY" -c "import evdb" >>"$LOG/install.log" 2>&1; then
        echo "FAILED: import evdb (see $LOG/install.log)"
        exit 1
    fi
fi
"$PY" -c "import cupy, numpy, sys; print('python', sys.version.split()[0], 'cupy', cupy.__version__, 'numpy', numpy.__version__)" | tee "$LOG/versions.txt"

# -- 2. tests ----------------------------------------------------------------------------------
status=0
timeout 240 "$PY" -m pytest tests/gpu tests/kernels -q -p no:cacheprovider --ignore=tests/gpu/test_table_on_device.py 2>&1 | tee "$LOG/pytest.log" || status=1
echo "tests: exit $status after $((SECONDS - START)) s"

# -- 3. the table suite on device 0 ------------------------------------------------------------
EVDB_REAL_CUPY=1 timeout 90 "$PY" -m pytest -q -p no:cacheprovider -k "not cpu" \
    tests/tiers/test_table_with_hbm.py tests/tiers/test_hbm_device.py tests/gpu/test_table_on_device.py \
    tests/gpu/test_device_path.py tests/test_torch_device.py tests/gpu/test_lowp_on_device.py \
    2>&1 | tee "$LOG/pytest_device0.log" || status=1
echo "device=0 suite: exit $status after $((SECONDS - START)) s"

# -- 4. benchmark ------------------------------------------------------------------------------
left=$((470 - 75 - (SECONDS - START)))  # 8 minutes in all, less the training step and a margin
if [ "$left" -lt 30 ]; then
    echo "benchmark skipped: $left s left of the 8 minutes" | tee "$LOG/bench_gpu.log"
    exit 1
fi
timeout "$left" "$PY" bench/bench_gpu.py 2>&1 | tee "$LOG/bench_gpu.log" || status=1

# -- 5. a training step with the hot rows in HBM -------------------------------------------------
left=$((470 - (SECONDS - START)))
if [ "$left" -lt 20 ]; then
    echo "training step skipped: $left s left of the 8 minutes" | tee "$LOG/bench_gpu_train.log"
    exit 1
fi
timeout "$left" "$PY" bench/bench_gpu_train.py 2>&1 | tee "$LOG/bench_gpu_train.log" || status=1
echo "done: exit $status after $((SECONDS - START)) s"
exit $status
