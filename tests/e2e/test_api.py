"""The OpenAI-compatible API of a real mqaserve server, through the `openai` package and raw HTTP.

See conftest.py for how the server is found or started.
"""

import asyncio
import http.client
import json
import time
import urllib.parse

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

PROMPTS = [
    "def fibonacci(n):\n    ",
    "import os\n\ndef list_files(path):\n",
    "class Stack:\n    def __init__(self):\n        ",
]


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=server.api_key or "unused",
                         max_retries=0)


def metric_samples(server):
    """{(name, frozenset(labels)): value} of every sample on /metrics."""
    samples = {}
    for family in text_string_to_metric_families(server.metrics_text()):
        for sample in family.samples:
            labels = frozenset((k, v) for k, v in sample.labels.items() if k != "model_name")
            samples[(sample.name, labels)] = sample.value
    return samples


def metric(server, name, **labels):
    return metric_samples(server)[(name, frozenset(labels.items()))]


def wait_idle(server, limit=1.0):
    """Seconds until no request runs or waits and the KV cache is empty; None past `limit`."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        samples = metric_samples(server)
        if (samples[("mqaserve_kv_cache_usage_perc", frozenset())] == 0
                and samples[("mqaserve_num_requests_running", frozenset())] == 0
                and samples[("mqaserve_num_requests_waiting", frozenset())] == 0):
            return time.monotonic() - start
        time.sleep(0.02)
    return None


def test_health_and_models(server):
    status, _ = server.request("GET", "/health", headers={})
    assert status == 200
    models = client(server).models.list()
    assert [m.id for m in models.data] == [server.model]


def test_plain_and_streamed_greedy_completions_agree(server):
    c = client(server)
    for prompt in PROMPTS:
        plain = c.completions.create(model=server.model, prompt=prompt, max_tokens=24,
                                     temperature=0, extra_body={"return_token_ids": True})
        choice = plain.choices[0]
        assert choice.finish_reason in ("stop", "length")
        assert plain.usage.completion_tokens == len(choice.token_ids) > 0
        assert plain.usage.prompt_tokens == len(choice.prompt_token_ids)
        assert plain.usage.total_tokens == plain.usage.prompt_tokens + plain.usage.completion_tokens

        text, finish, usage = "", None, None
        stream = c.completions.create(model=server.model, prompt=prompt, max_tokens=24,
                                      temperature=0, stream=True,
                                      stream_options={"include_usage": True})
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for streamed in chunk.choices:
                text += streamed.text
                finish = streamed.finish_reason or finish
        assert text == choice.text
        assert finish == choice.finish_reason
        assert usage is not None and usage.completion_tokens == plain.usage.completion_tokens


def test_list_prompts_with_n(server):
    response = client(server).completions.create(
        model=server.model, prompt=PROMPTS[:2], n=2, max_tokens=8, temperature=0.8, seed=7)
    assert sorted(c.index for c in response.choices) == [0, 1, 2, 3]
    assert all(c.finish_reason in ("stop", "length") for c in response.choices)
    # Token-id prompts give the same seeded samples as the text they encode.
    ids = [server.post_json("/tokenize", {"prompt": p})[1]["tokens"] for p in PROMPTS[:2]]
    again = client(server).completions.create(
        model=server.model, prompt=ids, n=2, max_tokens=8, temperature=0.8, seed=7)
    by_index = {c.index: c.text for c in response.choices}
    assert {c.index: c.text for c in again.choices} == by_index


def test_tokenize_detokenize_round_trip(server):
    text = "for i in range(10):\n    print(i)  # ünïcode ✓"
    status, tokens = server.post_json("/tokenize", {"prompt": text})
    assert status == 200
    assert tokens["count"] == len(tokens["tokens"]) > 0
    assert tokens["max_model_len"] > 0
    status, back = server.post_json("/detokenize", {"tokens": tokens["tokens"]})
    assert status == 200 and back["prompt"] == text


def test_infill(server):
    status, body = server.post_json("/v1/infill", {
        "input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n\nprint(add(1, 2))\n",
        "max_tokens": 8, "temperature": 0})
    assert status == 200, body
    assert body["choices"][0]["finish_reason"] in ("stop", "length")


def test_completion_suffix_is_the_infill(server):
    # OpenAI's insertion form, through the OpenAI client: the prompt is the prefix, the suffix
    # follows the completion; the same FIM prompt as /v1/infill.
    prefix, suffix = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"
    completion = client(server).completions.create(model=server.model, prompt=prefix,
                                                   suffix=suffix, max_tokens=8, temperature=0)
    status, infill = server.post_json("/v1/infill", {
        "input_prefix": prefix, "input_suffix": suffix, "max_tokens": 8, "temperature": 0})
    assert status == 200, infill
    assert completion.choices[0].text == infill["choices"][0]["text"]
    assert completion.usage.prompt_tokens == infill["usage"]["prompt_tokens"]


def test_logit_bias_through_the_openai_client(server):
    status, tokens = server.post_json("/tokenize", {"prompt": " x"})
    assert status == 200, tokens
    forced = tokens["tokens"][0]
    status, detok = server.post_json("/detokenize", {"tokens": [forced] * 4})
    assert status == 200, detok
    completion = client(server).completions.create(
        model=server.model, prompt="def f(", max_tokens=4, temperature=0,
        logit_bias={str(forced): 100}, extra_body={"ignore_eos": True})
    assert completion.choices[0].text == detok["prompt"]


def test_guided_choice_and_regex(server):
    """Guided decoding: the text is one of the choices / matches the pattern in full, and the
    sample stops by itself; streamed too, through chat and TGI's grammar, sampled with n = 3 and
    with a logit bias pushing against the pattern. A pattern the server cannot compile is a 400
    and the server keeps serving."""
    import re
    c = client(server)
    choices = ["yes", "no", "def main():"]
    for temperature in (0, 1.0):
        got = c.completions.create(model=server.model, prompt="import os\n", max_tokens=16,
                                   temperature=temperature, seed=5, n=3,
                                   extra_body={"guided_choice": choices})
        for choice in got.choices:
            assert choice.text in choices, choice.text
            assert choice.finish_reason == "stop"
    pattern = r"[0-9]{3}-[a-z]+( [a-z]+)?"
    for temperature in (0, 0.8):
        got = c.completions.create(model=server.model, prompt="x = ", max_tokens=24,
                                   temperature=temperature, seed=1,
                                   extra_body={"guided_regex": pattern})
        text = got.choices[0].text
        assert re.fullmatch(pattern, text) or (got.choices[0].finish_reason == "length" and
                                              re.fullmatch(r"[0-9]{0,3}(-[a-z]*( [a-z]*)?)?", text)), text
    streamed = "".join(
        chunk.choices[0].text
        for chunk in c.completions.create(model=server.model, prompt="x = ", max_tokens=8,
                                          temperature=0, stream=True,
                                          extra_body={"guided_regex": "(True|False|None)"})
        if chunk.choices)
    assert streamed in ("True", "False", "None"), streamed
    chat = c.chat.completions.create(model=server.model, max_tokens=8,
                                     messages=[{"role": "user", "content": "pick"}],
                                     extra_body={"guided_choice": ["left", "right"]})
    assert chat.choices[0].message.content in ("left", "right")
    chat = c.chat.completions.create(model=server.model, max_tokens=8, temperature=1.0, seed=3,
                                     messages=[{"role": "user", "content": "pick"}],
                                     extra_body={"structured_outputs": {"choice": ["up", "down"]}})
    assert chat.choices[0].message.content in ("up", "down")
    status, tgi = server.post_json("/generate", {
        "inputs": "n = ", "parameters": {"max_new_tokens": 8,
                                         "grammar": {"type": "regex", "value": "[1-9][0-9]?"}}})
    assert status == 200, tgi
    assert re.fullmatch(r"[1-9][0-9]?", tgi["generated_text"]), tgi
    status, forced = server.post_json("/tokenize", {"prompt": " x"})
    biased = c.completions.create(model=server.model, prompt="def f(", max_tokens=6,
                                  temperature=0, logit_bias={str(forced["tokens"][0]): 100},
                                  extra_body={"guided_choice": ["a", "b"]})
    assert biased.choices[0].text in ("a", "b")
    schema = {"type": "object", "required": ["color", "ok"],
              "properties": {"color": {"enum": ["red", "green"]}, "ok": {"type": "boolean"}}}
    for body in ({"guided_json": schema},
                 {"structured_outputs": {"json": schema}},  # vLLM >= 0.12's spelling
                 {"response_format": {"type": "json_schema",
                                      "json_schema": {"name": "c", "schema": schema}}}):
        got = c.completions.create(model=server.model, prompt="{", max_tokens=32, temperature=0.7,
                                   seed=2, n=2, extra_body=body)
        for choice in got.choices:
            assert choice.finish_reason == "stop", choice.text
            doc = json.loads(choice.text)
            assert list(doc) == ["color", "ok"], choice.text  # the schema's order
            assert doc["color"] in ("red", "green") and isinstance(doc["ok"], bool), choice.text
    # disable_any_whitespace: the same documents, no space between tokens (the enum's words hold
    # none either).
    for seed in range(4):
        tight = c.completions.create(
            model=server.model, prompt="{", max_tokens=32, temperature=1.0, seed=seed,
            extra_body={"structured_outputs": {"json": schema, "disable_any_whitespace": True}})
        assert tight.choices[0].finish_reason == "stop", tight.choices[0].text
        assert " " not in tight.choices[0].text, tight.choices[0].text
        assert list(json.loads(tight.choices[0].text)) == ["color", "ok"], tight.choices[0].text
    anything = c.completions.create(model=server.model, prompt="x", max_tokens=64, temperature=0,
                                    extra_body={"response_format": {"type": "json_object"}})
    if anything.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(anything.choices[0].text), dict)
    else:  # cut by max_tokens: a prefix of an object
        assert anything.choices[0].text.startswith("{"), anything.choices[0].text
    status, tgi = server.post_json("/generate", {
        "inputs": "x", "parameters": {"max_new_tokens": 16,
                                      "grammar": {"type": "json", "value": {"enum": [1, 2]}}}})
    assert status == 200 and tgi["generated_text"] in ("1", "2"), tgi
    for bad in ("(", "a{2}{3}", "(?=x)"):
        got, body = server.request("POST", "/v1/completions", raw=json.dumps(
            {"prompt": "x", "max_tokens": 2, "guided_regex": bad}).encode())
        assert got == 400, body[:300]
        assert "guided regex" in json.loads(body)["error"]["message"]
    ok = c.completions.create(model=server.model, prompt="x = ", max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length")



def test_guided_grammar(server):
    """vLLM's guided_grammar (GBNF): the text is a sentence of the grammar and the sample stops by
    itself, nested to any depth; json_object (now a grammar) nests deeper than three; a grammar
    the server cannot run is a 400 naming the problem."""
    import re
    c = client(server)
    calls = (r'root ::= call ("; " call){0,2}' "\n"
             r'call ::= name "(" (arg ("," " "? arg)*)? ")"' "\n"
             r'arg ::= [0-9]{1,3} | call' "\n"
             r'name ::= [a-z] [a-z_]{0,7}')
    flat = re.compile(r"[a-z][a-z_]{0,7}\((?:[^()]|\([^()]*\))*\)")
    for temperature in (0, 0.9):
        got = c.completions.create(model=server.model, prompt="result = ", max_tokens=48,
                                   temperature=temperature, seed=3, n=2,
                                   extra_body={"guided_grammar": calls})
        for choice in got.choices:
            text = choice.text
            assert text and re.fullmatch(r"[a-z][a-z_]{0,7}\(.*\)(; .*)?", text) or \
                choice.finish_reason == "length", text
            # Balanced parentheses, never closing more than opened.
            depth = 0
            for ch in text:
                depth += {"(": 1, ")": -1}.get(ch, 0)
                assert depth >= 0, text
            if choice.finish_reason == "stop":
                assert depth == 0, text
    deep = c.completions.create(model=server.model, prompt="x", max_tokens=40, temperature=0,
                                extra_body={"guided_grammar": 'root ::= "[" (root | [0-9]) "]"'})
    text = deep.choices[0].text
    assert re.fullmatch(r"\[*[0-9]?\]*", text) and text.count("[") >= text.count("]"), text
    if deep.choices[0].finish_reason == "stop":
        assert text.count("[") == text.count("]"), text
    for bad, message in (("root ::= x", "'x' is used but not defined"),
                         ("root ::= root \"a\" | \"b\"", "left-recursive"),
                         ("start ::= \"a\"", "no 'root' rule")):
        got, body = server.request("POST", "/v1/completions", raw=json.dumps(
            {"prompt": "x", "max_tokens": 2, "guided_grammar": bad}).encode())
        assert got == 400, body[:300]
        error = json.loads(body)["error"]
        assert message in error["message"] and error["param"] == "guided_grammar", error


def test_beam_search(server):
    """vLLM's use_beam_search through the OpenAI client: n distinct continuations, the best first
    (cumulative log-probability, scored again here with the server's own prompt_logprobs)."""
    c = client(server)
    got = c.completions.create(model=server.model, prompt="def fibonacci(n):\n", max_tokens=8,
                               n=3, extra_body={"use_beam_search": True, "length_penalty": 0.0,
                                                "return_token_ids": True})
    assert len(got.choices) == 3
    texts = [choice.text for choice in got.choices]
    assert len(set(texts)) == 3, texts
    prompt = server.post_json("/tokenize", {"prompt": "def fibonacci(n):\n"})[1]["tokens"]
    scores = []
    for choice in got.choices:
        ids = choice.model_extra["token_ids"]
        status, scored = server.post_json("/v1/completions", {
            "prompt": prompt + ids, "max_tokens": 1, "prompt_logprobs": 0})
        assert status == 200, scored
        entries = scored["choices"][0]["prompt_logprobs"][len(prompt):]
        scores.append(sum(next(iter(e.values()))["logprob"] for e in entries))
    # length_penalty 0: ranked by the cumulative log-probability itself.
    assert scores == sorted(scores, reverse=True), scores
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model=server.model, prompt="x", max_tokens=2,
                             extra_body={"use_beam_search": True, "logprobs": 1})


