#!/usr/bin/env bash
# Builds the CUDA binaries here (no GPU needed) and gathers them, with the non-system shared
# libraries they need, into gpu-bundle/ (git-ignored): run.sh and payload.tar.xz. On the H200
# machine, from the repository root, `gpu-bundle/run.sh LOGDIR` runs every GPU test (ctest label
# gpu: test binaries, under mpirun where they ask for ranks, and script tests) and every benchmark
# of scripts/gpu-benchmarks.txt, writing logs to LOGDIR. Send it with the device tool:
# carry ["gpu-bundle"].
#
# MQA_BUNDLE_SHARED=1: built in build-gpu-shared with the project's libraries shared
# (-DMQA_SHARED_LIBS=ON): the CUDA code travels once, in libmqa_kernels.so, and every GPU test
# binary with mqabench and mqaserve fits the device tool's 64 MiB together. Otherwise build-gpu,
# static: each binary carries all of the CUDA code it uses, and a bundle holds only a few.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
build=build-gpu shared=OFF
if [[ "${MQA_BUNDLE_SHARED:-0}" == 1 ]]; then build=build-gpu-shared shared=ON; fi
"$CMAKE" -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DMQA_ENABLE_FUZZERS=OFF -DMQA_SHARED_LIBS=$shared >"$build.cmake.log" 2>&1 ||
  { cat "$build.cmake.log"; exit 1; }
grep -q "CUDA backend ON" "$build.cmake.log" || { echo "gpu-bundle: nvcc not found"; exit 1; }
ninja -C "$build" -j "${JOBS:-$(nproc)}" "$@"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/tests" "$stage/lib"

# GPU-labelled ctest entries: binaries ("name ranks" in tests.txt) and script tests (scripts.txt,
# the command with @BIN@ for the bundle's bin/ and @SRC@ for the repository root).
ctest --test-dir "$build" -L gpu --show-only=json-v1 >"$build/gpu-tests.json"
python3 - "$build/gpu-tests.json" "$stage" "$PWD" "$build" <<'PY'
import json, os, shlex, sys
tests = json.load(open(sys.argv[1]))["tests"]
stage, src = sys.argv[2], sys.argv[3]
bin_dir = os.path.join(src, sys.argv[4], "bin")
with open(f"{stage}/tests.txt", "w") as binaries, open(f"{stage}/scripts.txt", "w") as scripts:
    for t in tests:
        cmd = t["command"]
        if any(os.path.basename(c) == t["name"] for c in cmd):
            ranks = cmd[cmd.index("-np") + 1] if "-np" in cmd else "1"
            binaries.write(f"{t['name']} {ranks}\n")
        else:
            args = [a.replace(bin_dir, "@BIN@").replace(src, "@SRC@") for a in cmd]
            if os.path.basename(args[0]).startswith("python"):
                args[0] = "python3"  # this machine's interpreter path means nothing there
            scripts.write(t["name"] + " " + shlex.join(args) + "\n")
PY
# The device tool carries at most 64 MiB (tree + bundle) and every binary holds all of the CUDA
# code, so a run can take a subset: MQA_BUNDLE_BINS="a b" (only these of bin/), MQA_BUNDLE_TESTS=0
# (no test binaries or script tests), =scripts (script tests only) or ="name ..." (these test
# binaries and the script tests).
# MQA_BUNDLE_TESTS=scripts: only the script tests (with MQA_BUNDLE_BINS including mqaserve).
if [[ "${MQA_BUNDLE_TESTS:-1}" == 0 ]]; then : >"$stage/tests.txt"; : >"$stage/scripts.txt"; fi
if [[ "${MQA_BUNDLE_TESTS:-1}" == scripts ]]; then : >"$stage/tests.txt"; fi
# MQA_BUNDLE_TESTS="name ...": only these test binaries (and the script tests).
if [[ "${MQA_BUNDLE_TESTS:-1}" == *[a-z]*" "* || "${MQA_BUNDLE_TESTS:-1}" == *_test* ]]; then
  while read -r name ranks; do
    [[ " $MQA_BUNDLE_TESTS " == *" $name "* ]] && echo "$name $ranks"
  done <"$stage/tests.txt" >"$stage/tests.keep"
  mv "$stage/tests.keep" "$stage/tests.txt"
fi
if [[ -n "${MQA_BUNDLE_BINS:-}" && " $MQA_BUNDLE_BINS " != *" mqaserve "* ]]; then
  : >"$stage/scripts.txt"  # the script tests run mqaserve
fi
while read -r name _; do cp "$build/tests/$name" "$stage/tests/"; done <"$stage/tests.txt"
for f in "$build"/bin/*; do
  if [[ -n "${MQA_BUNDLE_BINS:-}" && " $MQA_BUNDLE_BINS " != *" $(basename "$f") "* ]]; then
    continue
  fi
  [[ -x "$f" && -f "$f" ]] && cp "$f" "$stage/bin/"
done
strip --strip-unneeded "$stage"/tests/* "$stage"/bin/* 2>/dev/null || true
grep -v '^#' scripts/gpu-benchmarks.txt >"$stage/benchmarks.txt"

# Libraries the H200 machine lacks (GPU-MACHINE.md): Abseil, protobuf, httplib, utf8proc, ICU,
# OpenBLAS; and CUPTI (mqabench --kernel-trace), whose activity records must match the headers
# it was built with. Its own libc, libstdc++, CUDA, cuBLAS, MPI, and NCCL (from its Python wheel)
# are used.
shopt -s nullglob  # a bundle may hold no test binaries (MQA_BUNDLE_TESTS=scripts)
for f in "$stage"/tests/* "$stage"/bin/*; do
  ldd "$f" | awk '/=> \//{print $3}'
done | sort -u |
  grep -E 'libmqa_|libabsl_|libprotobuf|libcpp-httplib|libutf8proc|libopenblas|libgfortran|libbenchmark|libgtest|libquadmath|libicu|libcupti' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
strip --strip-unneeded "$stage"/lib/libmqa_* 2>/dev/null || true

# A new bundle replaces the old one; benchmark lists kept beside it (gpu-bundle/*.txt, for
# `run.sh LOGDIR all|bench LIST`) survive the rebuild.
find gpu-bundle -mindepth 1 ! -name '*.txt' -exec rm -rf {} + 2>/dev/null || true
mkdir -p gpu-bundle
# xz -9's 64 MiB window folds the CUDA code that every binary carries; the device tool takes at
# most 64 MiB of working tree, fixtures and demo model included.
tar cf - -C "$stage" . | xz -9 -T2 >gpu-bundle/payload.tar.xz
cp scripts/gpu-run.sh gpu-bundle/run.sh
du -sh gpu-bundle
echo "gpu-bundle: $(wc -l <"$stage/tests.txt") GPU test binaries, $(wc -l <"$stage/scripts.txt") script tests, $(ls "$stage/bin" | wc -l) binaries"
