#!/usr/bin/env bash
# Run te_cudnn's test-suite (GPU tests included), the demo and the benchmark on a machine
# with a GPU and no internet. The cuDNN frontend is installed from a local wheel folder
# (default .whl/, filled by `pip download nvidia-cudnn-frontend==1.32.*` elsewhere) when it
# is not importable. Logs go to $LOG_DIR (default ./gpu-logs).
#   usage: tools/run_gpu_suite.sh [pytest args...]      e.g. tools/run_gpu_suite.sh -m gpu -x
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS="${TE_CUDNN_WHEELS:-.whl}"
LOG_DIR="${LOG_DIR:-gpu-logs}"
mkdir -p "$LOG_DIR"
if ! python3 -c "import cudnn" 2>/dev/null; then
  site="${TE_CUDNN_SITE:-/tmp/te_cudnn_site}"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$WHEELS"/*.whl || {
    echo "cannot import cudnn and cannot install it from $WHEELS" >&2; exit 2; }
  export PYTHONPATH="$site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$LOG_DIR/gpu.txt"
python3 -m pytest tests -n 0 -p no:cacheprovider -q -rs --junitxml="$LOG_DIR/junit.xml" "$@" 2>&1 | tee "$LOG_DIR/pytest.log"
rc=${PIPESTATUS[0]}
if [ "${TE_CUDNN_SKIP_BENCH:-0}" != 1 ]; then
  python3 -m te_cudnn.demo 2>&1 | tee "$LOG_DIR/demo.log"
  python3 tools/bench.py --json "$LOG_DIR/bench.json" 2>&1 | tee "$LOG_DIR/bench.log"
fi
exit "$rc"