def test_llama_cpp_api(server):
    """llama.cpp's /completion and /infill as llama.vim sends them: a cache-warming call with
    n_predict 0, then a completion with a grammar and one through /infill with context chunks."""
    status, warm = server.post_json("/infill", {
        "input_prefix": "def add(a, b):\n    ", "input_suffix": "\n", "n_predict": 0,
        "input_extra": [{"filename": "util.py", "text": "import math\n"}], "cache_prompt": True,
        "samplers": ["top_k", "top_p", "infill"], "t_max_prompt_ms": 500})
    assert status == 200 and warm["content"] == "" and warm["tokens_predicted"] == 0, warm
    status, fim = server.post_json("/infill", {
        "input_prefix": "def add(a, b):\n    ", "input_suffix": "\n", "n_predict": 12,
        "input_extra": [{"filename": "util.py", "text": "import math\n"}], "top_k": 1})
    assert status == 200 and fim["stop"] is True, fim
    assert fim["tokens_predicted"] >= 1 and fim["tokens_evaluated"] > 0, fim
    status, done = server.post_json("/completion", {
        "prompt": "x = ", "n_predict": 6, "grammar": "root ::= [0-9]{1,4}"})
    assert status == 200 and done["content"].isdigit() and len(done["content"]) <= 4, done

