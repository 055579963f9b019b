#!/usr/bin/env bash
# The next device call (kept in the tree so that it need not be rewritten from NOTES.md; each
# session replaces it). Build the shared bundle first: MQA_BUNDLE_SHARED=1 JOBS=2 bash
# scripts/gpu-bundle.sh; then, with the device tool, carry ["gpu-bundle"] and run
# `bash scripts/gpu-call-next.sh` (about 4 minutes; give it 360 s). The console goes to
# $OUT/summary.txt as it runs (it comes back even when the call is stopped at its limit); the logs
# and trace CSVs are packed into $OUT/logs.tgz at the end (the device tool returns only a few
# files a call). Never `wait` without a pid here: it would wait for the tee below.
# 2026-12-06 (benchmarks/mqabench/NOTES.md versions 35-36): the tail test, the decode chain test
# and the HF parity tail rows; SantaCoder b1 with the tail's GEMM CTAs prefetching the end of
# c_fc into L2 (tailpN, tailpNl), both orders; StarCoder b1 with the chain's L2 look-ahead
# (pfN), both orders; a SantaCoder kernel trace with and without the prefetch.
set -u
logs=/tmp/mqa-logs
rm -rf $logs && mkdir -p $logs
exec > >(tee $OUT/summary.txt) 2>&1
b=/tmp/mqa-gpu-bundle
date -u
rm -rf $b && mkdir -p $b && tar xJf gpu-bundle/payload.tar.xz -C $b
export LD_LIBRARY_PATH="$b/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export MQA_SOURCE_DIR=$PWD
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
g='^latency|Avg latency|decode step'
m1="--batch-size 1 --input-len 128 --output-len 128 --load-format dummy"
t() { grep -E "$g" "$1" | grep -v '^latency' | cut -c1-120; }
timeout 60 $b/tests/gemm_tail_attention_test > $logs/tail.log 2>&1; echo "tail test rc=$?"; grep -E '^\[  PASSED|^\[  FAILED' $logs/tail.log
timeout 90 $b/tests/decode_chain_test > $logs/chain.log 2>&1; echo "chain test rc=$?"; grep -E '^\[  PASSED|^\[  FAILED' $logs/chain.log
timeout 120 $b/tests/model_hf_parity_cuda_test --gtest_filter='*tail*' > $logs/hf.log 2>&1; echo "hf tail rows rc=$?"; grep -E '^\[  PASSED|^\[  FAILED' $logs/hf.log
timeout 90 $b/bin/mqabench latency --model configs/santacoder $m1 --num-iters 2 --chain auto,tailp4,tailp8,tailp12,tailp16,tailp24,tailp8l,tailp16l > $logs/sc1.log 2>&1; echo "sc1 rc=$? (auto,tailp4,tailp8,tailp12,tailp16,tailp24,tailp8l,tailp16l)"; t $logs/sc1.log
timeout 90 $b/bin/mqabench latency --model configs/santacoder $m1 --num-iters 2 --chain tailp16l,tailp8l,tailp24,tailp16,tailp12,tailp8,tailp4,auto > $logs/sc2.log 2>&1; echo "sc2 rc=$? (reverse)"; t $logs/sc2.log
date -u
timeout 100 $b/bin/mqabench latency --model configs/starcoder $m1 --num-iters 2 --chain auto,pf64,pf128,pf256,pf512,auto > $logs/st1.log 2>&1; echo "st1 rc=$? (auto,pf64,pf128,pf256,pf512,auto)"; t $logs/st1.log
timeout 100 $b/bin/mqabench latency --model configs/starcoder $m1 --num-iters 2 --chain pf512,pf256,pf128,pf64,auto > $logs/st2.log 2>&1; echo "st2 rc=$? (reverse)"; t $logs/st2.log
date -u
timeout 60 $b/bin/mqabench latency --model configs/santacoder $m1 --num-iters 1 --chain auto,tailp12 --kernel-trace $logs/sct > $logs/sct.log 2>&1; echo "sc trace rc=$?"; grep -A7 'decode step: ' $logs/sct.log | cut -c1-150
date -u
tar czf $OUT/logs.tgz -C /tmp mqa-logs
