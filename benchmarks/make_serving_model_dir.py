#!/usr/bin/env python3
"""A model folder for serving benchmarks with `--load-format dummy`: a config.json from configs/
and a tokenizer.json whose vocabulary is exactly the config's, so that every id the random
weights sample decodes to text.

StarCoder's own tokenizer cannot be downloaded on the benchmark machines, so this trains one of
the same kind (byte-level BPE, pre-tokenizer Sequence[Digits(individual_digits), ByteLevel],
StarCoder's special tokens first) on the Python standard library with HF `tokenizers`, with
tests/fixtures/make_fixtures.py's corpus and trainer. Token counts of code are then close
to StarCoder's (prompt lengths in serving.py are measured with the server's /tokenize anyway).

  python3 benchmarks/make_serving_model_dir.py --config configs/starcoder --out /tmp/starcoder
"""
import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "fixtures"))
from make_fixtures import read_texts, stdlib_files, train_bpe  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True, help="folder with config.json (e.g. configs/starcoder)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--corpus-bytes", type=int, default=30_000_000)
    args = ap.parse_args()
    config = json.loads((Path(args.config) / "config.json").read_text())
    vocab = int(config["vocab_size"])
    tok = train_bpe(vocab, read_texts(stdlib_files(), limit_bytes=args.corpus_bytes))
    # The corpus may not hold enough distinct merges: pad with tokens of their own so that every
    # id below vocab_size exists (the sampler can draw any of them).
    missing = vocab - tok.get_vocab_size()
    if missing > 0:
        tok.add_tokens([f"<pad_{i}>" for i in range(missing)])
    if tok.get_vocab_size() != vocab:
        sys.exit(f"tokenizer has {tok.get_vocab_size()} tokens, the config {vocab}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(args.config) / "config.json", out / "config.json")
    tok.save(str(out / "tokenizer.json"))
    print(f"{out}: config.json, tokenizer.json ({vocab} tokens)")


if __name__ == "__main__":
    main()