def test_bad_words_never_complete(server):
    """vLLM's bad_words: the word's tokens (as is and after a space) never come out in sequence,
    where the same greedy completion without them does write the word."""
    prompt = "import os\nimport sys\nimport re\n"
    body = {"model": server.model, "prompt": prompt, "max_tokens": 24, "temperature": 0,
            "return_token_ids": True}
    status, plain = server.post_json("/v1/completions", body)
    assert status == 200, plain
    assert "import" in plain["choices"][0]["text"], plain  # otherwise the test shows nothing
    status, banned = server.post_json("/v1/completions", dict(body, bad_words=["import"]))
    assert status == 200, banned
    got = banned["choices"][0]["token_ids"]
    for text in ("import", " import"):
        status, tok = server.post_json("/tokenize", {"prompt": text})
        word = tok["tokens"]
        assert not any(got[i:i + len(word)] == word for i in range(len(got))), (text, banned)


def test_prompt_logprobs_agree_with_the_generated_ones(server):
    # lm-eval's loglikelihood request (token-id prompt, echo, logprobs 1, max_tokens 1) through
    # the OpenAI client: a greedy continuation's own log-probabilities, computed while decoding,
    # must come back when the prompt plus that continuation is scored as a prompt.
    c = client(server)
    status, tokens = server.post_json("/tokenize", {"prompt": PROMPTS[1]})
    assert status == 200, tokens
    ids = tokens["tokens"]
    generated = c.completions.create(model=server.model, prompt=[ids], max_tokens=4,
                                     temperature=0, logprobs=1,
                                     extra_body={"ignore_eos": True, "return_token_ids": True})
    continuation = generated.choices[0].token_ids
    decode_scores = generated.choices[0].logprobs.token_logprobs
    assert len(continuation) == 4 and len(decode_scores) == 4

    scored = c.completions.create(model=server.model, prompt=[ids + continuation], echo=True,
                                  logprobs=1, max_tokens=1, temperature=0)
    lp = scored.choices[0].logprobs
    assert len(lp.token_logprobs) == len(ids) + 4 + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x <= 0 for x in lp.token_logprobs[1:])
    for got, want in zip(lp.token_logprobs[len(ids):len(ids) + 4], decode_scores):
        assert got == pytest.approx(want, abs=1e-4)
    # Greedy tokens are their position's best: lm-eval's is_greedy test holds for them.
    for got, top in zip(lp.token_logprobs[len(ids):len(ids) + 4],
                        lp.top_logprobs[len(ids):len(ids) + 4]):
        assert got == pytest.approx(max(top.values()), abs=1e-6)

    # Scoring alone (max_tokens 0) and vLLM's prompt_logprobs give the same scores.
    only = c.completions.create(model=server.model, prompt=[ids + continuation], echo=True,
                                logprobs=0, max_tokens=0)
    assert only.usage.completion_tokens == 0
    assert len(only.choices[0].logprobs.token_logprobs) == len(ids) + 4
    for a, b in zip(only.choices[0].logprobs.token_logprobs[1:], lp.token_logprobs[1:-1]):
        assert a == pytest.approx(b, abs=1e-5)
    status, vllm = server.post_json("/v1/completions", {
        "model": server.model, "prompt": [ids + continuation], "prompt_logprobs": 0,
        "max_tokens": 1})
    assert status == 200, vllm
    positions = vllm["choices"][0]["prompt_logprobs"]
    assert positions[0] is None
    for i, token in enumerate(ids + continuation):
        if i == 0:
            continue
        entry = positions[i][str(token)]
        assert entry["logprob"] == pytest.approx(lp.token_logprobs[i], abs=1e-5)
        assert entry["rank"] >= 1


