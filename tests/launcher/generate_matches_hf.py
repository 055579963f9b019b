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
out = subprocess.run([binary, "generate", "--model", model, "--prompt", prompt, "--max-tokens", "48"],
                     capture_output=True, text=True, timeout=120)
if out.returncode != 0:
    sys.exit(f"mqaserve generate failed ({out.returncode}): {out.stderr}")
got = out.stdout.rstrip("\n")
if got != hf.rstrip("\n"):
    sys.exit(f"completion differs from HF's\n--- HF ---\n{hf}\n--- mqaserve ---\n{got}")
print("1 passed, 0 failed")
