#!/usr/bin/env bash
# Runs mqaserve's and HF's tokenizer benchmarks on the same text, tokenizer and core, and prints
# both figures. Usage: benchmarks/tokenizer/run_tokenizer_bench.sh BUILD_DIR [MB] [TOKENIZER_JSON]
#   Text: the .py files of Python's standard library, sorted by path (first MB megabytes).
#   Needs: BUILD_DIR/bin/tokenizer_bench (ninja tokenizer_bench), pip install tokenizers.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:?usage: run_tokenizer_bench.sh BUILD_DIR [MB] [TOKENIZER_JSON]}
mb=${2:-4}
tokenizer=${3:-$root/tests/fixtures/tokenizer/tokenizer.json}
stdlib=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
list=$(mktemp)
trap 'rm -f "$list"' EXIT
find "$stdlib" -name '*.py' -type f | LC_ALL=C sort > "$list"
core=$(( $(nproc) - 1 ))
pin=(taskset -c "$core")
command -v taskset >/dev/null || pin=()
echo "text: $mb MB of $stdlib/**/*.py; tokenizer: $tokenizer; one thread on core $core"
"${pin[@]}" "$build/bin/tokenizer_bench" --tokenizer "$tokenizer" --files "$list" --mb "$mb"
RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false "${pin[@]}" \
  python3 "$root/benchmarks/tokenizer/hf_tokenizer_bench.py" --tokenizer "$tokenizer" \
  --files "$list" --mb "$mb"