def test_triton_generate_as_tensorrt_llm_answers(server):
    # Triton's generate extension as TensorRT-LLM's models answer it (what its curl examples,
    # genai-perf and Triton clients send): greedy by default, the input excluded from the output.
    body = {"text_input": PROMPTS[0], "max_tokens": 8, "bad_words": "", "stop_words": "",
            "pad_id": 2, "end_id": 0, "return_log_probs": True}
    status, out = server.post_json("/v2/models/ensemble/generate", body)
    assert status == 200, out
    reference = client(server).completions.create(model=server.model, prompt=PROMPTS[0],
                                                  max_tokens=8, temperature=0, logprobs=0)
    assert out["model_name"] == "ensemble" and out["model_version"] == "1"
    assert out["text_output"] == reference.choices[0].text
    assert out["output_log_probs"] == pytest.approx(
        reference.choices[0].logprobs.token_logprobs, abs=1e-4)
    assert out["cum_log_probs"] == pytest.approx(sum(out["output_log_probs"]), abs=1e-3)
    status, raw = server.request("POST", "/v2/models/ensemble/generate_stream",
                                 dict(body, stream=True))
    assert status == 200
    pieces = [json.loads(line[len("data: "):]) for line in raw.decode().splitlines()
              if line.startswith("data: ")]
    assert "".join(p["text_output"] for p in pieces) == out["text_output"]
    status, error = server.post_json("/v2/models/ensemble/generate",
                                     {"text_input": "x", "max_tokens": 2, "beam_width": 4})
    assert status == 400 and "beam_width" in error["error"], error
    assert server.request("GET", "/v2/health/ready", headers={})[0] == 200


def test_tgi_api_through_huggingface_hub(server):
    # TGI's own client (what HF's code-completion plugins and Inference Endpoints users run)
    # against /, /generate_stream's events and TGI's error shape.
    from huggingface_hub import InferenceClient
    from huggingface_hub.errors import ValidationError

    hub = InferenceClient(model=server.url, token=server.api_key or None)
    text = hub.text_generation(PROMPTS[0], max_new_tokens=8)
    reference = client(server).completions.create(model=server.model, prompt=PROMPTS[0],
                                                  max_tokens=8, temperature=0)
    assert text == reference.choices[0].text

    out = hub.text_generation(PROMPTS[0], max_new_tokens=8, details=True,
                              decoder_input_details=True, top_n_tokens=2)
    assert out.generated_text == text
    assert out.details.finish_reason in ("length", "eos_token")
    assert out.details.generated_tokens == len(out.details.tokens) == reference.usage.completion_tokens
    assert len(out.details.prefill) == reference.usage.prompt_tokens
    assert out.details.prefill[0].logprob is None
    assert all(t.logprob <= 0 for t in out.details.tokens)
    assert all(len(top) == 2 for top in out.details.top_tokens)

    streamed = list(hub.text_generation(PROMPTS[0], max_new_tokens=8, stream=True, details=True))
    assert [e.token.id for e in streamed] == [t.id for t in out.details.tokens]
    assert streamed[-1].generated_text == text
    assert streamed[-1].details.finish_reason == out.details.finish_reason
    for event, token in zip(streamed, out.details.tokens):
        assert event.token.logprob == pytest.approx(token.logprob, abs=1e-5)

    seeded = hub.text_generation(PROMPTS[0], max_new_tokens=8, do_sample=True, seed=11,
                                 details=True)
    assert seeded.details.seed == 11
    again = hub.text_generation(PROMPTS[0], max_new_tokens=8, do_sample=True, seed=11)
    assert again == seeded.generated_text

    typical = hub.text_generation(PROMPTS[0], max_new_tokens=8, typical_p=0.5, seed=3,
                                 details=True)
    assert typical.details.seed == 3 and typical.details.generated_tokens >= 1
    with pytest.raises(ValidationError):
        hub.text_generation(PROMPTS[0], max_new_tokens=8, typical_p=1.5)
    status, info = server.request("GET", "/info")
    assert status == 200 and json.loads(info)["model_id"] == server.model


