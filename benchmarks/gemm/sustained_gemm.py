#!/usr/bin/env python3
# Sustained fp16 GEMM rate at StarCoder's prefill shapes (M = 16384 tokens), through PyTorch's
# cuBLAS: short bursts (as GEMM benchmarks time them) against two seconds of back-to-back GEMMs,
# reported per window of ten layers. Question (BENCHMARKS.md, 2026-12-05 late evening): is the
# 16384-token prefill (~660 TFLOP/s of GEMM work) at the rate the GPU sustains, or below it?
# Run on the GPU machine (it has torch), with nvidia-smi beside it for the clock and the
# throttle reason:
#   nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active \
#       --format=csv,noheader -lms 25 > smi.csv &
#   python3 benchmarks/gemm/sustained_gemm.py
import time

import torch

torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
dev = "cuda"
M = 16384
shapes = {"qkv": (6144, 6400), "attn_proj": (6144, 6144), "fc": (6144, 24576),
          "mlp_proj": (24576, 6144)}
A = {k: torch.randn(M, s[0], device=dev, dtype=torch.float16) * 0.1 for k, s in shapes.items()}
W = {k: torch.randn(s[1], s[0], device=dev, dtype=torch.float16) * 0.02 for k, s in shapes.items()}


def flops(k):
    return 2.0 * M * shapes[k][0] * shapes[k][1]


def burst(k, n):
    torch.cuda.synchronize()
    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(n):
        torch.nn.functional.linear(A[k], W[k])
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / n


for k in shapes:
    burst(k, 2)
time.sleep(2.0)  # cool down
for k in shapes:
    ms = burst(k, 3)
    print(f"burst {k:9s} {ms:7.3f} ms {flops(k) / ms / 1e9:6.1f} TFLOP/s", flush=True)
    time.sleep(0.5)
a = torch.randn(8192, 8192, device=dev, dtype=torch.float16)
b = torch.randn(8192, 8192, device=dev, dtype=torch.float16)
torch.cuda.synchronize()
time.sleep(1.0)
e = [torch.cuda.Event(enable_timing=True) for _ in range(11)]
e[0].record()
for i in range(10):
    for _ in range(2):
        a @ b
    e[i + 1].record()
torch.cuda.synchronize()
print("8192^3 short:",
      " ".join(f"{2 * 8192**3 / (e[i].elapsed_time(e[i + 1]) / 2) / 1e9:.0f}" for i in range(10)),
      flush=True)
time.sleep(2.0)
# One layer's four GEMMs, 120 times back to back.
order = ["qkv", "attn_proj", "fc", "mlp_proj"]
per_layer = sum(flops(k) for k in order)
ev = [torch.cuda.Event(enable_timing=True) for _ in range(121)]
ev[0].record()
for i in range(120):
    for k in order:
        torch.nn.functional.linear(A[k], W[k])
    ev[i + 1].record()
torch.cuda.synchronize()
t = 0.0
for i in range(0, 120, 10):
    span = sum(ev[j].elapsed_time(ev[j + 1]) for j in range(i, i + 10))
    print(f"sustained layers {i:3d}-{i + 9:3d}: t={t:7.1f} ms  "
          f"{10 * per_layer / span / 1e9:6.1f} TFLOP/s", flush=True)
    t += span
