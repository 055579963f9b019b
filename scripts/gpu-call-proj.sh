#!/usr/bin/env bash
# The device call for attn.c_proj inside the QKV + tail launch (GemmTailAttention::proj_weight,
# mqabench --chain tailp; written 2026-12-08 ~01:40 UTC, exp2 added ~02:20). Build first, from
# main's clean tree: `JOBS=2 bash scripts/gpu-bundle-ab.sh CONTROL EXP2` (CONTROL: the tail launch
# without its stamp code; EXP2: the projection with 16 rows a CTA; kernels/*.cu-only commits);
# then the device tool with carry ["gpu-bundle-ab"] and `bash scripts/gpu-call-proj.sh`. In order:
#  1. the tail test (the projection's cases among them) of main and exp2, and HF parity's
#     tail_proj and tail_cluster rows (main); a failed or hung tail test leaves that library's
#     tailp out of the rows below (a hang would cost every round a timeout);
#  2. SantaCoder b1 128 / 128 in separate processes, in rotation, MQA_AB_ROUNDS rounds (default
#     4): main's default (tailc), main with tailp, exp2 with tailp, the control (its default);
#  3. layer 10's tail timeline and a kernel trace (CSV to $OUT/trace_NAME) of tailc and the
#     tailp rows.
# With MQA_OUT_TAG set, the console and the logs go to summary_TAG.txt and logs_TAG.tgz.
source scripts/gpu-call-setup.sh gpu-bundle-ab/payload.tar.xz
cat gpu-bundle-ab/EXPERIMENT
for exp in exp1 exp2; do variant_dir $exp > /dev/null; done
# LIB COMMAND...: the command with main's library (LIB main) or experiment LIB's.
lib() {
  if [[ $1 == main ]]; then
    "${@:2}"
  else
    LD_LIBRARY_PATH="/tmp/mqa-gpu-bundle-$1/lib:$LD_LIBRARY_PATH" "${@:2}"
  fi
}
# 1. Tests.
timeout 150 $b/tests/gemm_tail_attention_test > $logs/tail.log 2>&1
rc=$?
echo "main gemm_tail_attention_test rc=$rc $(gtest_verdict $logs/tail.log)"
ok_main=$((rc == 0))
lib exp2 timeout 120 $b/tests/gemm_tail_attention_test \
  --gtest_filter='*MatchesGemm*:*BackToBack*' > $logs/tail_exp2.log 2>&1
rc=$?
echo "exp2 gemm_tail_attention_test rc=$rc $(gtest_verdict $logs/tail_exp2.log)"
ok_exp2=$((rc == 0))
timeout 150 $b/tests/model_hf_parity_cuda_test --gtest_filter='*tail_proj*:*tail_cluster*' \
  > $logs/hf_tail.log 2>&1
echo "model_hf_parity_cuda_test tail_proj, tail_cluster rc=$? $(gtest_verdict $logs/hf_tail.log)"
grep -E "knobs 9764965" $logs/hf_tail.log | head -6
finish
# 2. The rotation: NAME LIBRARY CHAIN GATE.
rows=("tailc main tailc 1" "tailp main tailp ok_main" "tailp2 exp2 tailp ok_exp2"
      "control exp1 auto 1")
for r in $(seq ${MQA_AB_ROUNDS:-4}); do
  for row in "${rows[@]}"; do
    read -r name l chain gate <<<"$row"
    [[ $gate != 1 ]] && ((!${!gate})) && continue
    lib $l timeout 60 $b/bin/mqabench latency --model configs/santacoder $m1 --num-iters 5 \
      --chain $chain > $logs/sc_${name}_$r.log 2>&1
    rc=$?
    echo "sc_${name}_$r rc=$rc $(latency_summary $logs/sc_${name}_$r.log)"
    grep -o "[0-9]* QKV GEMMs with the tail attention ([0-9]* with attn.c_proj too)" \
      $logs/sc_${name}_$r.log | head -1
    [[ $gate != 1 ]] && ((rc != 0)) && eval "$gate=0"
  done
done
finish
# 3. Timelines and traces.
for row in "${rows[@]:0:3}"; do
  read -r name l chain gate <<<"$row"
  [[ $gate != 1 ]] && ((!${!gate})) && continue
  flags=(--model configs/santacoder $m1 --chain $chain)
  mkdir -p $OUT/trace_$name
  lib $l timeout 60 $b/bin/mqabench latency "${flags[@]}" --num-iters 1 --tail-timeline 10 \
    > $logs/tl_$name.log 2>&1
  echo "tl_$name rc=$?"; sed -n '/tail timeline/,$p' $logs/tl_$name.log | cut -c1-320 | head -8
  lib $l timeout 90 $b/bin/mqabench latency "${flags[@]}" --num-iters 2 \
    --kernel-trace $OUT/trace_$name/sc > $logs/trace_$name.log 2>&1
  echo "trace_$name rc=$? $(latency_summary $logs/trace_$name.log)"
done
finish