def test_chat_completions_through_the_openai_client(server):
    # The server runs with tests/e2e/chatml.jinja: a chat answer is the completion of the
    # rendered ChatML conversation, plain and streamed.
    c = client(server)
    messages = [{"role": "system", "content": "You write Python."},
                {"role": "user", "content": "def add(a, b):"}]
    chat = c.chat.completions.create(model=server.model, messages=messages, max_tokens=10,
                                     temperature=0)
    rendered = ("<|im_start|>system\nYou write Python.<|im_end|>\n"
                "<|im_start|>user\ndef add(a, b):<|im_end|>\n<|im_start|>assistant\n")
    plain = c.completions.create(model=server.model, prompt=rendered, max_tokens=10, temperature=0)
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == plain.choices[0].text
    assert chat.usage.prompt_tokens == plain.usage.prompt_tokens
    pieces = []
    for chunk in c.chat.completions.create(model=server.model, messages=messages, max_tokens=10,
                                           temperature=0, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    assert "".join(pieces) == chat.choices[0].message.content
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=server.model, messages=[], max_tokens=2)


def test_responses_api_through_the_openai_client(server):
    # OpenAI's Responses API: instructions + input are the chat's messages, so the text is the
    # chat answer's; streamed as typed events ending with the whole response.
    c = client(server)
    messages = [{"role": "system", "content": "You write Python."},
                {"role": "user", "content": "def add(a, b):"}]
    chat = c.chat.completions.create(model=server.model, messages=messages, max_tokens=10,
                                     temperature=0)
    response = c.responses.create(model=server.model, instructions="You write Python.",
                                  input="def add(a, b):", max_output_tokens=10, temperature=0)
    assert response.output_text == chat.choices[0].message.content
    assert response.status in ("completed", "incomplete")
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    types, pieces, final = [], [], None
    for event in c.responses.create(model=server.model, instructions="You write Python.",
                                    input=[{"role": "user", "content": "def add(a, b):"}],
                                    max_output_tokens=10, temperature=0, stream=True):
        types.append(event.type)
        if event.type == "response.output_text.delta":
            pieces.append(event.delta)
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert types[0] == "response.created" and types[-1] in ("response.completed",
                                                            "response.incomplete"), types
    assert "".join(pieces) == response.output_text
    assert final is not None and final.output_text == response.output_text
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model=server.model, input="x", previous_response_id="resp_1")


def test_stored_responses_through_the_openai_client(server):
    # Stored responses: retrieve, input_items, previous_response_id (the conversation so far, as
    # the chat of its turns would answer), the output sent back as input, delete.
    c = client(server)
    first = c.responses.create(model=server.model, input="def add(a, b):", max_output_tokens=8,
                               temperature=0)
    assert c.responses.retrieve(first.id).output_text == first.output_text
    items = c.responses.input_items.list(first.id)
    assert [item.content[0].text for item in items.data] == ["def add(a, b):"]
    follow = c.responses.create(model=server.model, previous_response_id=first.id,
                                input="def sub(a, b):", max_output_tokens=8, temperature=0)
    assert follow.previous_response_id == first.id
    turns = [{"role": "user", "content": "def add(a, b):"},
             {"role": "assistant", "content": first.output_text},
             {"role": "user", "content": "def sub(a, b):"}]
    chat = c.chat.completions.create(model=server.model, messages=turns, max_tokens=8,
                                     temperature=0)
    assert follow.output_text == chat.choices[0].message.content
    assert follow.usage.input_tokens == chat.usage.prompt_tokens
    # The client keeps the state instead: the earlier output items sent back as input.
    manual = c.responses.create(
        model=server.model, store=False, max_output_tokens=8, temperature=0,
        input=[{"role": "user", "content": "def add(a, b):"}, *first.output,
               {"role": "user", "content": "def sub(a, b):"}])
    assert manual.output_text == follow.output_text
    assert not manual.store
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(manual.id)
    c.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(first.id)


