#!/usr/bin/env python3
"""A real Slurm cluster, no mocks: mqaserve launched by sbatch + srun --mpi=pmix, 2 ranks, CPU.

    slurm_test.py MQASERVE MODEL_DIR

Starts (installing it first if needed) the one-node cluster of scripts/slurm-setup.sh, then:
  1. generate: a 2-task job runs `srun mqaserve generate`; it must complete (state COMPLETED, exit
     0:0), print the same greedy text as a single process, and show that both ranks took their rank
     and node-local rank from MPI (rank 0/2 local 0/2, rank 1/2 local 1/2).
  2. serve: examples/slurm/mqaserve-cpu.sbatch as users submit it; the job's output must name the
     address rank 0 listens on, /health must turn 200, a /v1/completions request must return the
     same greedy text; then `scancel` must end every rank (their pids gone, both ranks log that
     they stopped) and leave the job CANCELLED.
  3. start-up error: the same example with a missing model folder must end FAILED, non-zero,
     with one `mqaserve: error:` line from rank 0.
Everything is bounded in time; jobs are cancelled and the daemons this test started are stopped
on the way out. Exit 0 when all checks pass, 1 otherwise, 77 (skipped) when Slurm cannot be set up
here (not root).
"""
import fcntl
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SETUP = os.path.join(REPO, "scripts", "slurm-setup.sh")
EXAMPLE = os.path.join(REPO, "examples", "slurm", "mqaserve-cpu.sbatch")
PROMPT = "def f("
MAX_TOKENS = 8
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE"}

results = []  # (name, ok, detail)


def check(name, ok, detail=""):
    results.append((name, bool(ok), detail))
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + detail), flush=True)
    return ok


def run(cmd, env=None, timeout=60, check_rc=True):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if check_rc and p.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {p.returncode}:\n{p.stdout}{p.stderr}")
    return p


def job_fields(job, env):
    """scontrol's one-line record of a job as a dict (kept MinJobAge s after the job ends)."""
    p = run(["scontrol", "show", "job", "-o", str(job)], env=env, check_rc=False)
    fields = {}
    for token in p.stdout.split():
        key, sep, value = token.partition("=")
        if sep:
            fields.setdefault(key, value)
    return fields


def wait_state(job, env, states, timeout):
    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        state = job_fields(job, env).get("JobState")
        if state in states:
            return state
        time.sleep(0.5)
    return state


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, timeout=30):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def rank_pids(job, env):
    """{global rank: pid} of the job's step 0 (its srun-launched ranks), from scontrol listpids."""
    p = run(["scontrol", "listpids", str(job)], env=env, check_rc=False)
    pids = {}
    for line in p.stdout.splitlines()[1:]:
        cols = line.split()
        if len(cols) == 5 and cols[2] == "0" and cols[4].isdigit():
            pids[int(cols[4])] = int(cols[0])
    return pids


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie has ended; only its parent has not collected it yet.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def reference_text(mqaserve, model):
    """The greedy completion of one process (no launcher): what both jobs must reproduce."""
    p = run([mqaserve, "generate", "--model", model, "--prompt", PROMPT,
             "--max-tokens", str(MAX_TOKENS)], timeout=120)
    out = p.stdout
    if not out.startswith(PROMPT):
        raise RuntimeError(f"mqaserve generate printed {out!r}, not the prompt first")
    return out[len(PROMPT):].rstrip("\n")


def generate_job(mqaserve, model, env, tmp, expected, jobs):
    script = os.path.join(tmp, "generate.sbatch")
    with open(script, "w") as f:
        f.write("#!/bin/bash\n#SBATCH --ntasks=2\n#SBATCH --time=00:05:00\n"
                "export OPENBLAS_NUM_THREADS=1\n"
                f"exec srun --mpi=pmix --kill-on-bad-exit=1 {shlex.quote(mqaserve)} generate "
                f"--model {shlex.quote(model)} --prompt {shlex.quote(PROMPT)} "
                f"--max-tokens {MAX_TOKENS} --tensor-parallel-size 2\n")
    out = os.path.join(tmp, "generate-%j.out")  # the completion (stdout)
    err = os.path.join(tmp, "generate-%j.err")  # the ranks' logs
    job = run(["sbatch", "--parsable", f"--output={out}", f"--error={err}", f"--chdir={REPO}",
               script], env=env).stdout.strip().split(";")[0]
    jobs.append(job)
    state = wait_state(job, env, TERMINAL, 180)
    fields = job_fields(job, env)
    completion = read(out.replace("%j", job))
    text = read(err.replace("%j", job))
    check("generate job completes", state == "COMPLETED" and fields.get("ExitCode") == "0:0",
          f"state {state}, exit {fields.get('ExitCode')}; output:\n{completion}{text}")
    check("generate job prints the single-process greedy text",
          completion == PROMPT + expected + "\n", f"want {PROMPT + expected!r}, got {completion!r}")
    for r in (0, 1):
        check(f"generate job: rank {r} took rank and local rank from MPI",
              re.search(rf"rank {r}/2 on \S+ \(local {r}/2\)", text), text)


