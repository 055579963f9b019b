#!/usr/bin/env bash
# Builds the shared bundle of HEAD (scripts/gpu-bundle.sh with MQA_BUNDLE_SHARED=1) and a second
# libmqa_kernels.so with an experiment's change applied on top of HEAD, and packs both into
# gpu-bundle-ab/payload.tar.xz (git-ignored): the bundle as gpu-bundle packs it, plus
# exp/libmqa_kernels.so. The two libraries sit next to each other in one xz stream, so the second
# costs ~1 MB (a library alone is ~14 MB compressed) and both fit the device tool's 64 MiB with
# the tree. On the device, gpu-call-next.sh copies the extracted bundle, puts exp/'s library over
# lib/'s in the copy, and runs the two in separate processes, in rotation (the library is all
# that differs).
#
#   scripts/gpu-bundle-ab.sh COMMIT   # COMMIT's diff against its parent is the experiment
#
# Needs a clean tree (the change is applied to it, built, and checked out again). Kernel code
# only: the experiment must not change a header that other libraries or binaries include.
set -euo pipefail
cd "$(dirname "$0")/.."
commit=${1:?usage: scripts/gpu-bundle-ab.sh COMMIT}
git diff --quiet HEAD || { echo "gpu-bundle-ab: the tree has changes; commit or stash them"; exit 1; }
changed=$(git diff --name-only "$commit~1" "$commit")
if grep -qv '^kernels/.*\.cu$' <<<"$changed"; then
  echo "gpu-bundle-ab: $commit changes more than kernels/*.cu:"
  echo "$changed"
  exit 1
fi
MQA_BUNDLE_SHARED=1 bash scripts/gpu-bundle.sh
build=build-gpu-shared
work=$(mktemp -d)
restore() {
  git checkout -q -- kernels
  ninja -C "$build" -j "${JOBS:-$(nproc)}" mqa_kernels >/dev/null
  rm -rf "$work"
}
trap restore EXIT
git diff "$commit~1" "$commit" | git apply
ninja -C "$build" -j "${JOBS:-$(nproc)}" mqa_kernels
mkdir -p "$work/bundle/exp"
cp "$build/kernels/libmqa_kernels.so" "$work/bundle/exp/"
strip --strip-unneeded "$work/bundle/exp/libmqa_kernels.so"
tar xJf gpu-bundle/payload.tar.xz -C "$work/bundle"
cmp -s "$work/bundle/lib/libmqa_kernels.so" "$work/bundle/exp/libmqa_kernels.so" &&
  { echo "gpu-bundle-ab: the experiment's library equals HEAD's"; exit 1; }
(
  cd "$work/bundle"
  # The two libraries first and together, so that the second is stored as its differences.
  { echo lib/libmqa_kernels.so; echo exp/libmqa_kernels.so
    find . -type f ! -path ./lib/libmqa_kernels.so ! -path ./exp/libmqa_kernels.so | sed 's#^\./##'
  } >"$work/order.txt"
  tar cf - -T "$work/order.txt" | xz -9 -T1 >"$work/payload.tar.xz"
)
mkdir -p gpu-bundle-ab
mv "$work/payload.tar.xz" gpu-bundle-ab/payload.tar.xz
echo "$commit $(git log -1 --format=%s "$commit" | cut -c1-100)" >gpu-bundle-ab/EXPERIMENT
du -sh gpu-bundle-ab
echo "gpu-bundle-ab: HEAD $(git rev-parse --short HEAD) with exp/ = $commit"
