#!/usr/bin/env bash
# The next session's first device call (kept in the tree so that it need not be rewritten from
# NOTES.md; each session replaces it). Build the shared bundle first: MQA_BUNDLE_SHARED=1 JOBS=2
# bash scripts/gpu-bundle.sh; then, with the device tool, carry ["gpu-bundle"] and run
# `bash scripts/gpu-call-next.sh` (give it 540 s). Logs go straight under $OUT (they come back
# even when the call is stopped at its limit), with summary.txt the console.
# 2026-12-06 early (benchmarks/mqabench/NOTES.md version 29): decode_chain_test (per-SM shares), StarCoder b1
# auto / shares interleaved, SantaCoder b1 notail / tail (v28), the whole GPU suite (gemm_cuda_test
# beside the others), StarCoder b32, traces. Logs straight under $OUT.
set -u
logs=$OUT/logs44
mkdir -p $logs
exec > >(tee $logs/summary.txt) 2>&1
b=/tmp/mqa-gpu-bundle
date -u
rm -rf $b && mkdir -p $b && tar xJf gpu-bundle/payload.tar.xz -C $b
nccl=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
export LD_LIBRARY_PATH="$b/lib${nccl:+:$nccl/lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export MQA_SOURCE_DIR=$PWD OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
g='^latency|Avg latency|decode step|QKV GEMMs'
timeout 150 $b/tests/decode_chain_test > $logs/decode_chain_test.log 2>&1; echo "decode_chain_test rc=$? $(grep -E '^\[  PASSED|^\[  FAILED|calibration on' $logs/decode_chain_test.log | tr '\n' ' ')"
timeout 150 $b/bin/mqabench latency --model configs/starcoder --batch-size 1 --input-len 128 --output-len 128 --load-format dummy --num-iters 2 --chain auto,shares,auto,shares > $logs/st1sh.log 2>&1; echo "st1 shares rc=$?"; grep -E "$g|SM shares" $logs/st1sh.log | cut -c1-190
timeout 100 $b/bin/mqabench latency --model configs/starcoder --batch-size 1 --input-len 128 --output-len 128 --load-format dummy --num-iters 1 --chain auto,shares --chain-timeline 20 > $logs/st1tl.log 2>&1; echo "st1 timeline rc=$?"; grep -E "$g|SM shares|last release|chain timeline" $logs/st1tl.log | cut -c1-190
timeout 90 $b/bin/mqabench latency --model configs/santacoder --batch-size 1 --input-len 128 --output-len 128 --load-format dummy --num-iters 2 --chain notail,tail,notail,tail > $logs/sc.log 2>&1; echo "sc rc=$?"; grep -E "$g" $logs/sc.log | cut -c1-170
(timeout 330 $b/tests/gemm_cuda_test > $logs/gemm_cuda_test.log 2>&1; echo "gemm_cuda_test rc=$?" > $logs/gemm.rc) &
gp=$!
while read -r name ranks; do
  [[ -z "$name" || "$name" == gemm_cuda_test || "$name" == decode_chain_test ]] && continue
  if [[ "$ranks" == 1 ]]; then timeout 240 $b/tests/$name > $logs/$name.log 2>&1
  else timeout 120 mpirun --oversubscribe -np $ranks -x LD_LIBRARY_PATH -x MQA_SOURCE_DIR $b/tests/$name > $logs/$name.log 2>&1; fi
  echo "$name rc=$? $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]|tests? (passed|failed)' $logs/$name.log | tr '\n' ' ')"
done < <(grep -E "^(gemm_tail_attention_test|decode_chain_test|attention_cuda_test|gemm_stream_tc_test|model_hf_parity_cuda_test) " $b/tests.txt; grep -vE "^(gemm_tail_attention_test|decode_chain_test|attention_cuda_test|gemm_stream_tc_test|model_hf_parity_cuda_test) " $b/tests.txt)
while read -r name cmd; do
  cmd=${cmd//@BIN@/$b/bin}; cmd=${cmd//@SRC@/$PWD}
  eval "timeout 120 $cmd" > $logs/$name.log 2>&1; echo "$name rc=$?"
done < $b/scripts.txt
wait $gp; cat $logs/gemm.rc; grep -E '^\[  PASSED|^\[  FAILED' $logs/gemm_cuda_test.log
date -u
timeout 120 $b/bin/mqabench latency --model configs/starcoder --batch-size 32 --input-len 512 --output-len 128 --load-format dummy --num-iters 2 > $logs/st32.log 2>&1; echo "st32 rc=$?"; grep -E "$g" $logs/st32.log | cut -c1-170
timeout 60 $b/bin/mqabench latency --model configs/santacoder --batch-size 1 --input-len 128 --output-len 128 --load-format dummy --num-iters 1 --chain notail --kernel-trace $logs/sct_notail > $logs/sct.log 2>&1
timeout 60 $b/bin/mqabench latency --model configs/santacoder --batch-size 1 --input-len 128 --output-len 128 --load-format dummy --num-iters 1 --chain tail --kernel-trace $logs/sct_tail > $logs/sct2.log 2>&1
date -u
