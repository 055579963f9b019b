"""Writes cases.json beside this file: chat templates rendered by Hugging Face transformers'
apply_chat_template (the reference for ChatTemplate, runtime/http/chat_template.h).

Run: python3 tests/runtime/http/chat_templates/make_cases.py (needs transformers; the tokenizer
is the test fixture's, with <|endoftext|> as its BOS and EOS). Each case: the template, the
messages, add_generation_prompt, continue_final_message, the extra variables (chat_template_kwargs),
the tools (when given), and the rendered text or the error message raised.
"""
import json
import os

from transformers import PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", "..", ".."))

TEMPLATES = {
    # HuggingFaceH4/starchat-beta's (a GPT-BigCode fine-tune), one statement a line.
    "starchat": (
        "{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
        "{{ '<|user|>\\n' + message['content'] + eos_token }}\n"
        "{% elif message['role'] == 'system' %}\n{{ '<|system|>\\n' + message['content'] + eos_token }}\n"
        "{% elif message['role'] == 'assistant' %}\n"
        "{{ '<|assistant|>\\n'  + message['content'] + eos_token }}\n{% endif %}\n"
        "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"),
    "chatml": (
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
        " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant\\n' }}{% endif %}"),
    # Llama 2's: a system message folded into the first turn, alternation enforced.
    "llama2": (
        "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
        "{% set system_message = messages[0]['content'] %}{% else %}"
        "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
        "{% for message in loop_messages %}"
        "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
        "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
        "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
        "{% else %}{% set content = message['content'] %}{% endif %}"
        "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
        "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
        "{% endif %}{% endfor %}"),
    # namespace(), whitespace control, filters, tests, dict literals and tojson.
    "namespace": (
        "{%- set ns = namespace(found=false) -%}\n{%- for m in messages -%}\n"
        "  {%- if m.role == 'system' -%}{%- set ns.found = true -%}{%- endif -%}\n{%- endfor -%}\n"
        "{%- if not ns.found -%}\n{{- 'System: default\\n' -}}\n{%- endif -%}\n"
        "{%- for m in messages %}\n  {{ m.role | upper }}: {{ m.content | trim }}"
        "{% if m.name is defined %} ({{ m.name }}){% endif %}\n{%- endfor %}\n"
        "{% if add_generation_prompt %}ASSISTANT:{% endif %}\n"
        "{{ messages | length }} {{ {'last': messages[-1].role, 'n': messages|length} | tojson }}"),
    "mistral": (
        "{{ bos_token }}{% for message in messages %}"
        "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
        "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
        "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
        "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
        "{% endif %}{% endfor %}"),
    # The starchat template written with whitespace control on every tag.
    "dashes": (
        "{%- for message in messages %}\n    {%- if message['role'] == 'user' %}\n"
        "        {{- '<|user|>\\n' + message['content'] + eos_token }}\n"
        "    {%- elif message['role'] == 'system' %}\n"
        "        {{- '<|system|>\\n' + message['content'] + eos_token }}\n"
        "    {%- elif message['role'] == 'assistant' %}\n"
        "        {{- '<|assistant|>\\n'  + message['content'] + eos_token }}\n    {%- endif %}\n"
        "    {%- if loop.last and add_generation_prompt %}\n        {{- '<|assistant|>' }}\n"
        "    {%- endif %}\n{%- endfor %}"),
    # A file's last newline is not part of the template (keep_trailing_newline off).
    "trailing_newline": (
        "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
        "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}\n"),
    # Indented blocks (lstrip_blocks, trim_blocks) and a comment.
    "indented": (
        "{# a comment #}\n{% for message in messages %}\n    {% if message.role == 'user' %}\n"
        "        Q: {{ message.content }}\n    {% else %}\n        A: {{ message.content }}\n"
        "    {% endif %}\n{% endfor %}\n{% if add_generation_prompt %}    A:{% endif %}"),
    # Slices, loop fields, ~, the conditional expression, in / not in, string methods.
    "expressions": (
        "{% for m in messages[-2:] %}{{ loop.index ~ '/' ~ loop.length }} "
        "{{ 'U' if m['role'] == 'user' else 'B' }}{% if 'code' in m['content'] %}[code]{% endif %}"
        "{% if m['content'].startswith('def') %}[def]{% endif %}"
        "{% if m['role'] not in ['user', 'assistant', 'system'] %}"
        "{{ raise_exception('bad role ' + m['role']) }}{% endif %}"
        "{% if not loop.last %}|{% endif %}{% endfor %}{{ (3 - 1) * 2 }} {{ 7 // 2 }} {{ -1 }}"),
    # Variables from chat_template_kwargs (and bos_token overridden by them).
    "kwargs": (
        "{{ bos_token }}{% if system_prefix is defined %}{{ system_prefix }}\n{% endif %}"
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% if enable_thinking %} <think>{% endif %}"
        "{% endif %}"),
    # Tools (transformers' `tools`, None when not given), earlier calls and tool results, in the
    # shape tool-calling templates use (keys in sorted order: tojson keeps a mapping's order, and
    # ChatTemplate's mappings are sorted).
    "tools": (
        "{%- if tools %}<|system|>\nYou may call these functions:\n{% for tool in tools %}"
        "{{ tool | tojson }}\n{% endfor %}Answer with <tool_call>{\"name\": ..., \"arguments\": ...}"
        "</tool_call>.{{ eos_token }}\n{% endif %}\n"
        "{%- for message in messages %}\n"
        "{%- if message.role == 'assistant' and message.tool_calls %}<|assistant|>\n"
        "{% for call in message.tool_calls %}<tool_call>{\"name\": \"{{ call.function.name }}\", "
        "\"arguments\": {{ call.function.arguments | tojson }}}</tool_call>\n{% endfor %}"
        "{{ eos_token }}\n{% elif message.role == 'tool' %}<|tool|>\n{{ message.content }}"
        "{{ eos_token }}\n{% else %}<|{{ message.role }}|>\n{{ message.content }}{{ eos_token }}\n"
        "{% endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}<|assistant|>\n{% endif %}"
        "{% if tools is none %}(no tools){% endif %}"),
}

