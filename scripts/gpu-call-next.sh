#!/usr/bin/env bash
# The next session's first device call (kept in the tree so that it need not be rewritten from
# NOTES.md; each session replaces it). Build the bundle first: `scripts/gpu-bundle-ab.sh COMMIT...`
# (HEAD's shared bundle with the experiments' kernel libraries beside its own; or, with none,
# MQA_BUNDLE_SHARED=1 JOBS=2 bash scripts/gpu-bundle.sh); then, with the device tool, carry
# ["gpu-bundle-ab"] (or ["gpu-bundle"]) and run `bash scripts/gpu-call-next.sh` (give it 580 s;
# about 7 minutes). The console goes to $OUT/summary.txt as it runs (it comes back even when the
# call is stopped at its limit, so the rows that matter most come first); the logs and trace CSVs
# are packed into $OUT/logs.tgz at the end (the device tool returns only a few files a call).
# Never `wait` without a pid here: it would also wait for the console's tee.
# Written 2026-12-07 ~09:45 UTC (NOTES version 56). Next: main's first run on an H200 (fe913d3's
# K / V copies before the wait and 85324df's evict_first weights have run only on H100s) — no
# experiment: `rm -rf gpu-bundle-ab; MQA_BUNDLE_SHARED=1 JOBS=2 bash scripts/gpu-bundle.sh`, carry
# ["gpu-bundle"], the full call (~6 minutes; MQA_CALL_FULL=0: the timeline and the --autotune rows
# only; MQA_CALL_MIN=1 matters only with experiments). What it runs:
#  0. With gpu-bundle-ab (scripts/gpu-bundle-ab.sh COMMIT...): each experiment's library beside
#     HEAD's (and HEAD's with the `knobs` rows below), StarCoder b1 in separate processes, `rounds`
#     rounds (six: on the H200 of 2026-12-07 single rounds scattered by +-0.3%, three were not
#     enough), SantaCoder b1 too where `sc_rounds` is 1, StarCoder at 512 / 128 once; then
#     decode_chain_test, gemm_tail_attention_test, HF parity and a layer-20 timeline with each
#     experiment's library. (With gpu-bundle: skipped.)
#  1. HEAD's layer-20 timeline; StarCoder and SantaCoder b1 with `--autotune on` (every cuBLASLt
#     shape tuned at first sight, the prefill's among them) beside the default, two rounds. With
#     MQA_CALL_FULL=0 the call ends here.
#  2. StarCoder b1: the chain's defaults beside `hq2` and `na`; mqabench's own loop with `--async
#     both` (never timed on an H200, where the loop's host share is 0.5%); through the engine with
#     and without decode lookahead (`--engine on,la`); the layer-10 and 30 timelines.
#  3. SantaCoder b1 with `--engine off,on,la,on,la`, `--chain auto,on,auto,on`, its kernel
#     trace and its tail attention's timeline (layer 10); the default beside `--gemm skinnydo`
#     (the occupancy instantiations: -0.4% in one process on an H100 after 85324df) in separate
#     processes, six rounds; StarCoder b32 512 / 128.
#  4. Every GPU test (gemm_cuda_test in the background), the script test, 512 / 128 auto beside
#     na and mqa_block_bench.
set -u
logs=/tmp/mqa-logs
rm -rf $logs && mkdir -p $logs
exec > >(tee $OUT/summary.txt) 2>&1
b=/tmp/mqa-gpu-bundle
date -u
payload=gpu-bundle/payload.tar.xz
[[ -f gpu-bundle-ab/payload.tar.xz ]] && payload=gpu-bundle-ab/payload.tar.xz
rm -rf $b && mkdir -p $b && tar xJf $payload -C $b
nccl=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
export LD_LIBRARY_PATH="$b/lib${nccl:+:$nccl/lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export MQA_SOURCE_DIR=$PWD OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
g='^latency|Avg latency|decode step|decode graph|prefill step|CUDA graphs'
m1="--batch-size 1 --input-len 128 --output-len 128 --load-format dummy"
bench() {  # NAME TIMEOUT ARGS...: one mqabench run, its headline lines on the console
  local name=$1 limit=$2; shift 2
  timeout "$limit" $b/bin/mqabench "$@" > $logs/$name.log 2>&1; echo "$name rc=$?"
  grep -E "$g" $logs/$name.log | cut -c1-200
}
finish() {  # the end of the call: the time, and the logs packed for the device tool
  date -u
  tar czf $OUT/logs.tgz -C /tmp mqa-logs
}
row() {  # NAME DIR MODEL ITERS ARGS...: MODEL b1 128 / 128, DIR's binary and library
  local name=$1 d=$2 model=$3 iters=$4; shift 4
  LD_LIBRARY_PATH="$d/lib:$LD_LIBRARY_PATH" timeout 40 $d/bin/mqabench latency \
    --model configs/$model $m1 --num-iters $iters "$@" > $logs/$name.log 2>&1
  echo "$name rc=$? $(grep -E 'Avg latency|decode step|prefill step' $logs/$name.log | cut -c1-100 | tr '\n' ' ')"
}
b1row() { local name=$1 d=$2; shift 2; row $name $d starcoder 2 "$@"; }  # StarCoder, two iterations
scrow() { local name=$1 d=$2; shift 2; row $name $d santacoder 5 "$@"; }  # SantaCoder, five
# ROUNDS SANTACODER: HEAD's StarCoder b1 (and SantaCoder where SANTACODER is 1) at the default
# (decode shapes tuned, then frozen) beside --autotune on (every GEMM shape tuned at first sight,
# the b1 prefill's m = 128 shapes among them): separate processes, in rotation.
autotune_rows() {
  local r
  for r in $(seq $1); do
    b1row b1_tdec_$r $b; b1row b1_ton_$r $b --autotune on
    if (($2)); then scrow sc_tdec_$r $b; scrow sc_ton_$r $b --autotune on; fi
  done
}
timeline() {  # NAME DIR ARGS...: StarCoder b1, one iteration with ARGS (--chain-timeline L,...)
  local name=$1 d=$2; shift 2
  LD_LIBRARY_PATH="$d/lib:$LD_LIBRARY_PATH" timeout 60 $d/bin/mqabench latency \
    --model configs/starcoder $m1 --num-iters 1 "$@" > $logs/$name.log 2>&1
  echo "$name rc=$?"; sed -n '/chain timeline/,$p' $logs/$name.log | cut -c1-170
}
# The experiments of gpu-bundle-ab (scripts/gpu-bundle-ab.sh): each its own copy of the bundle
# with expN/'s library, all beside HEAD's in rotation.
dirs=($b)
for e in $b/exp*/libmqa_kernels.so; do
  [[ -f $e ]] || continue
  n=$(basename $(dirname $e)); x=/tmp/mqa-gpu-bundle-$n
  rm -rf $x && mkdir -p $x && cp -a $b/bin $b/lib $b/tests $x/ && cp $e $x/lib/libmqa_kernels.so
  dirs+=($x)
