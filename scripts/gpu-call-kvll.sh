#!/usr/bin/env bash
# Written 2026-12-07 ~19:10 UTC, not yet run (no device machine could be had after 18:40 UTC):
# the tail's LL word stored before C's store and the fused KV write's slot load (0b4cea8, exp1)
# beside main, SantaCoder b1 in rotation; the tail test and HF parity with it; layer 10's
# timelines of both (benchmarks/mqabench/NOTES.md, the list of ~19:00 UTC, item 3). Build first,
# from main's clean tree: `JOBS=2 bash scripts/gpu-bundle-ab.sh 0b4cea8` (~10 minutes); then the
# device tool with carry ["gpu-bundle-ab"] and `bash scripts/gpu-call-kvll.sh` (~1 minute of
# commands on an H100 or H200).
source scripts/gpu-call-setup.sh gpu-bundle-ab/payload.tar.xz
cat gpu-bundle-ab/EXPERIMENT
x=/tmp/mqa-gpu-bundle-exp1
rm -rf $x && mkdir -p $x && cp -a $b/bin $b/lib $b/tests $x/ && cp $b/exp1/libmqa_kernels.so $x/lib/
names=(main kvll); vdirs=($b $x)
vrun() { local i=$1; shift; LD_LIBRARY_PATH="${vdirs[$i]}/lib:$LD_LIBRARY_PATH" "$@"; }
vrun 1 timeout 100 $x/tests/gemm_tail_attention_test > $logs/kvll_tail.log 2>&1
echo "kvll gemm_tail_attention_test rc=$? $(grep -E '^\[  PASSED|^\[  FAILED  \] ' $logs/kvll_tail.log | head -8 | tr '\n' ' ')"
for r in $(seq 6); do
  for i in 0 1; do
    d=${vdirs[$i]}; n=${names[$i]}
    vrun $i timeout 60 $d/bin/mqabench latency --model configs/santacoder $m1 --num-iters 5 > $logs/sc_${n}_$r.log 2>&1
    echo "sc_${n}_$r rc=$? $(grep -E 'Avg latency|decode step' $logs/sc_${n}_$r.log | cut -c1-100 | tr '\n' ' ')"
  done
done
finish
for i in 0 1; do
  d=${vdirs[$i]}; n=${names[$i]}
  vrun $i timeout 60 $d/bin/mqabench latency --model configs/santacoder $m1 --num-iters 1 --tail-timeline 10 > $logs/tl_$n.log 2>&1
  echo "tl_$n rc=$?"; sed -n '/tail timeline/,$p' $logs/tl_$n.log | cut -c1-300 | head -8
done
vrun 1 timeout 200 $x/tests/model_hf_parity_cuda_test > $logs/kvll_hf.log 2>&1
echo "kvll model_hf_parity_cuda_test rc=$? $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' $logs/kvll_hf.log | tr '\n' ' ')"
finish