def test_auto_tool_choice_through_the_openai_client(server):
    # tool_choice "auto" with the Hermes parser (the server runs with --enable-auto-tool-choice
    # --tool-call-parser hermes): a guide makes the demo model write a Hermes answer, which the
    # OpenAI client reads as content and tool_calls, plain and streamed.
    c = client(server)
    tools = [{"type": "function", "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    guide = (r'Let me check\.\n<tool_call>\{"name": "get_weather", "arguments": '
             r'\{"city": "(Oslo|Rome)"\}\}</tool_call>')
    messages = [{"role": "user", "content": "weather?"}]
    chat = c.chat.completions.create(model=server.model, messages=messages, tools=tools,
                                     max_tokens=80, temperature=0,
                                     extra_body={"guided_regex": guide})
    choice = chat.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content == "Let me check.\n"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Oslo", "Rome")
    content, calls = [], []
    for chunk in c.chat.completions.create(model=server.model, messages=messages, tools=tools,
                                           max_tokens=80, temperature=0, stream=True,
                                           extra_body={"guided_regex": guide}):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.content:
            content.append(delta.content)
        calls.extend(delta.tool_calls or [])
    assert "".join(content) == "Let me check.\n"
    assert [(t.function.name, t.function.arguments) for t in calls] == [
        (call.function.name, call.function.arguments)]


def test_responses_function_tools_through_the_openai_client(server):
    # Function tools on the Responses API: a named function's call as a function_call item; its
    # result sent back as function_call_output with previous_response_id.
    c = client(server)
    tools = [{"type": "function", "name": "get_weather", "parameters": {
        "type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["unit"]}}]
    called = c.responses.create(model=server.model, input="weather?", tools=tools,
                                tool_choice={"type": "function", "name": "get_weather"},
                                max_output_tokens=60, temperature=0)
    [call] = called.output
    assert call.type == "function_call" and call.name == "get_weather", called.output
    assert json.loads(call.arguments)["unit"] in ("celsius", "fahrenheit")
    answer = c.responses.create(
        model=server.model, previous_response_id=called.id, max_output_tokens=5, temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "-3 C"}])
    assert answer.output[0].type == "message" and answer.output_text
    # "auto" (this server parses Hermes calls): a guided Hermes answer, streamed.
    events = list(c.responses.create(
        model=server.model, input="weather?", tools=tools, max_output_tokens=80, temperature=0,
        stream=True, extra_body={"guided_regex": r'<tool_call>\{"name": "get_weather", '
                                                 r'"arguments": \{"unit": "celsius"\}\}</tool_call>'}))
    final = events[-1].response
    assert [item.type for item in final.output] == ["function_call"], final.output
    assert json.loads(final.output[0].arguments) == {"unit": "celsius"}
    assert "response.function_call_arguments.done" in [e.type for e in events]


def test_anthropic_messages_api(server):
    # Anthropic's Messages API (what Anthropic's SDK and tools speaking it send), the key as
    # x-api-key: the answer is the chat's for the same conversation; streamed as its events.
    headers = {"Content-Type": "application/json", "anthropic-version": "2023-06-01"}
    if server.api_key:
        headers["x-api-key"] = server.api_key
    body = {"model": server.model, "system": "You write Python.", "max_tokens": 10,
            "temperature": 0, "messages": [{"role": "user", "content": "def add(a, b):"}]}
    status, raw = server.request("POST", "/v1/messages", body, headers=headers)
    assert status == 200, raw[:300]
    message = json.loads(raw)
    c = client(server)
    chat = c.chat.completions.create(model=server.model, max_tokens=10, temperature=0,
                                     messages=[{"role": "system", "content": "You write Python."},
                                               {"role": "user", "content": "def add(a, b):"}])
    assert message["content"][0]["text"] == chat.choices[0].message.content
    assert message["stop_reason"] == {"length": "max_tokens", "stop": "end_turn"}[
        chat.choices[0].finish_reason]
    status, raw = server.request("POST", "/v1/messages", dict(body, stream=True), headers=headers)
    assert status == 200
    events, text = [], ""
    for block in raw.decode().split("\n\n"):
        lines = block.split("\n")
        if len(lines) == 2 and lines[0].startswith("event: "):
            events.append(lines[0][7:])
            data = json.loads(lines[1][6:])
            if data["type"] == "content_block_delta":
                text += data["delta"]["text"]
    assert events[0] == "message_start" and events[-1] == "message_stop", events
    assert text == message["content"][0]["text"]
    status, raw = server.request("POST", "/v1/messages", {"messages": body["messages"]},
                                 headers=headers)
    assert status == 400 and json.loads(raw)["type"] == "error"


def test_anthropic_sdk_with_tools(server):
    # Anthropic's own SDK: a plain message equal to the chat answer, a named tool's tool_use
    # block, its tool_result continued, and the stream helper's final message.
    import anthropic

    GREEDY = {"temperature": 0}  # (sent as a body field: this SDK version's create has no argument)

    a = anthropic.Anthropic(base_url=server.url, api_key=server.api_key or "none")
    plain = a.messages.create(model=server.model, max_tokens=10, extra_body=GREEDY,
                              messages=[{"role": "user", "content": "def add(a, b):"}])
    chat = client(server).chat.completions.create(
        model=server.model, max_tokens=10, temperature=0,
        messages=[{"role": "user", "content": "def add(a, b):"}])
    assert plain.content[0].text == chat.choices[0].message.content
    tools = [{"name": "get_weather", "description": "The weather.", "input_schema": {
        "type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["unit"]}}]
    ask = [{"role": "user", "content": "weather?"}]
    called = a.messages.create(model=server.model, max_tokens=60, extra_body=GREEDY, messages=ask,
                               tools=tools, tool_choice={"type": "tool", "name": "get_weather"})
    assert called.stop_reason == "tool_use"
    [use] = called.content
    assert use.type == "tool_use" and use.input["unit"] in ("celsius", "fahrenheit")
    answered = a.messages.create(
        model=server.model, max_tokens=5, extra_body=GREEDY,
        messages=ask + [{"role": "assistant", "content": called.content},
                        {"role": "user", "content": [{"type": "tool_result",
                                                      "tool_use_id": use.id,
                                                      "content": "-3 C"}]}])
    assert answered.content[0].type == "text"
    with a.messages.stream(model=server.model, max_tokens=100, extra_body=GREEDY, messages=ask,
                           tools=tools, tool_choice={"type": "any",
                                                     "disable_parallel_tool_use": True}) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[-1].type == "tool_use"


WEATHER_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "maxLength": 12},
                                      "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"]}}},
    {"type": "function", "function": {
        "name": "get_time", "parameters": {"type": "object",
                                           "properties": {"utc": {"type": "boolean"}},
                                           "required": ["utc"]}}},
]