done
# HEAD's library with these mqabench --chain rows, in the same rotation (e.g. f2: at most two ring
# stages in flight; f2 and f1 lost in version 53).
knobs=()
if (( ${#dirs[@]} > 1 )); then
  cat gpu-bundle-ab/EXPERIMENT 2>/dev/null
  rounds=6 sc_rounds=0
  for r in $(seq $rounds); do
    for d in "${dirs[@]}"; do b1row b1_$(basename $d)_$r $d; done
    if ((sc_rounds)); then for d in "${dirs[@]}"; do scrow sc_$(basename $d)_$r $d; done; fi
    for k in ${knobs[@]+"${knobs[@]}"}; do b1row b1_${k}_$r $b --chain $k; done
  done
  # MQA_CALL_MIN=1 (when little device time is left): no 512 / 128 rows, no timelines, HF parity's
  # chain rows only, one --autotune on row (below), and the call ends after the experiments' tests.
  min=${MQA_CALL_MIN:-0}
  # 512 / 128: the long form of the chain's attention (contexts past 256), which the
  # experiments leave alone: one round.
  ((min)) || for d in "${dirs[@]}"; do b1row b512_$(basename $d)_1 $d --input-len 512; done
  hf_filter='*'; ((min)) && hf_filter='*chain*'
  for d in "${dirs[@]:1}"; do
    e=$(basename $d)
    for t in decode_chain_test gemm_tail_attention_test model_hf_parity_cuda_test; do
      f='*'; [[ $t == model_hf_parity_cuda_test ]] && f=$hf_filter
      LD_LIBRARY_PATH="$d/lib:$LD_LIBRARY_PATH" timeout 120 $d/tests/$t --gtest_filter="$f" > $logs/${e}_$t.log 2>&1
      echo "$e $t rc=$? $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' $logs/${e}_$t.log | tr '\n' ' ')"
    done
    ((min)) || timeline ${e}_tl $d --chain-timeline 20
  done
  if ((min)); then
    autotune_rows 1 0
    finish
    exit 0
  fi
fi
timeline tl $b --chain-timeline 20
autotune_rows 2 1
# MQA_CALL_FULL=0: the experiments and the default timeline only (a short call).
if [[ ${MQA_CALL_FULL:-1} == 0 ]]; then
  finish
  exit 0
fi
bench st1 150 latency --model configs/starcoder $m1 --num-iters 2 --chain auto,hq2,na,auto
bench st1a 90 latency --model configs/starcoder $m1 --num-iters 2 --async both
bench st1e 120 latency --model configs/starcoder $m1 --num-iters 2 --engine on,la
timeline tl3 $b --chain-timeline 10,30
bench sc 90 latency --model configs/santacoder $m1 --num-iters 5 --engine off,on,la,on,la
# SantaCoder with the chain on every layer (the attention inside it), last measured on 2026-12-04
# before the chain's attention phase: 1.145 against 1.024 ms a step then.
bench scc 90 latency --model configs/santacoder $m1 --num-iters 3 --chain auto,on,auto,on
timeout 60 $b/bin/mqabench latency --model configs/santacoder $m1 --num-iters 1 --kernel-trace $logs/sc > $logs/sctrace.log 2>&1
echo "sc trace rc=$?"; grep -v "^#" $logs/sctrace.log | head -60 | cut -c1-200
timeout 60 $b/bin/mqabench latency --model configs/santacoder $m1 --num-iters 1 --tail-timeline 10 > $logs/sctail.log 2>&1
echo "sc tail timeline rc=$?"; grep -A2 "tail timeline" $logs/sctail.log | cut -c1-400
for r in $(seq 6); do scrow sc_occ0_$r $b; scrow sc_occ1_$r $b --gemm skinnydo; done
bench st32 150 latency --model configs/starcoder --batch-size 32 --input-len 512 --output-len 128 \
  --load-format dummy --num-iters 2
date -u
(timeout 330 $b/tests/gemm_cuda_test > $logs/gemm_cuda_test.log 2>&1; echo "gemm_cuda_test rc=$?" > $logs/gemm.rc) &
gp=$!
while read -r name ranks; do
  [[ -z "$name" || "$name" == gemm_cuda_test ]] && continue
  if [[ "$ranks" == 1 ]]; then timeout 240 $b/tests/$name > $logs/$name.log 2>&1
  else timeout 120 mpirun --oversubscribe -np $ranks -x LD_LIBRARY_PATH -x MQA_SOURCE_DIR $b/tests/$name > $logs/$name.log 2>&1; fi
  echo "$name rc=$? $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]|tests? (passed|failed)' $logs/$name.log | tr '\n' ' ')"
done < $b/tests.txt
while read -r name cmd; do
  cmd=${cmd//@BIN@/$b/bin}; cmd=${cmd//@SRC@/$PWD}
  eval "timeout 120 $cmd" > $logs/$name.log 2>&1; echo "$name rc=$?"
done < $b/scripts.txt
wait $gp; cat $logs/gemm.rc; grep -E '^\[  PASSED|^\[  FAILED' $logs/gemm_cuda_test.log
date -u
bench st512 120 latency --model configs/starcoder --batch-size 1 --input-len 512 --output-len 128 \
  --load-format dummy --num-iters 2 --chain auto,na
timeout 60 $b/bin/mqa_block_bench 2>&1 | tee $logs/mqa_block_bench.log
finish
