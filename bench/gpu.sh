#!/usr/bin/env bash
# The whole GPU measurement in one command, for a machine lent for minutes with nothing to download:
# the CUDA-only tests, the default recipe trained and resumed (eager and compiled), GPT-2 small's
# training step (beside nanoGPT's bench.py given a clone), and batch-1 decoding of the 124M model
# (eager, compiled, compiled with CUDA graphs, beside Hugging Face generate). About 7 minutes on
# one H100. docs/performance.md ("On a GPU") says what to carry to the machine.
#
#   bash bench/gpu.sh [--out DIR] [--nanogpt CLONE] [--wheels DIR] [--dry-run]
#
# Writes DIR/gpu.json (every number, section by section) and DIR/gpu.log (everything printed);
# DIR is --out, else $OUT when set, else bench/results/gpu-<date>. --wheels DIR installs minitf and
# its dependencies from wheels there first (pip --no-index). --dry-run runs the same script on the
# CPU at tiny sizes in well under a minute (CI runs it: tests/integration/test_gpu_script.py).
set -euo pipefail
cd "$(dirname "$0")/.."

out="${OUT:-bench/results/gpu-$(date +%Y-%m-%d)}"
args=()
wheels=""
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out="$2"; shift 2 ;;
        --nanogpt) args+=(--nanogpt "$2"); shift 2 ;;
        --wheels) wheels="$2"; shift 2 ;;
        --dry-run) args+=(--dry-run); shift ;;
        *) echo "bench/gpu.sh: unknown argument $1 (see the comment at the top)" >&2; exit 2 ;;
    esac
done
mkdir -p "$out"
if [ -n "$wheels" ]; then
    python -m pip install -q --no-index --find-links "$wheels" -e '.[test,hf]' 2>&1 | tee "$out/pip.log"
fi
python -m bench.gpu --out "$out" "${args[@]}" 2>&1 | tee "$out/gpu.log"
echo "wrote $out/gpu.json and $out/gpu.log"
