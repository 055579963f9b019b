#!/usr/bin/env bash
# The next device call (kept in the tree so that it need not be rewritten from NOTES.md; each
# session replaces it). Written 2026-12-07 ~13:40 UTC, extended ~16:40 (NOTES version 61's list,
# item 1), still the next call on 2026-12-08 ~00:40 (version 64's list, item 1): main on an H200,
# for the standing table's H200 column (unchanged since 2026-12-07 05:51 UTC; fe913d3, 85324df,
# 73b4a5e, d9f3a1b and 0ec1ad1 have run only on H100s). Build the plain
# shared bundle first (`rm -rf gpu-bundle-ab; MQA_BUNDLE_SHARED=1 JOBS=2 bash
# scripts/gpu-bundle.sh`), then with the device tool carry ["gpu-bundle"] and run `bash
# scripts/gpu-call-next.sh` (~5 minutes on an H200). On any other GPU it stops after step 0 (the
# H100s' figures of this code, its trace and its Nsight Compute pages are in BENCHMARKS.md and
# NOTES version 61 already), unless MQA_CALL_ANY=1; prefix the call with `nvidia-smi
# --query-gpu=name --format=csv,noheader | grep -q H200 || exit 0;` to spend nothing there.
# The console goes to $OUT/summary.txt as it runs, the logs to $OUT/logs.tgz at each `finish`.
# The A/B payload (gpu-bundle-ab/) holds main's bundle too: after gpu-call-ab.sh in the same call,
# `MQA_PAYLOAD=gpu-bundle-ab/payload.tar.xz MQA_OUT_TAG=next bash scripts/gpu-call-next.sh`.
#  0. SantaCoder's layer-10 tail timeline, twice (with each attention CTA's own steps); then, on
#     an H200, one CUPTI-traced SantaCoder run ($OUT/trace) and Nsight Compute on two tail
#     launches ($OUT/ncu_tail_*).
#  1. StarCoder b1 and SantaCoder b1 128 / 128, separate processes in rotation, six rounds (single
#     rounds scatter by +-0.3% on the H200); StarCoder b1 with `--async on` in the first three.
#  2. StarCoder b32 512 / 128, twice; StarCoder b1 through the engine with decode lookahead.
#  3. HF parity and the tail attention's test; attention_bench (the decode-attention and prefill
#     rows of the standing table).
source scripts/gpu-call-setup.sh ${MQA_PAYLOAD:-gpu-bundle/payload.tar.xz}
# 0. SantaCoder's layer-10 tail timeline, twice, with each attention CTA's own steps.
for r in 1 2; do
  timeout 60 $b/bin/mqabench latency --model configs/santacoder $m1 --num-iters 1 \
    --tail-timeline 10 > $logs/sctl10_$r.log 2>&1
  echo "sctl10_$r rc=$?"; sed -n '/tail timeline/,$p' $logs/sctl10_$r.log | cut -c1-400
done
if [[ "$gpu" != *H200* && "${MQA_CALL_ANY:-0}" != 1 ]]; then
  echo "not an H200 ($gpu): nothing more run"
  finish
  exit 0
fi
# 0a. SantaCoder b1 with one traced iteration (CUPTI: every kernel's start and end, PDL overlaps
# kept) for the next session's layer chain (NOTES version 61's list, item 2); CSVs to $OUT/trace.
mkdir -p $OUT/trace
timeout 90 $b/bin/mqabench latency --model configs/santacoder $m1 --num-iters 2 \
  --kernel-trace $OUT/trace/sc > $logs/sc_trace.log 2>&1
echo "sc_trace rc=$? $(grep -E 'Avg latency|decode step|trace' $logs/sc_trace.log | cut -c1-160 | tr '\n' ' ')"
# 0b. Nsight Compute on two of the tail's launches (kTail = true: mangled "...Li1ELb1EE"), one
# SantaCoder run; ncu runs each launch alone. The SASS source page carries each instruction's warp
# stall samples: what the attention warps wait on after their last LL word (NOTES version 60).
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
if [[ -n "$ncu" ]]; then
  timeout 240 $ncu --clock-control none --set full --import-source yes --kernel-name-base mangled \
    -k 'regex:SkinnyGemmKernel.*Li1ELb1EE' --launch-skip 100 --launch-count 2 -f -o /tmp/ncu_tail \
    $b/bin/mqabench latency --model configs/santacoder --batch-size 1 --input-len 128 \
    --output-len 16 --load-format dummy --num-iters 1 > $logs/ncu_run.log 2>&1
  echo "ncu rc=$? $(tail -2 $logs/ncu_run.log | tr '\n' ' ' | cut -c1-300)"
  $ncu --import /tmp/ncu_tail.ncu-rep --page details > $OUT/ncu_tail_details.txt 2>&1
  $ncu --import /tmp/ncu_tail.ncu-rep --page source --print-source sass --csv \
    > $OUT/ncu_tail_sass.csv 2>&1
  echo "ncu pages rc=$? $(wc -c < $OUT/ncu_tail_details.txt) $(wc -c < $OUT/ncu_tail_sass.csv)"
  grep -E 'SkinnyGemm|Duration|Registers|Achieved Occupancy' $OUT/ncu_tail_details.txt | head -12
else
  echo "no ncu here"
fi
row() {  # NAME TIMEOUT ARGS...: one mqabench latency run, its headline figures on one line
  local name=$1 limit=$2; shift 2
  timeout "$limit" $b/bin/mqabench latency "$@" > $logs/$name.log 2>&1
  echo "$name rc=$? $(latency_summary $logs/$name.log)"
}
# 1. The b1 rows, in rotation.
for r in $(seq 6); do
  row st1_$r 60 --model configs/starcoder $m1 --num-iters 2
  row sc1_$r 60 --model configs/santacoder $m1 --num-iters 5
  # The own loop with step t + 1 launched before step t's token is read (the H200's host work was
  # 0.5-0.6% of a StarCoder b1 step on 2026-12-07 05:40 UTC, 0.2% on the H100s' hosts).
  ((r <= 3)) && row st1a_$r 60 --model configs/starcoder $m1 --num-iters 2 --async on
done
finish
# 2. b32, and b1 through the engine (its own loop, then with lookahead).
for r in 1 2; do
  row st32_$r 150 --model configs/starcoder --batch-size 32 --input-len 512 --output-len 128 \
    --load-format dummy --num-iters 2
done
row st1e 120 --model configs/starcoder $m1 --num-iters 2 --engine on,la
grep -E 'engine|lookahead' $logs/st1e.log | cut -c1-160
finish
# 3. Correctness on this machine, then the attention kernels' table.
for t in model_hf_parity_cuda_test gemm_tail_attention_test; do
  timeout 150 $b/tests/$t > $logs/$t.log 2>&1
  echo "$t rc=$? $(gtest_verdict $logs/$t.log)"
done
timeout 150 $b/bin/attention_bench > $logs/attention_bench.log 2>&1
echo "attention_bench rc=$?"
grep -E '^device|^ceilings|^ *(1|64) x (2048|8192) |TFLOP/s \(' $logs/attention_bench.log | head -20 | cut -c1-220
finish
