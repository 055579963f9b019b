#!/usr/bin/env bash
# The A/B device call for every experiment in gpu-bundle-ab/ (written 2026-12-07 ~20:45 UTC; it
# replaces gpu-call-kvll.sh, which ran one). Build first, from main's clean tree:
# `JOBS=2 bash scripts/gpu-bundle-ab.sh COMMIT...` (each COMMIT changes kernels/*.cu only); then
# the device tool with carry ["gpu-bundle-ab"] and `bash scripts/gpu-call-ab.sh`. In order:
#  1. the tests of main and of each experiment: the tail attention's and gemm_cuda_test's PDL
#     chain;
#  2. SantaCoder b1 128 / 128, main and every experiment in separate processes, in rotation, six
#     rounds (decode step medians; MQA_AB_ROUNDS=N for N);
#  3. layer 10's tail timeline (twice) and a kernel trace (CSV to $OUT/trace_NAME) of each;
#  4. HF parity with each experiment that is not a control.
# On an H100 on 2026-12-08, three experiments, four rounds, 125 s of commands (the
# logs come back at each `finish`). With MQA_OUT_TAG set, the console and the logs go to
# summary_TAG.txt and logs_TAG.tgz (gpu-call-setup.sh).
source scripts/gpu-call-setup.sh gpu-bundle-ab/payload.tar.xz
cat gpu-bundle-ab/EXPERIMENT
# An experiment whose subject starts with "Control" (main with a diagnostic taken out, to time
# what it costs) runs only in the timed rows: its tests would fail by construction.
names=(main); vdirs=($b); control=(0)
while read -r exp commit subject; do
  x=$(variant_dir $exp)
  names+=("$exp"); vdirs+=($x); control+=($([[ "$subject" == Control* ]] && echo 1 || echo 0))
done < gpu-bundle-ab/EXPERIMENT
nv=${#names[@]}
vrun() { local i=$1; shift; LD_LIBRARY_PATH="${vdirs[$i]}/lib:$LD_LIBRARY_PATH" "$@"; }
# 1. The kernel tests, main's and each experiment's (a control's are left out: they may fail by
# construction).
for ((i = 0; i < nv; i++)); do
  n=${names[$i]}; d=${vdirs[$i]}
  ((control[i])) && continue
  vrun $i timeout 100 $d/tests/gemm_tail_attention_test > $logs/${n}_tail.log 2>&1
  echo "$n gemm_tail_attention_test rc=$? $(gtest_verdict $logs/${n}_tail.log)"
  vrun $i timeout 100 $d/tests/gemm_cuda_test --gtest_filter='*PdlChain*' > $logs/${n}_pdl.log 2>&1
  echo "$n gemm_cuda_test PdlChain rc=$? $(gtest_verdict $logs/${n}_pdl.log)"
done
# 2. SantaCoder b1 in rotation (MQA_AB_ROUNDS rounds, default 6: fewer where little device
# time is left).
for r in $(seq ${MQA_AB_ROUNDS:-6}); do
  for ((i = 0; i < nv; i++)); do
    d=${vdirs[$i]}; n=${names[$i]}
    vrun $i timeout 60 $d/bin/mqabench latency --model configs/santacoder $m1 --num-iters 5 > $logs/sc_${n}_$r.log 2>&1
    echo "sc_${n}_$r rc=$? $(latency_summary $logs/sc_${n}_$r.log)"
  done
done
finish
# 3. Timelines and traces.
for ((i = 0; i < nv; i++)); do
  d=${vdirs[$i]}; n=${names[$i]}
  for t in 1 2; do  # one layer of one step each: two samples
    vrun $i timeout 60 $d/bin/mqabench latency --model configs/santacoder $m1 --num-iters 1 \
      --tail-timeline 10 > $logs/tl_${n}_$t.log 2>&1
    echo "tl_${n}_$t rc=$?"; sed -n '/tail timeline/,$p' $logs/tl_${n}_$t.log | cut -c1-320 | head -8
  done
  mkdir -p $OUT/trace_$n
  vrun $i timeout 90 $d/bin/mqabench latency --model configs/santacoder $m1 --num-iters 2 \
    --kernel-trace $OUT/trace_$n/sc > $logs/trace_$n.log 2>&1
  echo "trace_$n rc=$? $(latency_summary $logs/trace_$n.log)"
done
finish
# 4. HF parity with each experiment (last: the longest, and needed only to take one).
for ((i = 1; i < nv; i++)); do
  n=${names[$i]}; d=${vdirs[$i]}
  ((control[i])) && continue
  vrun $i timeout 200 $d/tests/model_hf_parity_cuda_test > $logs/${n}_hf.log 2>&1
  echo "$n model_hf_parity_cuda_test rc=$? $(gtest_verdict $logs/${n}_hf.log)"
done
finish
