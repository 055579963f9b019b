#!/usr/bin/env bash
# Builds the shared bundle of HEAD (scripts/gpu-bundle.sh with MQA_BUNDLE_SHARED=1) and, for each
# experiment commit, a libmqa_kernels.so with that commit's change applied on top of HEAD, and
# packs them into gpu-bundle-ab/payload.tar.xz (git-ignored): the bundle as gpu-bundle packs it,
# plus exp1/libmqa_kernels.so, exp2/... (gpu-bundle-ab/EXPERIMENT names them). The libraries sit
# next to each other in one xz stream, so each further one costs ~1 MB (a library alone is ~14 MB
# compressed) and they fit the device tool's 64 MiB with the tree. On the device, an experiment's
# call script (gpu-call-ab.sh) copies the extracted bundle once an experiment, puts expN/'s
# library over lib/'s in the copy, and runs them all in separate processes, in rotation (the
# library is all that differs).
#
#   scripts/gpu-bundle-ab.sh COMMIT...   # each COMMIT's diff against its parent is an experiment
#
# Needs a clean tree (the change is applied to it, built, and checked out again). Kernel code
# only: the experiment must not change a header that other libraries or binaries include.
set -euo pipefail
cd "$(dirname "$0")/.."
(($# > 0)) || { echo "usage: scripts/gpu-bundle-ab.sh COMMIT..."; exit 1; }
git diff --quiet HEAD || { echo "gpu-bundle-ab: the tree has changes; commit or stash them"; exit 1; }
for commit in "$@"; do
  changed=$(git diff --name-only "$commit~1" "$commit")
  if grep -qv '^kernels/.*\.cu$' <<<"$changed"; then
    echo "gpu-bundle-ab: $commit changes more than kernels/*.cu:"
    echo "$changed"
    exit 1
  fi
done
# Only what the call scripts run (gpu-call-ab.sh, gpu-call-next.sh), unless the
# caller names its own: two experiments in gemm_skinny.cu left ~0.3 MB of the 64 MiB with the
# full set (2026-12-07). gpu-bundle/ is left with that subset too.
MQA_BUNDLE_SHARED=1 MQA_BUNDLE_BINS="${MQA_BUNDLE_BINS-mqabench attention_bench}" \
  MQA_BUNDLE_TESTS="${MQA_BUNDLE_TESTS-gemm_cuda_test gemm_tail_attention_test \
model_hf_parity_cuda_test attention_cuda_test decode_chain_test}" bash scripts/gpu-bundle.sh
build=build-gpu-shared
work=$(mktemp -d)
restore() {
  git checkout -q -- kernels
  ninja -C "$build" -j "${JOBS:-$(nproc)}" mqa_kernels >/dev/null
  rm -rf "$work"
}
trap restore EXIT
mkdir -p "$work/bundle"
tar xJf gpu-bundle/payload.tar.xz -C "$work/bundle"
n=0
: >"$work/EXPERIMENT"
for commit in "$@"; do
  n=$((n + 1))
  git diff "$commit~1" "$commit" | git apply
  ninja -C "$build" -j "${JOBS:-$(nproc)}" mqa_kernels
  mkdir -p "$work/bundle/exp$n"
  cp "$build/kernels/libmqa_kernels.so" "$work/bundle/exp$n/"
  strip --strip-unneeded "$work/bundle/exp$n/libmqa_kernels.so"
  git checkout -q -- kernels
  cmp -s "$work/bundle/lib/libmqa_kernels.so" "$work/bundle/exp$n/libmqa_kernels.so" &&
    { echo "gpu-bundle-ab: $commit's library equals HEAD's"; exit 1; }
  echo "exp$n $commit $(git log -1 --format=%s "$commit" | cut -c1-100)" >>"$work/EXPERIMENT"
done
(
  cd "$work/bundle"
  # The libraries first and together, so that each after the first is stored as its differences.
  { echo lib/libmqa_kernels.so; ls -d exp*/libmqa_kernels.so
    find . -type f ! -name libmqa_kernels.so | sed 's#^\./##'
  } >"$work/order.txt"
  tar cf - -T "$work/order.txt" | xz -9 -T1 >"$work/payload.tar.xz"
)
mkdir -p gpu-bundle-ab
mv "$work/payload.tar.xz" gpu-bundle-ab/payload.tar.xz
mv "$work/EXPERIMENT" gpu-bundle-ab/EXPERIMENT
du -sh gpu-bundle-ab
echo "gpu-bundle-ab: HEAD $(git rev-parse --short HEAD) with"
cat gpu-bundle-ab/EXPERIMENT
