# 2026-12-06 session call 6: the block MQA attention (kernels/mqa_block_attention.cuh): its test
# and its benchmark.
set -u
logs=/tmp/mqa-logs
rm -rf $logs && mkdir -p $logs
exec > >(tee $OUT/summary.txt) 2>&1
b=/tmp/mqa-gpu-bundle
date -u
rm -rf $b && mkdir -p $b && tar xJf gpu-bundle/payload.tar.xz -C $b
export LD_LIBRARY_PATH="$b/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export MQA_SOURCE_DIR=$PWD
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
timeout 120 $b/tests/mqa_block_attention_test > $logs/mbat.log 2>&1; echo "mqa_block_attention_test rc=$?"; grep -E '^\[  (PASSED|FAILED)|FAILED  \]|Failure|Expected|Which is|CTA|heads' $logs/mbat.log | head -30
timeout 60 $b/bin/mqa_block_bench 2>&1 | tee $logs/bench.log
tar czf $OUT/logs.tgz -C /tmp mqa-logs
date -u
