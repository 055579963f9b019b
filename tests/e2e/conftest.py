"""End-to-end fixtures: a real mqaserve server, talked to over HTTP.

Environment:
  MQA_SERVER_URL   base URL of the server (default http://127.0.0.1:8000).
  MQA_SERVER_CMD   shell command that starts the server on that URL (or, when it holds "{port}",
                   on a free port of 127.0.0.1 put there), e.g.
                   "mpirun -np 2 build/bin/mqaserve --model models/demo --device cpu --port 8000".
                   Started once per session in its own process group, waited for until /health
                   answers 200, and stopped with SIGTERM at the end (SIGKILL after a grace period).
                   Unset: the server at MQA_SERVER_URL must already be running.
  MQA_SERVER_START_TIMEOUT  seconds to wait for /health (default 300).
  MQA_API_KEY      the server's --api-key, if it has one.
  MQA_SERVER_CA    the CA (PEM) that signed the server's --ssl-certfile: the server speaks HTTPS
                   ("{port}" URLs are https://), and clients verify it against this CA.
When neither MQA_SERVER_CMD is set nor a server answers at the URL, the tests are skipped.
"""

import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import pytest


def ssl_context():
    """The client TLS context for MQA_SERVER_CA (None: plain HTTP)."""
    ca = os.environ.get("MQA_SERVER_CA")
    return ssl.create_default_context(cafile=ca) if ca else None


def _health(url, timeout=2.0):
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout,
                                    context=ssl_context()) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return None


class Server:
    """What the tests need to know about the server under test."""

    def __init__(self, url, api_key):
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.model = self.get_json("/v1/models")["data"][0]["id"]

    def headers(self):
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        return headers

    def request(self, method, path, body=None, headers=None, raw=None):
        """Returns (status, body bytes); HTTP errors are returned, not raised."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers=headers if headers is not None else self.headers())
        try:
            with urllib.request.urlopen(req, timeout=120, context=ssl_context()) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def get_json(self, path):
        status, body = self.request("GET", path)
        assert status == 200, (path, status, body)
        return json.loads(body)

    def post_json(self, path, body):
        status, raw = self.request("POST", path, body)
        return status, json.loads(raw)

    def metrics_text(self):
        status, body = self.request("GET", "/metrics", headers={})
        assert status == 200
        return body.decode()


@pytest.fixture(scope="session")
def server():
    url = os.environ.get("MQA_SERVER_URL", "http://127.0.0.1:8000").rstrip("/")
    api_key = os.environ.get("MQA_API_KEY", "")
    command = os.environ.get("MQA_SERVER_CMD")
    process = None
    # With "{port}", a port the kernel reports free is put in; another process (a parallel test's
    # MPI ranks open ephemeral ports too) can take it before the server binds it, so a server
    # that exits before it is healthy is started again on a new port, up to three times.
    attempts = 3 if command and "{port}" in command else 1
    for attempt in range(attempts):
        if not command:
            break
        run = command
        if "{port}" in command:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            run = command.replace("{port}", str(port))
            scheme = "https" if os.environ.get("MQA_SERVER_CA") else "http"
            url = f"{scheme}://127.0.0.1:{port}"
        process = subprocess.Popen(run, shell=True, start_new_session=True)
        deadline = time.monotonic() + float(os.environ.get("MQA_SERVER_START_TIMEOUT", "300"))
        while _health(url) != 200:
            if process.poll() is not None:
                break
            if time.monotonic() > deadline:
                os.killpg(process.pid, signal.SIGKILL)
                pytest.fail(f"server did not become healthy at {url}: {run}")
            time.sleep(0.5)
        if process.poll() is None:
            break
        if attempt + 1 == attempts:
            pytest.fail(f"server command exited with {process.returncode}: {run}")
        print(f"server exited with {process.returncode} on {url}; starting it on a new port")
    if not command and _health(url) != 200:
        pytest.skip(f"no server at {url} and MQA_SERVER_CMD is not set")
    try:
        yield Server(url, api_key)
    finally:
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
