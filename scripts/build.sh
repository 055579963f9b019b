#!/usr/bin/env bash
# Release build in build/ (the server is build/bin/mqaserve). Extra args go to CMake.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
"$CMAKE" -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >build.cmake.log 2>&1 || {
  cat build.cmake.log; exit 1; }
"$CMAKE" --build build -j "$(nproc)"
