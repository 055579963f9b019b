#!/usr/bin/env python3
"""`mqaserve generate` on the demo model equals the greedy completion HF transformers produced
when the model was made (models/demo/README.md, written by tests/fixtures/make_fixtures.py)."""
import subprocess
import sys

binary, model = sys.argv[1], sys.argv[2]
readme = open(f"{model}/README.md", encoding="utf-8").read()
hf = readme.split("```python\n", 1)[1].rsplit("\n```", 1)[0]
prompt = "def fibonacci(n):\n"
assert hf.startswith(prompt), "README sample does not start with the prompt"
for extra in ([], ["--async-scheduling"]):
    out = subprocess.run([binary, "generate", "--model", model, "--prompt", prompt, "--max-tokens",
                          "48"] + extra, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        sys.exit(f"mqaserve generate {' '.join(extra)} failed ({out.returncode}): {out.stderr}")
    got = out.stdout.rstrip("\n")
    if got != hf.rstrip("\n"):
        sys.exit(f"completion {' '.join(extra)} differs from HF's\n--- HF ---\n{hf}\n"
                 f"--- mqaserve ---\n{got}")
    # On the CPU decode lookahead cannot run (it needs the GPU's sampling): the server says so.
    if extra and "--async-scheduling has no effect here" not in out.stderr:
        sys.exit(f"no note that --async-scheduling has no effect on the CPU:\n{out.stderr}")
print("2 passed, 0 failed")
