#!/usr/bin/env bash
# Context parallelism on a machine with two GPUs (four: also cp=4 and a2a+p2p at 2 x 2); logs and JUnit XML go to the folder named by
# the LOG_DIR environment variable (default ./gpu-logs):
#   bash tools/cp_suite.sh
# 1) the one-GPU CP tests and the two-GPU test (torchrun tests/cp_two_gpu.py through pytest; with
#    four GPUs also --nproc-per-node 4: 31 PASS lines),
# 2) examples/context_parallel.py under torchrun at S = 32K, 64K, 128K (p2p and a2a, one-GPU
#    comparison, --fit), 3) the same sizes with --alone 2 (one rank without communication).
set -uo pipefail
cd "$(dirname "$0")/.."
LOG_DIR="${LOG_DIR:-gpu-logs}"
mkdir -p "$LOG_DIR"
if ! python3 -c "import cudnn" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/te_cudnn_site .whl/*.whl || exit 2
  export PYTHONPATH="/tmp/te_cudnn_site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$LOG_DIR/gpu.txt"
nvidia-smi topo -m > "$LOG_DIR/topo.txt" 2>&1
python3 -m pytest -n 0 -p no:cacheprovider -q -rfEs -s tests/test_cp_multi_gpu.py tests/test_cp_gpu.py \
  --junitxml="$LOG_DIR/junit-cp.xml" 2>&1 | grep -v nanobind | tee "$LOG_DIR/pytest-cp.log" | grep "PASS\|passed\|failed\|Error" | tail -30
rc=${PIPESTATUS[0]}
torchrun --standalone --nproc-per-node 2 examples/context_parallel.py --seqlens 32768 65536 131072 --fit \
  --json "$LOG_DIR/cp_bench.json" 2>&1 | grep -v "nanobind\|UserWarning\|return func" | tee "$LOG_DIR/cp_bench.log" | tail -20
python3 examples/context_parallel.py --alone 2 --seqlens 32768 65536 131072 --fit --iters 3 \
  --json "$LOG_DIR/cp_alone.json" 2>&1 | grep -v nanobind | tee "$LOG_DIR/cp_alone.log" | tail -12
exit "$rc"
