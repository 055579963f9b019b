#!/usr/bin/env bash
# Runs on the H200 machine, from the repository root: every GPU test of the bundle (under mpirun
# where the test asks for ranks), then every benchmark listed in benchmarks.txt. Logs go to $1;
# a summary table is printed last. Builds nothing.
set -u
here=$(cd "$(dirname "$0")" && pwd)
logs=${1:?usage: run.sh LOGDIR}
mkdir -p "$logs"
nccl=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
export LD_LIBRARY_PATH="$here/lib${nccl:+:$nccl/lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export MQA_SOURCE_DIR=${MQA_SOURCE_DIR:-$PWD}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$logs/gpu.txt"

passed=0 failed=0 skipped=0 summary=()
while read -r name ranks; do
  [[ -z "$name" ]] && continue
  if [[ "$ranks" == 1 ]]; then
    cmd=("$here/tests/$name")
  else
    cmd=(mpirun --oversubscribe -np "$ranks" -x LD_LIBRARY_PATH -x MQA_SOURCE_DIR "$here/tests/$name")
  fi
  timeout 300 "${cmd[@]}" >"$logs/$name.log" 2>&1
  rc=$?
  if ((rc != 0)); then
    failed=$((failed + 1)); summary+=("FAIL $name (rc $rc)")
  elif grep -q '\[  SKIPPED \]' "$logs/$name.log"; then
    skipped=$((skipped + 1)); summary+=("SKIP $name")
  else
    passed=$((passed + 1)); summary+=("PASS $name")
  fi
done <"$here/tests.txt"

if [[ -f "$here/benchmarks.txt" ]]; then
  while read -r name args; do
    [[ -z "$name" ]] && continue
    timeout 300 "$here/bin/$name" $args >"$logs/bench-$name.log" 2>&1
    summary+=("BENCH $name rc=$? (log bench-$name.log)")
  done <"$here/benchmarks.txt"
fi
printf '%s\n' "${summary[@]}"
echo "gpu tests: $passed passed, $failed failed, $skipped skipped"
((failed == 0))
