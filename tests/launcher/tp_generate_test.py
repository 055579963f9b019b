#!/usr/bin/env python3
"""Tensor parallelism end to end: `mpirun -np T mqaserve generate` on the demo model at T = 1, 2
and 4 gives HF's greedy completion every time, and the same sampled completion for a fixed seed."""
import os
import subprocess
import sys

binary, model = sys.argv[1], sys.argv[2]
readme = open(f"{model}/README.md", encoding="utf-8").read()
hf = readme.split("```python\n", 1)[1].rsplit("\n```", 1)[0].rstrip("\n")
prompt = "def fibonacci(n):\n"
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def generate(ranks, *extra):
    cmd = ["mpirun", "--oversubscribe", "-np", str(ranks), binary, "generate", "--model", model,
           "--prompt", prompt, "--num-kv-blocks", "128", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    if out.returncode != 0:
        sys.exit(f"T={ranks} failed ({out.returncode}): {out.stderr[-2000:]}")
    return out.stdout.rstrip("\n")


passed = failed = 0
sampled = {}
for t in (1, 2, 4):
    greedy = generate(t, "--max-tokens", "48")
    if greedy == hf:
        passed += 1
    else:
        failed += 1
        print(f"T={t}: greedy differs from HF\n{greedy}\n---\n{hf}")
    sampled[t] = generate(t, "--max-tokens", "40", "--temperature", "0.8", "--top-p", "0.95",
                          "--sample-seed", "1234", "--debug-check-mirror")
for t in (2, 4):
    if sampled[t] == sampled[1]:
        passed += 1
    else:
        failed += 1
        print(f"T={t}: seeded sample differs from T=1\n{sampled[t]}\n---\n{sampled[1]}")
if sampled[1] == hf[: len(sampled[1])]:
    failed += 1
    print("the seeded sample equals the greedy text: sampling did not sample")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
