#!/usr/bin/env bash
# Builds the CUDA binaries here (no GPU needed) and gathers them, with the non-system shared
# libraries they need, into gpu-bundle/ (git-ignored). On the H200 machine, from the repository
# root: `gpu-bundle/run.sh LOGDIR` runs every GPU test and benchmark and writes logs to LOGDIR.
# Send it with the device tool: carry ["gpu-bundle"].
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
"$CMAKE" -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DMQA_ENABLE_FUZZERS=OFF >build-gpu.cmake.log 2>&1 || { cat build-gpu.cmake.log; exit 1; }
grep -q "CUDA backend ON" build-gpu.cmake.log || { echo "gpu-bundle: nvcc not found"; exit 1; }
ninja -C build-gpu -j "${JOBS:-$(nproc)}" "$@"

rm -rf gpu-bundle
mkdir -p gpu-bundle/bin gpu-bundle/tests gpu-bundle/lib

# Tests: every ctest entry labelled gpu, with its command (plain, or under mpirun).
ctest --test-dir build-gpu -L gpu --show-only=json-v1 >build-gpu/gpu-tests.json
python3 - build-gpu/gpu-tests.json gpu-bundle/tests.txt <<'PY'
import json, os, sys
tests = json.load(open(sys.argv[1]))["tests"]
with open(sys.argv[2], "w") as out:
    for t in tests:
        cmd = t["command"]
        exe = next(c for c in cmd if os.path.basename(c) == t["name"])
        ranks = cmd[cmd.index("-np") + 1] if "-np" in cmd else "1"
        out.write(f"{t['name']} {ranks}\n")
PY
while read -r name _; do cp "build-gpu/tests/$name" gpu-bundle/tests/; done <gpu-bundle/tests.txt
# Benchmarks and the server.
for f in build-gpu/bin/*; do [[ -x "$f" && -f "$f" ]] && cp "$f" gpu-bundle/bin/; done
strip --strip-unneeded gpu-bundle/tests/* gpu-bundle/bin/* 2>/dev/null || true

# Libraries the H200 machine lacks (GPU-MACHINE.md): Abseil, protobuf, httplib, utf8proc,
# OpenBLAS. Its own libc, libstdc++, CUDA, cuBLAS, MPI, and NCCL (from its Python wheel) are used.
for f in gpu-bundle/tests/* gpu-bundle/bin/*; do
  ldd "$f" | awk '/=> \//{print $3}'
done | sort -u | grep -E 'libabsl_|libprotobuf|libcpp-httplib|libutf8proc|libopenblas|libgfortran|libbenchmark|libgtest|libquadmath|libicu' |
  while read -r lib; do cp -L "$lib" gpu-bundle/lib/; done

cp scripts/gpu-run.sh gpu-bundle/run.sh
du -sh gpu-bundle
echo "gpu-bundle: $(wc -l <gpu-bundle/tests.txt) GPU tests, $(ls gpu-bundle/bin | wc -l) binaries"
