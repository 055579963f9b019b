#!/usr/bin/env python3
"""Online serving benchmark for mqaserve's OpenAI-compatible /v1/completions endpoint.

Modelled on vLLM's benchmarks/benchmark_serving.py: requests arrive as a Poisson process at
--request-rate (inf: all at once), each streams its completion, and the client measures
  TTFT  time to first token (request sent -> first chunk with text or tokens),
  TPOT  time per output token after the first ((latency - TTFT) / (output tokens - 1)),
  ITL   inter-token latency (gaps between successive streamed chunks),
  E2E   request latency,
reporting mean, median and p99 of each, and request / output-token / total-token throughput.

Prompts are cut from real source code: consecutive lines of the Python standard library's .py
files (random file, random start line), about --input-len tokens each (measured with the server's
/tokenize and trimmed to fit). Generation runs with ignore_eos so that every request produces
--output-len tokens.

Example:
  python3 benchmarks/serving.py --base-url http://127.0.0.1:8000 --num-prompts 200 \\
      --request-rate 8 --input-len 512 --output-len 128 --result-json results.json
"""

import argparse
import asyncio
import glob
import json
import os
import random
import statistics
import sys
import sysconfig
import time
from dataclasses import dataclass, field

import aiohttp


@dataclass
class RequestResult:
    ok: bool = False
    error: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list = field(default_factory=list)


def source_files(root):
    files = [f for f in glob.glob(os.path.join(root, "**", "*.py"), recursive=True)
             if "site-packages" not in f and "test" not in os.path.basename(f)]
    return sorted(f for f in files if os.path.getsize(f) > 4096)


async def tokenize(session, base_url, headers, text):
    async with session.post(base_url + "/tokenize", json={"prompt": text}, headers=headers) as r:
        r.raise_for_status()
        return (await r.json())["tokens"]


async def detokenize(session, base_url, headers, tokens):
    async with session.post(base_url + "/detokenize", json={"tokens": tokens},
                            headers=headers) as r:
        r.raise_for_status()
        return (await r.json())["prompt"]


