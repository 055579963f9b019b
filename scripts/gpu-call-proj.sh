#!/usr/bin/env bash
# The device call for attn.c_proj inside the QKV + tail launch (GemmTailAttention::proj_weight,
# mqabench --chain tailp; written 2026-12-08 ~01:40 UTC). Build first, from main's clean tree:
# `JOBS=2 bash scripts/gpu-bundle-ab.sh CONTROL` (CONTROL: the tail launch without its stamp code,
# a kernels/*.cu-only commit); then the device tool with carry ["gpu-bundle-ab"] and `bash
# scripts/gpu-call-proj.sh`. In order:
#  1. main's tail test (the projection's cases among them) and HF parity's tail_proj and tail_cluster rows; a failed or
#     hung tail test leaves tailp out of the rows below (a hang would cost every round a timeout);
#  2. SantaCoder b1 128 / 128 in separate processes, in rotation, MQA_AB_ROUNDS rounds (default
#     4): main's default (tailc), main with tailp, the control (its default);
#  3. layer 10's tail timeline and a kernel trace (CSV to $OUT/trace_NAME) of tailc and tailp.
# With MQA_OUT_TAG set, the console and the logs go to summary_TAG.txt and logs_TAG.tgz.
source scripts/gpu-call-setup.sh gpu-bundle-ab/payload.tar.xz
cat gpu-bundle-ab/EXPERIMENT
x=/tmp/mqa-gpu-bundle-exp1
rm -rf $x && mkdir -p $x && cp -a $b/bin $b/lib $x/ && cp $b/exp1/libmqa_kernels.so $x/lib/
# 1. Tests.
timeout 150 $b/tests/gemm_tail_attention_test > $logs/tail.log 2>&1
rc=$?
echo "gemm_tail_attention_test rc=$rc $(gtest_verdict $logs/tail.log)"
tailp_ok=$((rc == 0))
timeout 150 $b/tests/model_hf_parity_cuda_test --gtest_filter='*tail_proj*:*tail_cluster*' > $logs/hf_tail.log 2>&1
echo "model_hf_parity_cuda_test tail_proj, tail_cluster rc=$? $(gtest_verdict $logs/hf_tail.log)"
grep -E "knobs 9764965" $logs/hf_tail.log | head -6
finish
# 2. The rotation.
for r in $(seq ${MQA_AB_ROUNDS:-4}); do
  timeout 60 $b/bin/mqabench latency --model configs/santacoder $m1 --num-iters 5 --chain tailc \
    > $logs/sc_tailc_$r.log 2>&1
  echo "sc_tailc_$r rc=$? $(latency_summary $logs/sc_tailc_$r.log)"
  if ((tailp_ok)); then
    timeout 60 $b/bin/mqabench latency --model configs/santacoder $m1 --num-iters 5 \
      --chain tailp > $logs/sc_tailp_$r.log 2>&1
    rc=$?
    echo "sc_tailp_$r rc=$rc $(latency_summary $logs/sc_tailp_$r.log)"
    grep -o "[0-9]* QKV GEMMs with the tail attention ([0-9]* with attn.c_proj too)" \
      $logs/sc_tailp_$r.log | head -1
    ((rc == 0)) || tailp_ok=0
  fi
  LD_LIBRARY_PATH="$x/lib:$LD_LIBRARY_PATH" timeout 60 $x/bin/mqabench latency \
    --model configs/santacoder $m1 --num-iters 5 > $logs/sc_control_$r.log 2>&1
  echo "sc_control_$r rc=$? $(latency_summary $logs/sc_control_$r.log)"
done
finish
# 3. Timelines and traces.
for chain in tailc tailp; do
  [[ $chain == tailp ]] && ((!tailp_ok)) && continue
  timeout 60 $b/bin/mqabench latency --model configs/santacoder $m1 --num-iters 1 \
    --chain $chain --tail-timeline 10 > $logs/tl_$chain.log 2>&1
  echo "tl_$chain rc=$?"; sed -n '/tail timeline/,$p' $logs/tl_$chain.log | cut -c1-320 | head -8
  mkdir -p $OUT/trace_$chain
  timeout 90 $b/bin/mqabench latency --model configs/santacoder $m1 --num-iters 2 \
    --chain $chain --kernel-trace $OUT/trace_$chain/sc > $logs/trace_$chain.log 2>&1
  echo "trace_$chain rc=$? $(latency_summary $logs/trace_$chain.log)"
done
finish
