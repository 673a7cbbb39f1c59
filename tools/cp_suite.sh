#!/usr/bin/env bash
# Context parallelism on a machine with two or four GPUs; logs, JSON and JUnit XML go to the folder
# named by the LOG_DIR environment variable (default ./gpu-logs):
#   bash tools/cp_suite.sh
# 1) the one-GPU CP tests and the multi-GPU tests (torchrun tests/cp_two_gpu.py through pytest:
#    23 PASS lines at 2 GPUs; with four GPUs also --nproc-per-node 4: 31),
# 2) examples/context_parallel.py under torchrun on 2 GPUs at S = 32K, 64K, 128K (p2p and a2a with
#    head_groups 1, 2, 4; --fit), and with four GPUs at S = 64K, 128K, 256K (every comm type,
#    a2a+p2p on a 2 x 2 grid; --fit), 3) a sliding window of 4K keys at S = 128K (p2p, a2a,
#    all_gather) on all the GPUs. The guide's "What to expect" table comes from these runs.
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
run() {  # run NAME ARGS...: one example run, its log and JSON under LOG_DIR
  local name=$1; shift
  "$@" --json "$LOG_DIR/$name.json" 2>&1 | grep -v "nanobind\|UserWarning\|return func\|OMP_NUM\|\*\*\*\*" \
    | tee "$LOG_DIR/$name.log" | tail -30
}
gpus=$(nvidia-smi --list-gpus | wc -l)
run cp2 env CUDA_VISIBLE_DEVICES=0,1 torchrun --standalone --nproc-per-node 2 examples/context_parallel.py \
  --seqlens 32768 65536 131072 --comm p2p a2a --head-groups 1 2 4 --iters 3 --fit
if [ "$gpus" -ge 4 ]; then
  run cp4 torchrun --standalone --nproc-per-node 4 examples/context_parallel.py --seqlens 65536 131072 262144 \
    --comm p2p a2a a2a+p2p all_gather --head-groups 1 2 --iters 3 --fit
fi
n=$([ "$gpus" -ge 4 ] && echo 4 || echo 2)
run "cp${n}_window" torchrun --standalone --nproc-per-node "$n" examples/context_parallel.py --seqlens 131072 \
  --window 4096 --comm p2p a2a all_gather --iters 3
exit "$rc"
