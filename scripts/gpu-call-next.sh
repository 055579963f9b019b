#!/usr/bin/env bash
# The next session's first device call (kept in the tree so that it need not be rewritten from
# NOTES.md; each session replaces it). Written 2026-12-07 ~12:05 UTC (NOTES version 58's list,
# item 1): the tail's LL handover, c7ad2c2 (in main's history, reverted), beside 4440ca8 (the
# count-in kernel on its headers) — copy this script out first (`git show
# HEAD:scripts/gpu-call-next.sh > call-ll.sh`), then `git checkout -q --detach c7ad2c2 &&
# JOBS=2 bash scripts/gpu-bundle-ab.sh 4440ca8`, `git checkout -q main`, and with the device tool
# carry ["gpu-bundle-ab", "call-ll.sh"], `bash call-ll.sh` (~6 minutes; the summary comes back in
# $OUT/summary.txt as it runs, the logs in $OUT/logs.tgz at each `finish`).
set -u
logs=/tmp/mqa-logs
rm -rf $logs && mkdir -p $logs
exec > >(tee $OUT/summary.txt) 2>&1
b=/tmp/mqa-gpu-bundle
date -u
rm -rf $b && mkdir -p $b && tar xJf gpu-bundle-ab/payload.tar.xz -C $b
nccl=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
export LD_LIBRARY_PATH="$b/lib${nccl:+:$nccl/lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export MQA_SOURCE_DIR=$PWD OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
cat gpu-bundle-ab/EXPERIMENT
m1="--batch-size 1 --input-len 128 --output-len 128 --load-format dummy"
finish() { date -u; tar czf $OUT/logs.tgz -C /tmp mqa-logs; }
x=/tmp/mqa-gpu-bundle-exp1
rm -rf $x && mkdir -p $x && cp -a $b/bin $b/lib $b/tests $x/ && cp $b/exp1/libmqa_kernels.so $x/lib/
names=(ll base); vdirs=($b $x)
vrun() { local i=$1; shift; LD_LIBRARY_PATH="${vdirs[$i]}/lib:$LD_LIBRARY_PATH" "$@"; }
vrows() {  # MODEL ITERS ROUNDS PREFIX: MODEL b1 128 / 128 with each variant, in rotation
  local model=$1 iters=$2 rounds=$3 prefix=$4 r i d n
  for r in $(seq $rounds); do
    for i in 0 1; do
      d=${vdirs[$i]}; n=${names[$i]}
      vrun $i timeout 60 $d/bin/mqabench latency --model configs/$model $m1 --num-iters $iters > $logs/${prefix}_${n}_$r.log 2>&1
      echo "${prefix}_${n}_$r rc=$? $(grep -E 'Avg latency|decode step' $logs/${prefix}_${n}_$r.log | cut -c1-100 | tr '\n' ' ')"
    done
  done
}
# 1. HEAD's tail test first
for t in gemm_tail_attention_test; do
  timeout 150 $b/tests/$t > $logs/$t.log 2>&1
  echo "$t rc=$? $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]|^\[  FAILED  \] ' $logs/$t.log | head -12 | tr '\n' ' ')"
done
# 2. SantaCoder b1 in rotation, separate processes, six rounds; then HF parity
vrows santacoder 5 6 sc
date -u
finish
timeout 150 $b/tests/model_hf_parity_cuda_test > $logs/hf.log 2>&1
echo "model_hf_parity_cuda_test rc=$? $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' $logs/hf.log | tr '\n' ' ')"
finish
# 3. SantaCoder layer-10 tail timelines, one each
for r in 1; do
  for i in 0 1; do
    d=${vdirs[$i]}; n=${names[$i]}
    vrun $i timeout 60 $d/bin/mqabench latency --model configs/santacoder $m1 --num-iters 1 --tail-timeline 10 > $logs/${n}_tl$r.log 2>&1
    echo "$n timeline rc=$?"; grep -A2 "tail timeline" $logs/${n}_tl$r.log | tail -2 | cut -c1-700
  done
done
date -u
finish
# 4. HEAD: every other GPU test
(timeout 330 $b/tests/gemm_cuda_test > $logs/gemm_cuda_test.log 2>&1; echo "gemm_cuda_test rc=$?" > $logs/gemm.rc) &
gp=$!
while read -r name ranks; do
  [[ -z "$name" || "$name" == gemm_cuda_test || "$name" == gemm_tail_attention_test || "$name" == model_hf_parity_cuda_test ]] && continue
  if [[ "$ranks" == 1 ]]; then timeout 240 $b/tests/$name > $logs/$name.log 2>&1
  else timeout 120 mpirun --oversubscribe -np $ranks -x LD_LIBRARY_PATH -x MQA_SOURCE_DIR $b/tests/$name > $logs/$name.log 2>&1; fi
  echo "$name rc=$? $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]|tests? (passed|failed)' $logs/$name.log | tr '\n' ' ')"
done < $b/tests.txt
while read -r name cmd; do
  cmd=${cmd//@BIN@/$b/bin}; cmd=${cmd//@SRC@/$PWD}
  eval "timeout 120 $cmd" > $logs/$name.log 2>&1; echo "$name rc=$?"
done < $b/scripts.txt
wait $gp; cat $logs/gemm.rc; grep -E '^\[  PASSED|^\[  FAILED' $logs/gemm_cuda_test.log
finish
# 5. StarCoder b1 beside the baseline, and b32
vrows starcoder 2 2 st
timeout 150 $b/bin/mqabench latency --model configs/starcoder --batch-size 32 --input-len 512 --output-len 128 --load-format dummy --num-iters 2 > $logs/st32.log 2>&1
echo "st32 rc=$? $(grep -E 'Avg latency|decode step' $logs/st32.log | tr '\n' ' ')"
finish
