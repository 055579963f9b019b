"""HTTPS end to end: `mqaserve --ssl-certfile / --ssl-keyfile` talked to by the `openai` client
over TLS, verifying the server against the test CA (MQA_SERVER_CA); a client that does not trust
that CA, and one speaking plain HTTP, get nothing."""

import os
import ssl
import urllib.error
import urllib.request

import openai
import pytest


def openai_client(server, verify):
    """An OpenAI client whose HTTP client verifies the server with `verify` (an SSLContext)."""
    make = getattr(openai, "DefaultHttpx2Client", None) or openai.DefaultHttpxClient
    return openai.OpenAI(base_url=server.url + "/v1", api_key=server.api_key or "none",
                         http_client=make(verify=verify), max_retries=0)


def test_completion_and_stream_over_https(server):
    assert server.url.startswith("https://")
    client = openai_client(server, ssl.create_default_context(cafile=os.environ["MQA_SERVER_CA"]))
    done = client.completions.create(model=server.model, prompt="def fib(n):", max_tokens=8,
                                     temperature=0)
    assert done.usage.completion_tokens == 8
    streamed = "".join(
        chunk.choices[0].text
        for chunk in client.completions.create(model=server.model, prompt="def fib(n):",
                                               max_tokens=8, temperature=0, stream=True)
        if chunk.choices)
    assert streamed == done.choices[0].text


def test_untrusted_or_plain_clients_get_nothing(server):
    untrusting = openai_client(server, ssl.create_default_context())  # the system's CAs only
    with pytest.raises(openai.APIConnectionError):
        untrusting.completions.create(model=server.model, prompt="x", max_tokens=1)
    plain = server.url.replace("https://", "http://") + "/health"
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(plain, timeout=10).read()