def check_weather_call(call):
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-"), call
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert list(args) == ["city", "unit"], args  # the schema's order
        assert isinstance(args["city"], str) and len(args["city"]) <= 12, args
        assert args["unit"] in ("celsius", "fahrenheit"), args
    else:
        assert call.function.name == "get_time", call
        assert isinstance(args["utc"], bool), args
    return args


def test_tool_calls_through_the_openai_client(server):
    # Named and required tool choices guide the output to calls the client can run; the answer
    # goes back as a tool message in the next turn.
    c = client(server)
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    chat = c.chat.completions.create(model=server.model, messages=messages, tools=WEATHER_TOOLS,
                                     tool_choice=named, max_tokens=40, temperature=0)
    message = chat.choices[0].message
    assert message.content is None and len(message.tool_calls) == 1, message
    args = check_weather_call(message.tool_calls[0])
    # Streamed: the call is named once, its arguments arrive in pieces that add up to the same.
    pieces, names = [], []
    for chunk in c.chat.completions.create(model=server.model, messages=messages,
                                           tools=WEATHER_TOOLS, tool_choice=named, max_tokens=40,
                                           temperature=0, stream=True):
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if delta.function.name:
                names.append(delta.function.name)
            pieces.append(delta.function.arguments or "")
    assert names == ["get_weather"]
    assert json.loads("".join(pieces)) == args

    single = c.chat.completions.create(model=server.model, messages=messages, tools=WEATHER_TOOLS,
                                       tool_choice="required", parallel_tool_calls=False,
                                       max_tokens=60, temperature=0)
    assert single.choices[0].finish_reason == "tool_calls", single
    assert len(single.choices[0].message.tool_calls) == 1
    call = single.choices[0].message.tool_calls[0]
    check_weather_call(call)

    # The next turn: the call and its result in the history.
    follow = messages + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": call.id, "type": "function",
                         "function": {"name": call.function.name,
                                      "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "-3 C, snow"}]
    answer = c.chat.completions.create(model=server.model, messages=follow, tools=WEATHER_TOOLS,
                                       tool_choice="none", max_tokens=5, temperature=0)
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls

    # "auto" (the default with tools; this server has a tool-call parser): the demo model writes
    # no Hermes block, so the answer is content.
    free = c.chat.completions.create(model=server.model, messages=messages, tools=WEATHER_TOOLS,
                                     max_tokens=5, temperature=0)
    assert free.choices[0].message.content is not None and not free.choices[0].message.tool_calls


BAD_BODIES = [
    (b'{"prompt": "x"', 400, None),
    (b'["x"]', 400, None),
    (b'{"prompt": "\xc3\x28"}', 400, None),
    (json.dumps({"prompt": 5}).encode(), 400, "prompt"),
    (json.dumps({"prompt": ""}).encode(), 400, "prompt"),
    (json.dumps({"prompt": [[1], [10**9]]}).encode(), 400, "prompt"),
    (json.dumps({"prompt": "x", "max_tokens": 10**6}).encode(), 400, "max_tokens"),
    (json.dumps({"prompt": "x", "temperature": -1}).encode(), 400, "temperature"),
    (json.dumps({"prompt": "x", "top_p": 0}).encode(), 400, "top_p"),
    (json.dumps({"prompt": "x", "n": 0}).encode(), 400, "n"),
    (json.dumps({"prompt": "x", "max_tokens": -1}).encode(), 400, "max_tokens"),
    (json.dumps({"prompt": "x", "max_tokens": 0}).encode(), 400, "max_tokens"),
    (json.dumps({"prompt": "x", "model": "no-such-model"}).encode(), 404, "model"),
    (json.dumps({"prompt": "x" * (9 << 20)}).encode(), 413, None),  # default limit: 8 MiB
]


@pytest.mark.parametrize("raw,status,param", BAD_BODIES,
                         ids=[f"{i}-{s}-{p}" for i, (_, s, p) in enumerate(BAD_BODIES)])
def test_bad_input_is_refused_and_the_server_keeps_serving(server, raw, status, param):
    got, body = server.request("POST", "/v1/completions", raw=raw)
    assert got == status, body[:300]
    error = json.loads(body)["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert error["param"] == param
    if param == "max_tokens" and b"1000000" in raw:
        assert "1000001" in error["message"]  # both numbers: the request and the limit
    ok = client(server).completions.create(model=server.model, prompt="x = ", max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_openai_client_errors(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model=server.model, prompt="x", temperature=-2)
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="not-" + server.model, prompt="x")


def test_concurrent_streams_all_finish_and_free_their_blocks(server):
    async def one(c, i):
        text, finish, tokens = "", None, None
        stream = await c.completions.create(
            model=server.model, prompt=PROMPTS[i % len(PROMPTS)] + f"# {i}\n", max_tokens=16,
            temperature=0.7, seed=i, stream=True, stream_options={"include_usage": True})
        async for chunk in stream:
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
            for choice in chunk.choices:
                text += choice.text
                finish = choice.finish_reason or finish
        return finish, tokens, text

    async def run_all():
        c = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=server.api_key or "unused",
                               max_retries=0)
        return await asyncio.gather(*(one(c, i) for i in range(64)))

    before = metric(server, "mqaserve_generation_tokens_total")
    results = asyncio.run(run_all())
    assert all(finish in ("stop", "length") and tokens for finish, tokens, _ in results)
    # Correct output: each seeded stream equals the same request made alone, without streaming
    # (a seed gives the same sample whatever else shares the batch).
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=server.api_key or "unused")
    for i in (0, 17, 42, 63):
        alone = client.completions.create(model=server.model,
                                          prompt=PROMPTS[i % len(PROMPTS)] + f"# {i}\n",
                                          max_tokens=16, temperature=0.7, seed=i)
        assert alone.choices[0].text == results[i][2], i
    assert wait_idle(server, 2.0) is not None
    assert metric(server, "mqaserve_generation_tokens_total") - before >= sum(t for _, t, _ in results)



