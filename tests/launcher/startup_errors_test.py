#!/usr/bin/env python3
"""Start-up errors under `mpirun -np 2`: one clear line from rank 0, a non-zero exit, no hang.

    startup_errors_test.py MQASERVE MODEL_DIR

Each case starts a real 2-rank job with a broken folder or flag and checks that
  - mpirun exits non-zero within TIME_LIMIT seconds (every rank ended: mpirun returns only then);
  - exactly one line of mqaserve's own output comes out, `mqaserve: error: ...` (rank 0's), and it
    names the problem (not one line per rank, not MPI_Abort's banner).
A last case checks the per-rank weight-loading progress lines. Exit 0 when every check passes.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

TIME_LIMIT = 60
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OPENBLAS_NUM_THREADS="1")
results = []


def check(name, ok, detail=""):
    results.append(bool(ok))
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + detail), flush=True)


def skip(name, why):
    print(f"SKIP {name}: {why}", flush=True)


def mpirun(binary, args, ranks=2, env=ENV, mpirun_args=()):
    cmd = ["mpirun", "--oversubscribe", *mpirun_args, "-np", str(ranks), binary] + args
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIME_LIMIT)
    except subprocess.TimeoutExpired as e:
        return None, (e.stdout or b"").decode() + (e.stderr or b"").decode(), TIME_LIMIT
    return p.returncode, p.stdout + p.stderr, time.monotonic() - start


def expect_error(name, binary, args, *needles):
    rc, out, seconds = mpirun(binary, args)
    ours = [l for l in out.splitlines() if l.startswith("mqaserve")]
    check(f"{name}: exits non-zero within {TIME_LIMIT} s", rc not in (None, 0),
          f"rc {rc} after {seconds:.1f} s; output:\n{out}")
    check(f"{name}: one line from rank 0", len(ours) == 1 and ours[0].startswith("mqaserve: error: "),
          f"mqaserve's lines: {ours}")
    check(f"{name}: the line names the problem",
          len(ours) == 1 and all(n in ours[0] for n in needles), f"want {needles} in {ours}")
    check(f"{name}: no MPI_Abort banner", "MPI_ABORT" not in out, out)
    return out


def copy_model(src, dst):
    shutil.copytree(src, dst)
    return dst


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    binary, model = (os.path.abspath(a) for a in sys.argv[1:])
    gen = ["generate", "--prompt", "def f(", "--max-tokens", "2"]
    with tempfile.TemporaryDirectory(prefix="mqa-startup-") as tmp:
        missing = os.path.join(tmp, "no-such-model")
        expect_error("model folder missing", binary, gen + ["--model", missing],
                     missing, "does not exist")

        not_folder = os.path.join(model, "config.json")
        expect_error("model path is a file", binary, gen + ["--model", not_folder],
                     not_folder, "is not a folder")

        no_config = copy_model(model, os.path.join(tmp, "no-config"))
        os.remove(os.path.join(no_config, "config.json"))
        expect_error("model folder without config.json", binary, gen + ["--model", no_config],
                     "has no config.json")

        unreadable = copy_model(model, os.path.join(tmp, "unreadable"))
        config = os.path.join(unreadable, "config.json")
        if os.geteuid() == 0:
            # Root reads any file whatever its mode; a folder in config.json's place cannot be read.
            os.rename(config, config + ".orig")
            os.mkdir(config)
            expect_error("config.json unreadable", binary, gen + ["--model", unreadable],
                         config, "not a readable file")
        else:
            os.chmod(unreadable, 0)
            expect_error("model folder unreadable", binary, gen + ["--model", unreadable],
                         unreadable, "not readable")
            os.chmod(unreadable, 0o755)

        truncated = copy_model(model, os.path.join(tmp, "truncated"))
        weights = os.path.join(truncated, "model.safetensors")
        with open(weights, "r+b") as f:
            f.truncate(os.path.getsize(weights) // 2)
        expect_error("checkpoint truncated (fails while loading, on every rank)", binary,
                     gen + ["--model", truncated], "model.safetensors")

        # 3 heads cannot be split over 2 ranks. Dummy weights: the check comes before any load.
        odd = os.path.join(tmp, "three-heads")
        os.mkdir(odd)
        with open(os.path.join(model, "config.json")) as f:
            cfg = json.load(f)
        cfg.update(n_head=3, n_embd=192)
        with open(os.path.join(odd, "config.json"), "w") as f:
            json.dump(cfg, f)
        shutil.copy(os.path.join(model, "tokenizer.json"), odd)
        expect_error("tensor-parallel size does not divide the heads", binary,
                     gen + ["--model", odd, "--load-format", "dummy"],
                     "--tensor-parallel-size 2", "n_head (3)")

        expect_error("--tensor-parallel-size differs from the world size", binary,
                     gen + ["--model", model, "--tensor-parallel-size", "4"],
                     "--tensor-parallel-size 4", "MPI ranks (2)")

        has_gpu = shutil.which("nvidia-smi") and subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip()
        if has_gpu:
            skip("--device cuda without a GPU", "this machine has a GPU")
        else:
            expect_error("--device cuda without a GPU", binary,
                         gen + ["--model", model, "--device", "cuda"],
                         "--device cuda", "no CUDA device")

        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        broken_template = os.path.join(tmp, "broken.jinja")
        with open(broken_template, "w") as f:
            f.write("{% for m in messages %}{{ m.content }}\n")
        expect_error("chat template that does not parse", binary,
                     ["serve", "--model", model, "--device", "cpu", "--port", str(port),
                      "--chat-template", broken_template],
                     broken_template, "{% for %} without {% endfor %}")

        # generation_config.json: a field the server would apply to every request, of the wrong
        # type; an end-of-sequence id outside the vocabulary.
        for label, field, value in (("temperature of the wrong type", "temperature", "warm"),
                                    ("eos_token_id outside the vocabulary", "eos_token_id",
                                     [0, 10**6])):
            bad_generation = copy_model(model, os.path.join(tmp, f"generation-{field}"))
            path = os.path.join(bad_generation, "generation_config.json")
            with open(path, "w") as f:
                json.dump({"eos_token_id": 0, field: value}, f)
            expect_error(f"generation_config.json with {label}", binary,
                         ["serve", "--model", bad_generation, "--device", "cpu", "--port",
                          str(port)], path, f'"{field}"')

        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            rc, out, _ = mpirun(binary, ["serve", "--model", model, "--host", "127.0.0.1",
                                         "--port", str(port)])
            if "HTTP endpoint is not there yet" in out:
                skip("port in use", "`mqaserve serve` is not wired yet (Unimplemented)")
            else:
                expect_error("port in use", binary,
                             ["serve", "--model", model, "--host", "127.0.0.1", "--port",
                              str(port)], f"127.0.0.1:{port}", "in use")

        # TLS settings are checked before the checkpoint loads: a key that is not the
        # certificate's, a missing file, a certificate without its key.
        tls = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "runtime", "http",
                           "tls")
        tls = os.path.normpath(tls)
        serve = ["serve", "--model", model, "--device", "cpu", "--host", "127.0.0.1", "--port", "0"]
        cert, wrong_key = os.path.join(tls, "server.pem"), os.path.join(tls, "client-key.pem")
        expect_error("TLS key of another certificate", binary,
                     serve + ["--ssl-certfile", cert, "--ssl-keyfile", wrong_key],
                     wrong_key, "does not match")
        missing_key = os.path.join(tmp, "no-such-key.pem")
        expect_error("TLS key missing", binary,
                     serve + ["--ssl-certfile", cert, "--ssl-keyfile", missing_key], missing_key)
        expect_error("TLS certificate without its key", binary, serve + ["--ssl-certfile", cert],
                     "--ssl-keyfile")

    # Load progress: with a 0 s interval every tensor is reported, per rank, with bytes and count.
    # Each rank's stderr is read from its own file (mpirun --output-filename): mpirun's merged
    # stream may splice one rank's line into the middle of another's.
    with tempfile.TemporaryDirectory(prefix="mqa-progress-") as logs:
        rc, out, _ = mpirun(binary, gen + ["--model", model],
                            env=dict(ENV, MQASERVE_PROGRESS_INTERVAL="0"),
                            mpirun_args=("--output-filename", logs))
        rank_err = {}
        for r in (0, 1):
            path = os.path.join(logs, "1", f"rank.{r}", "stderr")
            rank_err[r] = open(path).read() if os.path.exists(path) else ""
    check("load progress: the job succeeds", rc == 0, out)
    for r in (0, 1):
        own = rank_err[r].splitlines()
        lines = [l for l in own if f"rank {r}/2 " in l and "loading weights:" in l]
        loaded = [l for l in own if f"rank {r}/2 " in l and ": loaded " in l]
        counts = [int(l.split(" tensors")[0].rsplit(" ", 1)[1].split("/")[0]) for l in lines]
        check(f"load progress: rank {r} reports every tensor in order",
              counts and counts == list(range(1, len(counts) + 1)), "\n".join(lines))
        last = lines[-1] if lines else ""
        mib = last.split("loading weights: ")[1].split(" MiB")[0] if last else "?"
        check(f"load progress: rank {r}'s last report matches its loaded line",
              len(loaded) == 1 and f"({mib} MiB in {counts[-1] if counts else '?'} tensors" in
              loaded[0], f"{last!r} vs {loaded}")
    rc, out, _ = mpirun(binary, gen + ["--model", model])
    check("load progress: silent for a load shorter than the default 2 s interval",
          rc == 0 and "loading weights:" not in out, out)

    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
