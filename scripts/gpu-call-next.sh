#!/usr/bin/env bash
# The next session's first device call (kept in the tree so that it need not be rewritten from
# NOTES.md; each session replaces it). Build the shared bundle first: MQA_BUNDLE_SHARED=1 JOBS=2
# bash scripts/gpu-bundle.sh; then, with the device tool, carry ["gpu-bundle"] and run
# `bash scripts/gpu-call-next.sh` (give it 480 s; about 6 minutes). The console goes to
# $OUT/summary.txt as it runs (it comes back even when the call is stopped at its limit); the logs
# and trace CSVs are packed into $OUT/logs.tgz at the end (the device tool returns only a few
# files a call). Never `wait` without a pid here: it would also wait for the console's tee.
# 2026-12-06 (NOTES versions 38-46): every GPU test (gemm_cuda_test beside the others), the script
# test, then StarCoder b1 at the defaults beside `hq0` (the head CTAs' producers not held), `hq2`
# (held until the head is written) and `na` (the attention a kernel of its own) at 128 / 128, and
# auto beside na at 512 / 128 (contexts past the short form's bound: both rows must run the same
# kernels), b32, SantaCoder b1, a StarCoder b1 chain timeline of layer 20 and mqa_block_bench. On an
# H200 the first rows decide whether the attention stays inside the chain there, and whether the
# hold wins there too. About 5 minutes; give it 480 s.
set -u
logs=/tmp/mqa-logs
rm -rf $logs && mkdir -p $logs
exec > >(tee $OUT/summary.txt) 2>&1
b=/tmp/mqa-gpu-bundle
date -u
rm -rf $b && mkdir -p $b && tar xJf gpu-bundle/payload.tar.xz -C $b
nccl=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
export LD_LIBRARY_PATH="$b/lib${nccl:+:$nccl/lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export MQA_SOURCE_DIR=$PWD OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
g='^latency|Avg latency|decode step|QKV GEMMs'
m1="--batch-size 1 --input-len 128 --output-len 128 --load-format dummy"
(timeout 330 $b/tests/gemm_cuda_test > $logs/gemm_cuda_test.log 2>&1; echo "gemm_cuda_test rc=$?" > $logs/gemm.rc) &
gp=$!
while read -r name ranks; do
  [[ -z "$name" || "$name" == gemm_cuda_test ]] && continue
  if [[ "$ranks" == 1 ]]; then timeout 240 $b/tests/$name > $logs/$name.log 2>&1
  else timeout 120 mpirun --oversubscribe -np $ranks -x LD_LIBRARY_PATH -x MQA_SOURCE_DIR $b/tests/$name > $logs/$name.log 2>&1; fi
  echo "$name rc=$? $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]|tests? (passed|failed)' $logs/$name.log | tr '\n' ' ')"
done < $b/tests.txt
while read -r name cmd; do
  cmd=${cmd//@BIN@/$b/bin}; cmd=${cmd//@SRC@/$PWD}
  eval "timeout 120 $cmd" > $logs/$name.log 2>&1; echo "$name rc=$?"
done < $b/scripts.txt
wait $gp; cat $logs/gemm.rc; grep -E '^\[  PASSED|^\[  FAILED' $logs/gemm_cuda_test.log
date -u
timeout 120 $b/bin/mqabench latency --model configs/starcoder $m1 --num-iters 2 --chain auto,hq0,hq2,na,auto,hq0,hq2,na > $logs/st1.log 2>&1; echo "st1 rc=$?"; grep -E "$g|CUDA graphs" $logs/st1.log | cut -c1-190
timeout 120 $b/bin/mqabench latency --model configs/starcoder --batch-size 1 --input-len 512 --output-len 128 --load-format dummy --num-iters 2 --chain auto,na > $logs/st512.log 2>&1; echo "st512 rc=$?"; grep -E "$g|CUDA graphs" $logs/st512.log | cut -c1-190
timeout 120 $b/bin/mqabench latency --model configs/starcoder --batch-size 32 --input-len 512 --output-len 128 --load-format dummy --num-iters 2 > $logs/st32.log 2>&1; echo "st32 rc=$?"; grep -E "$g" $logs/st32.log | cut -c1-190
timeout 90 $b/bin/mqabench latency --model configs/santacoder $m1 --num-iters 2 > $logs/sc.log 2>&1; echo "sc rc=$?"; grep -E "$g" $logs/sc.log | cut -c1-190
timeout 60 $b/bin/mqabench latency --model configs/starcoder $m1 --num-iters 1 --chain-timeline 20 > $logs/sttl.log 2>&1; echo "st timeline rc=$?"; sed -n '/chain timeline/,$p' $logs/sttl.log | cut -c1-170
timeout 60 $b/bin/mqa_block_bench 2>&1 | tee $logs/mqa_block_bench.log
date -u
tar czf $OUT/logs.tgz -C /tmp mqa-logs