def test_every_kind_of_request_at_once(server):
    """48 requests at once across the APIs and the host-side features (grammar, JSON, regex,
    tools, beam search, best_of, typical_p, llama.cpp's penalty window, TGI), a quarter of the
    streams dropped after their first event: every one left answers in its shape, nothing is
    lost, and the server ends idle with every KV block free."""
    import aiohttp
    tools = [{"type": "function", "function": {
        "name": "pick", "parameters": {"type": "object", "properties": {
            "n": {"type": "integer"}}, "required": ["n"]}}}]
    kinds = [
        ("/v1/completions", {"prompt": "x = ", "max_tokens": 12,
                             "guided_grammar": 'root ::= "[" [0-9]{1,3} ("," [0-9]{1,3})* "]"'}),
        ("/v1/completions", {"prompt": "d = ", "max_tokens": 24,
                             "response_format": {"type": "json_object"}}),
        ("/v1/completions", {"prompt": "v = ", "max_tokens": 8, "guided_regex": "[a-z]{2,6}"}),
        ("/v1/completions", {"prompt": "def f(", "max_tokens": 5, "n": 2,
                             "use_beam_search": True}),
        ("/v1/completions", {"prompt": "import ", "max_tokens": 6, "n": 2, "best_of": 3,
                             "temperature": 1.0}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "pick"}],
                                  "tools": tools, "tool_choice": "required", "max_tokens": 24}),
        ("/completion", {"prompt": "class A:", "n_predict": 10, "repeat_penalty": 1.2,
                         "repeat_last_n": 8}),
        ("/generate", {"inputs": "for i in", "parameters": {"max_new_tokens": 8,
                                                            "typical_p": 0.7}}),
    ]

    async def one(session, i):
        path, body = kinds[i % len(kinds)]
        body = dict(body)
        stream = i % 3 == 0 and "use_beam_search" not in body and "best_of" not in body
        drop = stream and i % 4 == 0
        if stream:
            body["stream"] = True
        async with session.post(server.url + path, json=body, headers=server.headers()) as r:
            if r.status != 200:
                return path, r.status, await r.text()
            if not stream:
                return path, 200, await r.json()
            events = []
            async for raw in r.content:
                line = raw.decode().strip()
                if line.startswith("data:"):
                    events.append(line[5:].strip())
                    if drop:
                        return path, "dropped", events
            return path, 200, events

    async def run_all():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            return await asyncio.gather(*(one(session, i) for i in range(48)))

    results = asyncio.run(run_all())
    for path, status, got in results:
        assert status in (200, "dropped"), (path, status, got)
        if status != 200 or isinstance(got, list):
            continue
        if path == "/v1/completions":
            assert got["choices"] and all(c["finish_reason"] for c in got["choices"]), got
        elif path == "/v1/chat/completions":
            assert got["choices"][0]["message"]["role"] == "assistant", got
        elif path == "/completion":
            assert got["stop"] is True and "content" in got, got
        else:
            assert "generated_text" in got, got
    assert wait_idle(server, 5.0) is not None
    assert server.request("GET", "/health")[0] == 200

def test_disconnect_mid_stream_frees_blocks_within_a_second(server):
    aborts = metric(server, "mqaserve_request_success_total", finished_reason="abort")
    url = urllib.parse.urlparse(server.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    _, tokenized = server.post_json("/tokenize", {"prompt": PROMPTS[0]})
    limit = tokenized["max_model_len"] - tokenized["count"]
    body = json.dumps({"model": server.model, "prompt": PROMPTS[0],
                       "max_tokens": min(1000, limit), "ignore_eos": True, "stream": True})
    connection.request("POST", "/v1/completions", body=body, headers=server.headers())
    response = connection.getresponse()
    assert response.status == 200
    response.read1(1)  # the first bytes of the stream: the request is running
    connection.close()
    took = wait_idle(server, 1.0)
    assert took is not None, "KV blocks still in use a second after the client left"
    assert metric(server, "mqaserve_request_success_total", finished_reason="abort") == aborts + 1


def test_metrics_parse_with_every_family(server):
    client(server).completions.create(model=server.model, prompt="x", max_tokens=3)
    families = {f.name: f for f in text_string_to_metric_families(server.metrics_text())}
    for gauge in ("mqaserve_num_requests_running", "mqaserve_num_requests_waiting",
                  "mqaserve_kv_cache_usage_perc"):
        assert families[gauge].type == "gauge"
    # prometheus_client names a counter family without its _total suffix.
    for counter in ("mqaserve_prompt_tokens", "mqaserve_generation_tokens",
                    "mqaserve_num_preemptions", "mqaserve_request_success"):
        assert families[counter].type == "counter", counter
    reasons = {s.labels["finished_reason"] for s in families["mqaserve_request_success"].samples}
    assert reasons == {"stop", "length", "abort"}
    for histogram in ("mqaserve_time_to_first_token_seconds",
                      "mqaserve_inter_token_latency_seconds",
                      "mqaserve_e2e_request_latency_seconds"):
        assert families[histogram].type == "histogram"
    usage = families["mqaserve_kv_cache_usage_perc"].samples[0].value
    assert 0.0 <= usage <= 1.0


def test_api_key_when_configured(server):
    if not server.api_key:
        pytest.skip("the server runs without --api-key")
    status, _ = server.request("POST", "/v1/completions", {"prompt": "x"},
                               headers={"Content-Type": "application/json"})
    assert status == 401
    status, _ = server.request("GET", "/health", headers={})
    assert status == 200
