#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test (ctest: unit, MPI and GPU
# tests; GPU tests report "skipped" without a GPU) and exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
source scripts/env.sh
cd build
ctest --output-on-failure --timeout 600 -j 2
