#!/usr/bin/env bash
# The next session's first device call (kept in the tree so that it need not be rewritten from
# NOTES.md; each session replaces it). Build the shared bundle first: MQA_BUNDLE_SHARED=1 JOBS=2
# bash scripts/gpu-bundle.sh; then, with the device tool, carry ["gpu-bundle"] and run
# `bash scripts/gpu-call-next.sh` (give it 580 s; about 7 minutes). The console goes to
# $OUT/summary.txt as it runs (it comes back even when the call is stopped at its limit, so the
# rows that matter most come first); the logs and trace CSVs are packed into $OUT/logs.tgz at the
# end (the device tool returns only a few files a call). Never `wait` without a pid here: it would
# also wait for the console's tee.
# Written 2026-12-06 late evening (NOTES version 49). It ran on an H100 at 18:59 UTC (every GPU
# test passed; the chain's rows as before); on an H200 its rows are still open, and a2295c1's
# experiment has never run:
#  1. MQA_CHAIN_EARLY_ROWS (a2295c1 and the commit after it, read once a process): StarCoder b1
#     with 0 / 1 / 2 / 3 in separate processes, two rounds; decode_chain_test with 1, 2 and 3; the
#     layer-20 timeline with 1, 3 and 0
#     (the question: does the ~1.7 us between a chain CTA's PDL wait, or its head's store, and its
#     phase-0 "epilogue done" go, and with it ~1 us of each layer's attention window?).
#  2. StarCoder b1: the chain's defaults beside `hq0` and `na` (never timed on an H200); then
#     through the engine with and without decode lookahead (`--engine on,la`).
#  3. SantaCoder b1 with `--engine off,on,la`; StarCoder b32 512 / 128.
#  4. Every GPU test (gemm_cuda_test in the background), the script test, 512 / 128 auto beside
#     na, a chain timeline of layer 20 and mqa_block_bench.
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
g='^latency|Avg latency|decode step|decode graph|prefill step|CUDA graphs'
m1="--batch-size 1 --input-len 128 --output-len 128 --load-format dummy"
bench() {  # NAME TIMEOUT ARGS...: one mqabench run, its headline lines on the console
  local name=$1 limit=$2; shift 2
  timeout "$limit" $b/bin/mqabench "$@" > $logs/$name.log 2>&1; echo "$name rc=$?"
  grep -E "$g" $logs/$name.log | cut -c1-200
}
for r in 1 2; do
  for e in 0 1 2 3; do
    MQA_CHAIN_EARLY_ROWS=$e timeout 40 $b/bin/mqabench latency --model configs/starcoder $m1 --num-iters 2 > $logs/er_${r}_$e.log 2>&1
    echo "round $r early_rows=$e rc=$? $(grep -E 'Avg latency|decode step' $logs/er_${r}_$e.log | cut -c1-90 | tr '\n' ' ')"
  done
done
for e in 1 2 3; do
  MQA_CHAIN_EARLY_ROWS=$e timeout 60 $b/tests/decode_chain_test > $logs/dct$e.log 2>&1
  echo "decode_chain_test early_rows=$e rc=$? $(grep -E '^\[  PASSED|^\[  FAILED' $logs/dct$e.log | tr '\n' ' ')"
done
for e in 1 3 0; do
  MQA_CHAIN_EARLY_ROWS=$e timeout 40 $b/bin/mqabench latency --model configs/starcoder $m1 --num-iters 1 --chain-timeline 20 > $logs/ertl_$e.log 2>&1
  echo "timeline early_rows=$e rc=$?"; sed -n '/chain timeline/,$p' $logs/ertl_$e.log | cut -c1-170
done
bench st1 150 latency --model configs/starcoder $m1 --num-iters 2 --chain auto,hq0,na,auto
bench st1e 120 latency --model configs/starcoder $m1 --num-iters 2 --engine on,la
bench sc 90 latency --model configs/santacoder $m1 --num-iters 5 --engine off,on,la,on,la
bench st32 150 latency --model configs/starcoder --batch-size 32 --input-len 512 --output-len 128 \
  --load-format dummy --num-iters 2
date -u
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
bench st512 120 latency --model configs/starcoder --batch-size 1 --input-len 512 --output-len 128 \
  --load-format dummy --num-iters 2 --chain auto,na
timeout 60 $b/bin/mqabench latency --model configs/starcoder $m1 --num-iters 1 --chain-timeline 20 > $logs/sttl.log 2>&1; echo "st timeline rc=$?"; sed -n '/chain timeline/,$p' $logs/sttl.log | cut -c1-170
timeout 60 $b/bin/mqa_block_bench 2>&1 | tee $logs/mqa_block_bench.log
date -u
tar czf $OUT/logs.tgz -C /tmp mqa-logs
