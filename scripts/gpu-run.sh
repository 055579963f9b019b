#!/usr/bin/env bash
# Runs on the H200 machine, from the repository root (fixtures and configs are read from there):
# every GPU test of the bundle (binaries, under mpirun where a test asks for ranks; then script
# tests), then every benchmark of benchmarks.txt (unless $2 is "tests"; "bench" skips the tests;
# $3, a file of "timeout_seconds binary args..." lines, replaces benchmarks.txt). Logs go to $1;
# a summary table is printed last.
# Builds nothing.
set -u
here=$(cd "$(dirname "$0")" && pwd)
logs=${1:?usage: run.sh LOGDIR [tests]}
mode=${2:-}  # "tests": skip the benchmarks; "bench": skip the tests
bench_list=${3:-}
mkdir -p "$logs"
# Seconds each test may run (MQA_TEST_TIMEOUT; gemm_cuda_test's CPU references alone take ~3.5
# min on the H200 machine).
test_timeout=${MQA_TEST_TIMEOUT:-300}
b=/tmp/mqa-gpu-bundle
rm -rf "$b" && mkdir -p "$b" && tar xJf "$here/payload.tar.xz" -C "$b"
nccl=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
export LD_LIBRARY_PATH="$b/lib${nccl:+:$nccl/lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export MQA_SOURCE_DIR=${MQA_SOURCE_DIR:-$PWD}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$logs/gpu.txt"

passed=0 failed=0 skipped=0 summary=()
record() {  # name rc log; a test binary that ran no test at all (no device) is a skip
  if (($2 == 77)) || { (($2 == 0)) && grep -qE 'PASSED  \][^0-9]*0 tests' "$3"; }; then
    skipped=$((skipped + 1)); summary+=("SKIP $1")
  elif (($2 != 0)); then
    failed=$((failed + 1)); summary+=("FAIL $1 (rc $2)")
  else
    passed=$((passed + 1)); summary+=("PASS $1")
  fi
}
[[ "$mode" == bench ]] && : >"$b/tests.txt" && : >"$b/scripts.txt"
[[ -n "$bench_list" ]] && grep -v '^#' "$bench_list" >"$b/benchmarks.txt"
while read -r name ranks; do
  [[ -z "$name" ]] && continue
  if [[ "$ranks" == 1 ]]; then
    timeout "$test_timeout" "$b/tests/$name" >"$logs/$name.log" 2>&1
  else
    timeout "$test_timeout" mpirun --oversubscribe -np "$ranks" -x LD_LIBRARY_PATH -x MQA_SOURCE_DIR \
      "$b/tests/$name" >"$logs/$name.log" 2>&1
  fi
  record "$name" $? "$logs/$name.log"
done <"$b/tests.txt"
while read -r name cmd; do
  [[ -z "$name" ]] && continue
  cmd=${cmd//@BIN@/$b/bin}
  cmd=${cmd//@SRC@/$PWD}
  eval "timeout $test_timeout $cmd" >"$logs/$name.log" 2>&1
  record "$name" $? "$logs/$name.log"
done <"$b/scripts.txt"

line=0
[[ "$mode" == tests ]] && : >"$b/benchmarks.txt"
while read -r secs name args; do
  [[ -z "$secs" ]] && continue
  line=$((line + 1))
  log="$logs/bench-$line-$name.log"
  timeout "$secs" "$b/bin/$name" $args >"$log" 2>&1
  summary+=("BENCH rc=$? $name $args")
done <"$b/benchmarks.txt"
printf '%s\n' "${summary[@]}"
echo "gpu tests: $passed passed, $failed failed, $skipped skipped"
((failed == 0))
