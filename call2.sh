# 2026-12-06 session call 2: the head split with the 8-row warp reduction measured and checked.
set -u
logs=/tmp/mqa-logs
rm -rf $logs && mkdir -p $logs
exec > >(tee $OUT/summary.txt) 2>&1
b=/tmp/mqa-gpu-bundle
date -u
rm -rf $b && mkdir -p $b && tar xJf gpu-bundle/payload.tar.xz -C $b
nccl=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
export LD_LIBRARY_PATH="$b/lib${nccl:+:$nccl/lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export MQA_SOURCE_DIR=$PWD
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
g='^latency|Avg latency|decode step|chain kernels'
m1="--batch-size 1 --input-len 128 --output-len 128 --load-format dummy"
timeout 150 $b/tests/decode_chain_test --gtest_filter='*HeadSplit*:*Refuses*:*AttentionPhase*' > $logs/dct.log 2>&1; echo "decode_chain_test (head split) rc=$?"; grep -E '^\[  (PASSED|FAILED)|FAILED  \]|Failure|error' $logs/dct.log | head -20
timeout 150 $b/tests/model_hf_parity_cuda_test --gtest_filter='*chain_attn_hs*' > $logs/hf.log 2>&1; echo "hf chain rc=$?"; grep -E '^\[  (PASSED|FAILED)|FAILED  \]' $logs/hf.log | head; grep "knobs 8400997" $logs/hf.log | cut -c1-200 | head -12
date -u
timeout 200 $b/bin/mqabench latency --model configs/starcoder $m1 --num-iters 2 --chain auto,hs,auto,hs > $logs/st1.log 2>&1; echo "st1 rc=$?"; grep -E "$g" $logs/st1.log | cut -c1-200
timeout 90 $b/bin/mqabench latency --model configs/starcoder $m1 --num-iters 1 --chain hs,auto --chain-timeline 20 > $logs/sttl.log 2>&1; echo "st timeline rc=$?"; sed -n '/chain timeline/,$p' $logs/sttl.log | cut -c1-170 | head -60
date -u
tar czf $OUT/logs.tgz -C /tmp mqa-logs
date -u
