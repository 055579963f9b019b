#!/usr/bin/env bash
# Quick start: installs what is missing, builds, and starts a 2-rank CPU server with the demo
# model on 127.0.0.1:8000. Extra arguments go to mqaserve (e.g. --port 9000).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
source scripts/env.sh
exec mpirun -np 2 build/bin/mqaserve --model models/demo --device cpu "$@"
