#!/usr/bin/env bash
# Installs whatever mqaserve needs that is missing (Debian 12, as root). Idempotent: a second run
# installs nothing. CUDA, cuBLAS and NCCL are expected under /usr/local/cuda where present.
set -euo pipefail

APT_PACKAGES=(
  build-essential ninja-build ccache pkg-config git python3-pip
  libabsl-dev libprotobuf-dev protobuf-compiler libgtest-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin libcpp-httplib-dev nlohmann-json3-dev
  libutf8proc-dev libicu-dev libopenblas-dev clang libclang-rt-14-dev
)
# Python tools for tests and benchmarks (end-to-end clients, metrics parser), and a CMake that
# knows nvcc 13's C++20 flag (Debian 12's 3.25 does not).
PIP_PACKAGES=("cmake>=3.31,<4.2" "openai>=1.66" "prometheus_client" "aiohttp" "pytest" "requests"
              "huggingface_hub>=0.26" "anthropic>=0.40")

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: apt-get install ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

PIP=(python3 -m pip)
pip_missing=()
for spec in "${PIP_PACKAGES[@]}"; do
  python3 - "$spec" <<'PY' || pip_missing+=("$spec")
import sys
from importlib import metadata
try:
    from packaging.requirements import Requirement
except ImportError:
    sys.exit(1)
req = Requirement(sys.argv[1])
try:
    v = metadata.version(req.name)
except metadata.PackageNotFoundError:
    sys.exit(1)
sys.exit(0 if req.specifier.contains(v, prereleases=True) else 1)
PY
done
if ((${#pip_missing[@]})); then
  echo "install-deps: pip install ${pip_missing[*]}"
  "${PIP[@]}" install -q --disable-pip-version-check --root-user-action=ignore "${pip_missing[@]}" \
    2>/dev/null || "${PIP[@]}" install -q --disable-pip-version-check --break-system-packages "${pip_missing[@]}"
fi
hash -r
