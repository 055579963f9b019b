#!/usr/bin/env python3
"""The HF `tokenizers` side of tokenizer_bench: same files, same tokenizer.json, same work
(each file encoded separately, one warm-up pass, best of --passes), one thread.

Usage: RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false \
       python3 hf_tokenizer_bench.py --tokenizer tokenizer.json --files list.txt [--mb 4]
"""
import argparse
import os
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from tokenizers import Tokenizer  # noqa: E402  (after the thread settings)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--files", required=True)
    ap.add_argument("--mb", type=float, default=4)
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args()
    tok = Tokenizer.from_file(args.tokenizer)
    texts, size, limit = [], 0, int(args.mb * 1e6)
    with open(args.files) as f:
        for path in (line.rstrip("\n") for line in f):
            if size >= limit:
                break
            try:
                raw = open(path, "rb").read()
                text = raw.decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            size += len(raw)
            texts.append(text)
    h, tokens = 1469598103934665603, 0
    for text in texts:  # warm-up pass, also the ids' hash (same as the C++ side)
        for i in tok.encode(text).ids:
            for c in f"{i},".encode():
                h = ((h ^ c) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
            tokens += 1
    best = float("inf")
    for _ in range(max(1, args.passes)):
        start = time.perf_counter()
        for text in texts:
            tok.encode(text)
        best = min(best, time.perf_counter() - start)
    print(f"hf tokenizers {__import__('tokenizers').__version__}: {len(texts)} files, "
          f"{size / 1e6:.2f} MB, {tokens} tokens, ids fnv1a {h:016x}, best of {args.passes}: "
          f"{best:.3f} s, {size / 1e6 / best:.2f} MB/s")


if __name__ == "__main__":
    main()
