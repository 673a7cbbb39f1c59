#!/usr/bin/env bash
# The GPU test suite in parts of under 10 minutes each on an H100; logs and JUnit XML go to
# the folder named by the LOG_DIR environment variable (default ./gpu-logs).
#   bash tools/gpu_suite.sh 1   # GPU tests of tests/test_[a-o]*.py
#   bash tools/gpu_suite.sh 2   # GPU tests of tests/test_[p-z]*.py
#   bash tools/gpu_suite.sh 3   # the CPU tests with libcudnn present (hypothesis file excluded)
#   bash tools/gpu_suite.sh example   # examples/train_gpt.py with its defaults (about 4 minutes on an H100)
# Each part installs the frontend from .whl/ when needed (see tools/run_gpu_suite.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
part="${1:?usage: tools/gpu_suite.sh 1|2|3|example}"
LOG_DIR="${LOG_DIR:-gpu-logs}"
mkdir -p "$LOG_DIR"
export TE_CUDNN_SKIP_BENCH=1 PYTHONUNBUFFERED=1
case "$part" in
  1) files=$(ls tests/test_[a-o]*.py); marker="gpu" ;;
  2) files=$(ls tests/test_[p-z]*.py); marker="gpu" ;;
  3) files=$(ls tests/test_*.py | grep -v test_properties_cpu.py); marker="not gpu" ;;
  example) ;;
  *) echo "part must be 1, 2, 3 or example" >&2; exit 2 ;;
esac
if ! python3 -c "import cudnn" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/te_cudnn_site .whl/*.whl || exit 2
  export PYTHONPATH="/tmp/te_cudnn_site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$LOG_DIR/gpu.txt"
if [ "$part" = example ]; then
  python3 examples/train_gpt.py --png "$LOG_DIR/train_gpt_loss.png" --json "$LOG_DIR/train_gpt.json" 2>&1 | tee "$LOG_DIR/train_gpt.log" | tail -16
  exit "${PIPESTATUS[0]}"
fi
python3 -m pytest -n 0 -p no:cacheprovider -q -rfEs -m "$marker" --junitxml="$LOG_DIR/junit-$part.xml" $files 2>&1 \
  | tee "$LOG_DIR/pytest-$part.log" | grep -v "^ - \|nanobind" | tail -25
exit "${PIPESTATUS[0]}"