def serve_job(mqaserve, model, env, tmp, expected, jobs):
    port = free_port()
    out = os.path.join(tmp, "serve-%j.out")
    job_env = dict(env, MQASERVE=mqaserve, MQASERVE_MODEL=model, MQASERVE_HOST="127.0.0.1",
                   MQASERVE_PORT=str(port))
    job = run(["sbatch", "--parsable", f"--output={out}", f"--chdir={REPO}", "--time=00:10:00",
               EXAMPLE], env=job_env).stdout.strip().split(";")[0]
    jobs.append(job)
    out = out.replace("%j", job)
    base = f"http://127.0.0.1:{port}"

    # Up: /health 200 within the deadline (or the job ended: then its output says why).
    deadline = time.monotonic() + 180
    healthy = False
    while time.monotonic() < deadline and not healthy:
        state = job_fields(job, env).get("JobState")
        if state in TERMINAL:
            break
        try:
            healthy = http("GET", base + "/health", timeout=2)[0] == 200
        except (urllib.error.URLError, OSError):
            pass
        if not healthy:
            time.sleep(0.5)
    if not check("serve job: /health turns 200", healthy,
                 f"job state {job_fields(job, env).get('JobState')}; output:\n{read(out)}"):
        return
    text = read(out)
    check("serve job: rank 0 logs the address it listens on",
          re.search(rf"mqaserve: .*http://(127\.0\.0\.1|{re.escape(socket.gethostname())}):{port}\b",
                    text), text)
    check("serve job: the job output names the node and port",
          re.search(rf"rank 0 will listen on \S+:{port}\b", text), text)

    status, body = http("GET", base + "/v1/models")
    model_id = json.loads(body)["data"][0]["id"] if status == 200 else "demo"
    status, body = http("POST", base + "/v1/completions",
                        {"model": model_id, "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                         "temperature": 0})
    got = json.loads(body)["choices"][0]["text"] if status == 200 else None
    check("serve job: /v1/completions returns the single-process greedy text",
          status == 200 and got == expected, f"status {status}, body {body}, want {expected!r}")

    pids = rank_pids(job, env)
    check("serve job: scontrol lists both ranks' pids", sorted(pids) == [0, 1], str(pids))
    run(["scancel", job], env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(alive(p) for p in pids.values()):
        time.sleep(0.2)
    state = wait_state(job, env, TERMINAL, max(1, deadline - time.monotonic()))
    text = read(out)
    check("serve job: scancel ends every rank",
          pids and not any(alive(p) for p in pids.values()),
          f"still running: {[r for r, p in pids.items() if alive(p)]}")
    check("serve job: state CANCELLED after scancel", state == "CANCELLED", f"state {state}")
    for r in (0, 1):
        check(f"serve job: rank {r} stopped cleanly on SIGTERM",
              re.search(rf"rank {r}/2 on \S+ \(local {r}/2\): stopped", text), text)
    try:
        http("GET", base + "/health", timeout=2)
        check("serve job: the endpoint is gone after scancel", False, "still answers")
    except (urllib.error.URLError, OSError):
        check("serve job: the endpoint is gone after scancel", True)


def startup_error_job(mqaserve, env, tmp, jobs):
    """The example job with a model folder that does not exist: the job must fail fast with one
    line from rank 0 and a non-zero exit code."""
    missing = os.path.join(tmp, "no-such-model")
    out = os.path.join(tmp, "error-%j.out")
    job_env = dict(env, MQASERVE=mqaserve, MQASERVE_MODEL=missing, MQASERVE_HOST="127.0.0.1",
                   MQASERVE_PORT=str(free_port()))
    job = run(["sbatch", "--parsable", f"--output={out}", f"--chdir={REPO}", "--time=00:05:00",
               EXAMPLE], env=job_env).stdout.strip().split(";")[0]
    jobs.append(job)
    state = wait_state(job, env, TERMINAL, 120)
    fields = job_fields(job, env)
    text = read(out.replace("%j", job))
    ours = [l for l in text.splitlines() if l.startswith("mqaserve")]
    check("start-up error job: FAILED with a non-zero exit code",
          state == "FAILED" and fields.get("ExitCode", "0:0") != "0:0",
          f"state {state}, exit {fields.get('ExitCode')}")
    check("start-up error job: one line from rank 0 names the missing folder",
          len(ours) == 1 and ours[0].startswith("mqaserve: error: ") and missing in ours[0],
          text)


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    mqaserve, model = (os.path.abspath(a) for a in sys.argv[1:])
    if os.geteuid() != 0 and subprocess.run([SETUP, "status"]).returncode != 0:
        print("SKIP: needs root to install and start Slurm (scripts/slurm-setup.sh)")
        return 77
    # One run at a time on a machine: another run's `stop` would end this run's jobs.
    lock = open(os.path.join(tempfile.gettempdir(), "mqa-slurm-test.lock"), "w")
    deadline = time.monotonic() + 600
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                check("another Slurm test run ended in time", False, "waited 600 s for its lock")
                return 1
            time.sleep(1)
    was_running = subprocess.run([SETUP, "status"]).returncode == 0
    jobs = []
    env = dict(os.environ)
    env["SLURM_CONF"] = run([SETUP, "env"]).stdout.strip().split("=", 1)[1]
    try:
        run([SETUP, "start"], timeout=600)
        p = run(["srun", "--mpi=list"], env=env, check_rc=False)
        check("srun offers the pmix plugin", "pmix" in p.stdout + p.stderr, p.stdout + p.stderr)
        expected = reference_text(mqaserve, model)
        with tempfile.TemporaryDirectory(prefix="mqa-slurm-test-") as tmp:
            os.chmod(tmp, 0o755)
            generate_job(mqaserve, model, env, tmp, expected, jobs)
            serve_job(mqaserve, model, env, tmp, expected, jobs)
            startup_error_job(mqaserve, env, tmp, jobs)
    except Exception as e:  # a broken step is a failure with its message, never a hang
        check("no unexpected error", False, f"{type(e).__name__}: {e}")
    finally:
        for job in jobs:
            if job_fields(job, env).get("JobState") not in TERMINAL:
                subprocess.run(["scancel", job], env=env)
        if not was_running:
            subprocess.run([SETUP, "stop"])
    failed = sum(1 for _, ok, _ in results if not ok)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
