#!/usr/bin/env bash
# Written 2026-12-07 ~19:10 UTC, not yet run (no device machine could be had after 18:40 UTC):
# the tail's LL word stored before C's store and the fused KV write's slot load (0b4cea8, exp1)
# beside main, SantaCoder b1 in rotation; the tail test and HF parity with it; layer 10's
# timelines of both (benchmarks/mqabench/NOTES.md, the list of ~19:00 UTC, item 3). Build first,
# from main's clean tree: `JOBS=2 bash scripts/gpu-bundle-ab.sh 0b4cea8` (~10 minutes); then the
# device tool with carry ["gpu-bundle-ab"] and `bash scripts/gpu-call-kvll.sh` (~1 minute of
# commands on an H100 or H200).
set -u
logs=/tmp/mqa-logs
rm -rf $logs && mkdir -p $logs
exec > >(tee $OUT/summary.txt) 2>&1
b=/tmp/mqa-gpu-bundle
date -u
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
rm -rf $b && mkdir -p $b && tar xJf gpu-bundle-ab/payload.tar.xz -C $b
nccl=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
export LD_LIBRARY_PATH="$b/lib${nccl:+:$nccl/lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export MQA_SOURCE_DIR=$PWD OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cat gpu-bundle-ab/EXPERIMENT
m1="--batch-size 1 --input-len 128 --output-len 128 --load-format dummy"
finish() { date -u; tar czf $OUT/logs.tgz -C /tmp mqa-logs; }
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
