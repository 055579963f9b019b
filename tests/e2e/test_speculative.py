"""Speculative decoding (--speculative-config, prompt lookup) through a real 2-rank server: greedy
completions, and seeded sampled ones (speculation keeps a draft exactly when the draw at its
position equals it), equal those of `mqaserve generate` without speculation, plain and streamed,
and the demo model's Python repeats itself enough for drafts to be accepted (the metrics say how
many).

See conftest.py for how the server is found or started; MQA_BINARY and MQA_MODEL name the binary
and model the reference runs with.
"""

import os
import subprocess

import openai

from test_api import client, metric

PROMPTS = [
    "def fibonacci(n):\n    ",
    "import os\n\ndef list_files(path):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "for i in range(10):\n    print(i)\nfor i in range(10):\n",
]
MAX_TOKENS = 64


def reference(prompt, *sampling):
    """The completion without speculation (greedy unless `sampling` says otherwise): one rank,
    `mqaserve generate`."""
    out = subprocess.run(
        [os.environ["MQA_BINARY"], "generate", "--model", os.environ["MQA_MODEL"], "--prompt",
         prompt, "--max-tokens", str(MAX_TOKENS), "--temperature", "0", *sampling],
        check=True, capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith(prompt) and out.stdout.endswith("\n")
    return out.stdout[len(prompt):-1]


def test_greedy_completions_equal_those_without_speculation(server):
    c = client(server)
    drafts_before = metric(server, "mqaserve_spec_decode_num_draft_tokens_total")
    accepted_before = metric(server, "mqaserve_spec_decode_num_accepted_tokens_total")
    for prompt in PROMPTS:
        want = reference(prompt)
        got = c.completions.create(model=server.model, prompt=prompt, max_tokens=MAX_TOKENS,
                                   temperature=0)
        assert got.choices[0].text == want, prompt
        streamed = "".join(
            chunk.choices[0].text
            for chunk in c.completions.create(model=server.model, prompt=prompt,
                                              max_tokens=MAX_TOKENS, temperature=0, stream=True)
            if chunk.choices)
        assert streamed == want, prompt
    drafts = metric(server, "mqaserve_spec_decode_num_draft_tokens_total") - drafts_before
    accepted = metric(server, "mqaserve_spec_decode_num_accepted_tokens_total") - accepted_before
    print(f"drafts {drafts:.0f}, accepted {accepted:.0f}")
    assert drafts > 0 and 0 < accepted <= drafts


def test_seeded_sampled_completions_equal_those_without_speculation(server):
    c = client(server)
    accepted_before = metric(server, "mqaserve_spec_decode_num_accepted_tokens_total")
    for i, prompt in enumerate(PROMPTS):
        seed = 11 + i
        want = reference(prompt, "--temperature", "0.3", "--top-p", "0.95", "--sample-seed",
                         str(seed))
        got = c.completions.create(model=server.model, prompt=prompt, max_tokens=MAX_TOKENS,
                                   temperature=0.3, top_p=0.95, seed=seed)
        assert got.choices[0].text == want, prompt
    accepted = metric(server, "mqaserve_spec_decode_num_accepted_tokens_total") - accepted_before
    print(f"sampled: accepted {accepted:.0f}")
    assert accepted > 0


def test_sampled_and_penalised_requests_still_serve(server):
    c = client(server)
    sampled = c.completions.create(model=server.model, prompt=PROMPTS[0], max_tokens=16,
                                   temperature=0.8, seed=3, n=2)
    assert len(sampled.choices) == 2
    penalised = c.completions.create(model=server.model, prompt=PROMPTS[1], max_tokens=16,
                                     temperature=0, frequency_penalty=0.5)
    assert penalised.usage.completion_tokens > 0
    try:
        c.completions.create(model=server.model, prompt=PROMPTS[0], max_tokens=16, top_p=2.0)
        assert False, "top_p 2 accepted"
    except openai.BadRequestError:
        pass