WEATHER = {"function": {"description": "The weather in a city.", "name": "get_weather",
                        "parameters": {"properties": {"city": {"type": "string"},
                                                      "unit": {"enum": ["c", "f"]}},
                                       "required": ["city"], "type": "object"}},
           "type": "function"}
CLOCK = {"function": {"name": "now", "parameters": {"properties": {}, "type": "object"}},
         "type": "function"}
# The tool lists each "tools" case is rendered with (other templates: none).
TOOLS = {"tools": [None, [WEATHER, CLOCK]]}

# chat_template_kwargs given with every case of the "kwargs" template (and none elsewhere).
KWARGS = {"kwargs": [{}, {"enable_thinking": True, "system_prefix": "Be brief."},
                     {"bos_token": "<BOS>", "enable_thinking": False}]}

MESSAGES = {
    "system_user": [{"role": "system", "content": "You write Python."},
                    {"role": "user", "content": "def fib(n):"}],
    "three_turns": [{"role": "user", "content": "Write code to sort a list."},
                    {"role": "assistant", "content": "  sorted(xs)  "},
                    {"role": "user", "content": "And with héllo ✓ unicode?"}],
    "one": [{"role": "user", "content": "hi"}],
    "assistant_first": [{"role": "assistant", "content": "hello"},
                        {"role": "user", "content": "hi", "name": "bob"}],
    "odd_role": [{"role": "user", "content": "x"}, {"role": "tool", "content": "code"}],
    # An assistant turn begun by the client, to be continued (continue_final_message); its
    # trailing spaces are what a template's strip() would cut.
    "prefill": [{"role": "user", "content": "Write fib."},
                {"role": "assistant", "content": "def fib(n):\n    "}],
    # An earlier call (its arguments an object, as the server gives them) and its result.
    "tool_turns": [{"role": "user", "content": "Weather in Oslo?"},
                   {"role": "assistant", "content": "",
                    "tool_calls": [{"function": {"arguments": {"city": "Oslo", "unit": "c"},
                                                 "name": "get_weather"},
                                    "id": "call_1", "type": "function"}]},
                   {"role": "tool", "content": "-3 C", "tool_call_id": "call_1"}],
}


def main():
    tok = PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(ROOT, "tests/fixtures/tokenizer/tokenizer.json"),
        bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    cases = []
    for tname, template in TEMPLATES.items():
        for kwargs, tools in [(k, t) for k in KWARGS.get(tname, [{}])
                              for t in TOOLS.get(tname, [None])]:
            for mname, messages in MESSAGES.items():
                # continue_final_message excludes add_generation_prompt in transformers (and vLLM).
                for gen, cont in ((True, False), (False, False), (False, True)):
                    name = f"{tname}/{mname}/{'cont' if cont else 'gen' if gen else 'nogen'}"
                    if kwargs:
                        name += "/" + ",".join(sorted(kwargs))
                    if tools:
                        name += "/tools"
                    case = {"name": name, "template": template, "messages": messages,
                            "add_generation_prompt": gen, "continue_final_message": cont,
                            "kwargs": kwargs,
                            "bos_token": tok.bos_token, "eos_token": tok.eos_token}
                    if tools:
                        case["tools"] = tools
                    try:
                        case["expected"] = tok.apply_chat_template(
                            messages, chat_template=template, tokenize=False, tools=tools,
                            add_generation_prompt=gen, continue_final_message=cont, **kwargs)
                    except Exception as e:  # a template's raise_exception, or no final message
                        case["error"] = str(e)
                    cases.append(case)
    with open(os.path.join(HERE, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(cases)} cases, {sum('error' in c for c in cases)} raising")


if __name__ == "__main__":
    main()
