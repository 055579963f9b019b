#!/usr/bin/env bash
# Online serving benchmark of one model: starts `mqaserve` on a free port, runs
# benchmarks/serving.py scenarios against it (each a line of SCENARIOS below, or of the file named
# by MQA_SERVING_SCENARIOS), stops the server. Logs and result JSON under OUTDIR.
#
#   benchmarks/run_serving.sh build/bin/mqaserve MODEL_DIR OUTDIR [mqaserve flags...]
#
# MQA_SERVING_PORT (default 8093), MQA_SERVING_SCENARIOS (lines "name | serving.py flags", or a
# file of them), MQA_SERVING_LAUNCH (see below).
# MODEL_DIR: a model folder (benchmarks/make_serving_model_dir.py makes one for
# `--load-format dummy`). Example (one H200):
#   python3 benchmarks/make_serving_model_dir.py --config configs/starcoder --out /tmp/starcoder
#   benchmarks/run_serving.sh build/bin/mqaserve /tmp/starcoder /tmp/serving \
#       --device cuda --load-format dummy --dtype float16
set -uo pipefail
if (($# < 3)); then
  sed -n '2,15p' "$0" >&2
  exit 2
fi
bin=$1 model=$2 out=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
port=${MQA_SERVING_PORT:-8093}
# name | serving.py flags
SCENARIOS=${MQA_SERVING_SCENARIOS:-}
if [[ -z $SCENARIOS ]]; then
  SCENARIOS=$(cat <<'EOF'
c1_128_128 | --num-prompts 12 --max-concurrency 1 --input-len 128 --output-len 128 --temperature 0
inf_512_128 | --num-prompts 256 --request-rate inf --input-len 512 --output-len 128
r8_512_128 | --num-prompts 300 --request-rate 8 --input-len 512 --output-len 128
EOF
)
elif [[ -f $SCENARIOS ]]; then
  SCENARIOS=$(cat "$SCENARIOS")
fi

# MQA_SERVING_LAUNCH: a launcher in front of the server, e.g. "mpirun -np 2 -x LD_LIBRARY_PATH".
# shellcheck disable=SC2086
${MQA_SERVING_LAUNCH:-} "$bin" --model "$model" --port "$port" "$@" >"$out/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
for _ in $(seq 300); do
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null; then break; fi
  if ! kill -0 $server 2>/dev/null; then
    echo "run_serving: the server exited during start-up:" >&2
    tail -20 "$out/server.log" >&2
    exit 1
  fi
  sleep 1
done
grep -E "GPU blocks|KV|serving" "$out/server.log" | head -5
rc=0
while IFS='|' read -r name flags; do
  name=$(echo "$name" | xargs)
  [[ -z $name || $name == \#* ]] && continue
  echo "== $name: serving.py $flags"
  # shellcheck disable=SC2086
  if ! python3 "$here/serving.py" --base-url "http://127.0.0.1:$port" $flags \
      --result-json "$out/$name.json" >"$out/$name.log" 2>&1; then
    echo "run_serving: scenario $name failed" >&2
    rc=1
  fi
  grep -v "^$" "$out/$name.log" | tail -16
  if ! kill -0 $server 2>/dev/null; then
    echo "run_serving: the server died during $name" >&2
    tail -20 "$out/server.log" >&2
    exit 1
  fi
done <<<"$SCENARIOS"
curl -s "http://127.0.0.1:$port/metrics" >"$out/metrics.txt"
exit $rc
