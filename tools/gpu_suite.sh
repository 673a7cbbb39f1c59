#!/usr/bin/env bash
# The GPU test suite in parts of under 10 minutes each on an H100; logs and JUnit XML go to
# the folder named by the LOG_DIR environment variable (default ./gpu-logs).
#   bash tools/gpu_suite.sh 1   # GPU tests of tests/test_[a-o]*.py
#   bash tools/gpu_suite.sh 2   # GPU tests of tests/test_[p-z]*.py
#   bash tools/gpu_suite.sh 3   # the CPU tests with libcudnn present (the fused_attn property files excluded)
#   bash tools/gpu_suite.sh files 'tests/test_r*.py' ...   # GPU tests of the files the globs name
#   bash tools/gpu_suite.sh example   # examples/train_gpt.py with its defaults (about 4 minutes on an H100)
# Parts 1 and 2 run in chunks of files, one pytest process, log and JUnit file each, and end
# with the totals of all chunks. With GPU_SUITE_DEADLINE=SECONDS no chunk starts after that
# many seconds: the chunks left out are listed with the command that runs them, so a part cut
# short on a slow host keeps the results of the chunks it finished.
# Each part installs the frontend from .whl/ when needed (see tools/run_gpu_suite.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
part="${1:?usage: tools/gpu_suite.sh 1|2|3|files GLOB...|example}"
shift
LOG_DIR="${LOG_DIR:-gpu-logs}"
mkdir -p "$LOG_DIR"
export TE_CUDNN_SKIP_BENCH=1 PYTHONUNBUFFERED=1
case "$part" in
  1) chunks=("tests/test_[a-b]*.py" "tests/test_c*.py" "tests/test_[d-f]*.py" "tests/test_[g-o]*.py") ;;
  2) chunks=("tests/test_[p-q]*.py" "tests/test_r*.py" "tests/test_s*.py" "tests/test_[t-z]*.py") ;;
  files) [ $# -gt 0 ] || { echo "files needs one or more globs, e.g. 'tests/test_r*.py'" >&2; exit 2; }
         chunks=("$*") ;;
  3|example) ;;
  *) echo "part must be 1, 2, 3, files or example" >&2; exit 2 ;;
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
if [ "$part" = 3 ]; then
  files=$(ls tests/test_*.py | grep -v test_properties_fused_attn_)
  python3 -m pytest -n 0 -p no:cacheprovider -q -rfEs -m "not gpu" --junitxml="$LOG_DIR/junit-3.xml" $files 2>&1 \
    | tee "$LOG_DIR/pytest-3.log" | grep -v "^ - \|nanobind" | tail -25
  exit "${PIPESTATUS[0]}"
fi
rm -f "$LOG_DIR"/junit-"$part"-*.xml "$LOG_DIR"/pytest-"$part"-*.log  # the totals count this run's files only
status=0 start=$SECONDS i=0 left=()
for chunk in "${chunks[@]}"; do
  i=$((i + 1))
  name="$part-$i"
  if [ -n "${GPU_SUITE_DEADLINE:-}" ] && (( SECONDS - start > GPU_SUITE_DEADLINE )); then
    left+=("$chunk")
    continue
  fi
  t0=$SECONDS
  # shellcheck disable=SC2086 # the chunk is a glob
  python3 -m pytest -n 0 -p no:cacheprovider -q -rfEs -m gpu --junitxml="$LOG_DIR/junit-$name.xml" $chunk \
    > "$LOG_DIR/pytest-$name.log" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] || status=$rc
  grep "^FAILED\|^ERROR" "$LOG_DIR/pytest-$name.log"
  echo "[$name] $chunk: $(grep -v '^ - \|nanobind' "$LOG_DIR/pytest-$name.log" | tail -1) ($((SECONDS - t0)) s)"
done
python3 - "$LOG_DIR" "$part" <<'EOF'
import glob, sys, xml.etree.ElementTree as ET
counts = dict(tests=0, failures=0, errors=0, skipped=0)
for path in sorted(glob.glob(f"{sys.argv[1]}/junit-{sys.argv[2]}-*.xml")):
    root = ET.parse(path).getroot()
    for suite in ([root] if root.tag == "testsuite" else root.iter("testsuite")):
        for key in counts:
            counts[key] += int(suite.get(key, 0))
bad = counts["failures"] + counts["errors"]
print(f"part {sys.argv[2]}: {counts['tests'] - bad - counts['skipped']} passed, {counts['skipped']} skipped, "
      f"{counts['failures']} failed, {counts['errors']} errors")
EOF
if [ ${#left[@]} -gt 0 ]; then
  echo "not started (GPU_SUITE_DEADLINE=$GPU_SUITE_DEADLINE): bash tools/gpu_suite.sh files$(printf " '%s'" "${left[@]}")"
  [ "$status" -ne 0 ] || status=3
fi
exit "$status"