async def make_prompts(session, args, headers, rng):
    """Prompts of about args.input_len tokens, cut from stdlib source files."""
    files = source_files(args.source_dir)
    if not files:
        sys.exit(f"no .py files under {args.source_dir}")
    prompts = []
    while len(prompts) < args.num_prompts:
        with open(rng.choice(files), encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
        start = rng.randrange(len(lines))
        # Roughly 3 characters per token for code; then trim exactly by tokens.
        text, i = "", start
        while len(text) < args.input_len * 4 and i < len(lines):
            text += lines[i]
            i += 1
        tokens = await tokenize(session, args.base_url, headers, text)
        if len(tokens) < args.input_len // 2:
            continue  # near the end of a short file; draw again
        prompts.append(await detokenize(session, args.base_url, headers,
                                        tokens[:args.input_len]))
    return prompts


async def send(session, args, headers, prompt, semaphore):
    result = RequestResult()
    body = {
        "model": args.model, "prompt": prompt, "max_tokens": args.output_len,
        "temperature": args.temperature, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with semaphore:
        start = time.perf_counter()
        last = start
        try:
            async with session.post(args.base_url + "/v1/completions", json=body,
                                    headers=headers) as response:
                if response.status != 200:
                    result.error = f"HTTP {response.status}: {(await response.text())[:200]}"
                    return result
                buffer = b""
                async for data in response.content.iter_any():
                    buffer += data
                    while b"\n\n" in buffer:
                        event, buffer = buffer.split(b"\n\n", 1)
                        for line in event.split(b"\n"):
                            if not line.startswith(b"data: "):
                                continue  # SSE comments (keep-alive)
                            payload = line[6:]
                            if payload == b"[DONE]":
                                continue
                            chunk = json.loads(payload)
                            if "error" in chunk:
                                result.error = chunk["error"].get("message", "stream error")
                                return result
                            if chunk.get("usage"):
                                result.prompt_tokens = chunk["usage"]["prompt_tokens"]
                                result.output_tokens = chunk["usage"]["completion_tokens"]
                            if any(c.get("text") for c in chunk.get("choices", [])):
                                now = time.perf_counter()
                                if result.ttft == 0.0:
                                    result.ttft = now - start
                                else:
                                    result.itl.append(now - last)
                                last = now
            result.latency = time.perf_counter() - start
            result.ok = result.output_tokens > 0
            if not result.ok:
                result.error = "no tokens"
        except (aiohttp.ClientError, asyncio.TimeoutError) as error:
            result.error = repr(error)
    return result


def summary(values_s):
    if not values_s:
        return {"mean_ms": 0.0, "median_ms": 0.0, "p99_ms": 0.0}
    ordered = sorted(values_s)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return {"mean_ms": 1000 * statistics.fmean(ordered),
            "median_ms": 1000 * statistics.median(ordered), "p99_ms": 1000 * p99}


async def run(args):
    rng = random.Random(args.seed)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    timeout = aiohttp.ClientTimeout(total=None, sock_read=args.timeout)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        if args.model is None:
            async with session.get(args.base_url + "/v1/models", headers=headers) as r:
                r.raise_for_status()
                args.model = (await r.json())["data"][0]["id"]
        prompts = await make_prompts(session, args, headers, rng)
        semaphore = asyncio.Semaphore(args.max_concurrency or len(prompts))
        tasks = []
        start = time.perf_counter()
        for prompt in prompts:
            tasks.append(asyncio.create_task(send(session, args, headers, prompt, semaphore)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start

    done = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    input_tokens = sum(r.prompt_tokens for r in done)
    output_tokens = sum(r.output_tokens for r in done)
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    report = {
        "model": args.model, "base_url": args.base_url, "num_prompts": args.num_prompts,
        "request_rate": args.request_rate, "max_concurrency": args.max_concurrency,
        "input_len": args.input_len, "output_len": args.output_len,
        "completed": len(done), "failed": len(failed), "duration_s": duration,
        "total_input_tokens": input_tokens, "total_output_tokens": output_tokens,
        "request_throughput": len(done) / duration,
        "output_token_throughput": output_tokens / duration,
        "total_token_throughput": (input_tokens + output_tokens) / duration,
        "ttft": summary([r.ttft for r in done]), "tpot": summary(tpot),
        "itl": summary([gap for r in done for gap in r.itl]),
        "e2e_latency": summary([r.latency for r in done]),
        "errors": sorted({r.error for r in failed})[:10],
    }
    print(f"{'=' * 20} Serving benchmark {'=' * 20}")
    print(f"{'Successful requests:':<40}{len(done)} (failed {len(failed)})")
    print(f"{'Duration (s):':<40}{duration:.2f}")
    print(f"{'Total input tokens:':<40}{input_tokens}")
    print(f"{'Total generated tokens:':<40}{output_tokens}")
    print(f"{'Request throughput (req/s):':<40}{report['request_throughput']:.2f}")
    print(f"{'Output token throughput (tok/s):':<40}{report['output_token_throughput']:.2f}")
    print(f"{'Total token throughput (tok/s):':<40}{report['total_token_throughput']:.2f}")
    for key, title in (("ttft", "Time to first token"), ("tpot", "Time per output token"),
                       ("itl", "Inter-token latency"), ("e2e_latency", "End-to-end latency")):
        s = report[key]
        print(f"{'-' * 15} {title} {'-' * 15}")
        print(f"{'  mean / median / p99 (ms):':<40}"
              f"{s['mean_ms']:.2f} / {s['median_ms']:.2f} / {s['p99_ms']:.2f}")
    for error in report["errors"]:
        print("error:", error)
    if args.result_json:
        with open(args.result_json, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if not failed else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default=None, help="default: the server's first model")
    parser.add_argument("--api-key", default=os.environ.get("MQA_API_KEY"))
    parser.add_argument("--num-prompts", type=int, default=200)
    parser.add_argument("--request-rate", type=float, default=float("inf"),
                        help="requests per second, Poisson arrivals (inf: all at once)")
    parser.add_argument("--max-concurrency", type=int, default=0, help="0: unlimited")
    parser.add_argument("--input-len", type=int, default=512, help="prompt tokens")
    parser.add_argument("--output-len", type=int, default=128, help="generated tokens")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--source-dir", default=sysconfig.get_paths()["stdlib"],
                        help="where prompts are cut from (.py files)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds of silence allowed")
    parser.add_argument("--result-json", default=None)
    args = parser.parse_args()
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
