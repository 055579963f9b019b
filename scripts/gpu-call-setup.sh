# Sourced by the device-call scripts (gpu-call-next.sh, gpu-call-ab.sh) as their first step:
#   source scripts/gpu-call-setup.sh PAYLOAD   # gpu-bundle/payload.tar.xz or gpu-bundle-ab/...
# The console to $OUT/summary.txt as it runs; the bundle unpacked into $b with its libraries (and
# NCCL's wheel, where the machine has one) on the library path; $logs (emptied), $gpu (the card's
# name), $m1 (the batch-1 128 / 128 latency flags), finish (the date, and the logs to
# $OUT/logs.tgz), gtest_verdict / latency_summary (a log's result on one line) and variant_dir (an
# A/B experiment's copy of the bundle). With
# MQA_OUT_TAG=T set, the console and the logs go to summary_T.txt and logs_T.tgz instead, so that
# two scripts can run in one call.
set -u
tag=${MQA_OUT_TAG:+_$MQA_OUT_TAG}
logs=/tmp/mqa-logs$tag
rm -rf $logs && mkdir -p $logs
exec > >(tee $OUT/summary$tag.txt) 2>&1
date -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
b=/tmp/mqa-gpu-bundle
rm -rf $b && mkdir -p $b && tar xJf "$1" -C $b
nccl=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
export LD_LIBRARY_PATH="$b/lib${nccl:+:$nccl/lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export MQA_SOURCE_DIR=$PWD OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
m1="--batch-size 1 --input-len 128 --output-len 128 --load-format dummy"
finish() { date -u; tar czf $OUT/logs$tag.tgz -C /tmp mqa-logs$tag; }
# A gtest log's verdict (its PASSED count, or its FAILED lines) on one line.
gtest_verdict() { grep -E '^\[  PASSED|^\[  FAILED  \] ' "$1" | head -8 | tr '\n' ' '; }
# An experiment's copy of the bundle (gpu-bundle-ab's expN/: its library over lib/'s); its path
# on stdout.
variant_dir() {
  local x=/tmp/mqa-gpu-bundle-$1
  rm -rf $x && mkdir -p $x && cp -a $b/bin $b/lib $b/tests $x/ &&
    cp $b/$1/libmqa_kernels.so $x/lib/ && echo $x
}
# An mqabench latency log's headline figures (Avg latency; prefill and decode step) on one line.
latency_summary() { grep -E 'Avg latency|decode step' "$1" | cut -c1-150 | tr '\n' ' '; }
