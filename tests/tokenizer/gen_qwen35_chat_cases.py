#!/usr/bin/env python3
"""Regenerates data/qwen35_chat_jinja_cases.json: conversations rendered by
Jinja2 (python3-jinja2) with the Qwen3.5 chat template stored in
../shared/fixtures/qwen35/qwen35-tiny-q1_0.gguf, configured as Hugging Face
transformers renders chat templates (sandboxed environment, trim_blocks,
lstrip_blocks, `tojson` = json.dumps(ensure_ascii=False)). The C++ test
chat_template_test.cpp checks the built-in kQwen35 renderer against these.

Hand-written cases first (each rule of the template once), then seeded random
ones. A case the template refuses (raise_exception) is stored with "error"
instead of "prompt". Deterministic: the same template gives the same file.

Usage: python3 tests/tokenizer/gen_qwen35_chat_cases.py [path/to/model.gguf]
"""
import json
import os
import random
import sys

from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gen_chat_cases import read_chat_template  # noqa: E402  (the GGUF metadata reader)


class TemplateError(Exception):
    pass


def raise_exception(message):
    raise TemplateError(message)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city, °C",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}
NESTED = {"type": "function", "function": {"name": "b", "parameters": {"k": [1, 2.5, True, None, "s\"q\n"]}}}


def call(name, args):
    return {"id": "call_" + name, "type": "function", "function": {"name": name, "arguments": args}}


def hand_cases():
    u = {"role": "user", "content": "What is the weather in Paris?"}
    return [
        # system / user / generation prompt, thinking on (undefined) and off.
        dict(messages=[{"role": "system", "content": "  You are terse.\n"}, u], add_generation_prompt=True),
        dict(messages=[u], add_generation_prompt=True, enable_thinking=False),
        dict(messages=[u], add_generation_prompt=True, enable_thinking=True),
        dict(messages=[u, {"role": "assistant", "content": "Sunny."}], add_generation_prompt=False),
        # Earlier reasoning dropped, the latest kept; reasoning_content given apart.
        dict(messages=[u, {"role": "assistant", "content": "<think>\nhm\n</think>\n\nSunny."},
                       {"role": "user", "content": "And Rome?"},
                       {"role": "assistant", "content": "Rainy.", "reasoning_content": "\n look up \n"}],
             add_generation_prompt=True),
        # Tools declared, with and without a system message.
        dict(messages=[{"role": "system", "content": "Be brief."}, u], tools=[WEATHER, NESTED],
             add_generation_prompt=True),
        dict(messages=[{"role": "system", "content": " \n"}, u], tools=[WEATHER], add_generation_prompt=True),
        # Tool calls (string, integer, float, boolean, null, object and array
        # values), two tool responses grouped in one user turn, then the answer.
        dict(messages=[u, {"role": "assistant", "content": "Let me check.", "tool_calls": [
            call("get_weather", {"city": "Paris", "days": 3}),
            call("b", {"s": "a <b>\nline2", "f": 2.5, "t": True, "n": None, "o": {"x": [1, "é"]},
                       "a": ["1", 2], "big": 1e20, "one": 1.0})]},
            {"role": "tool", "content": "18 °C"}, {"role": "tool", "content": " {\"ok\": true} "},
            {"role": "assistant", "content": "It is 18 °C."}], tools=[WEATHER, NESTED], add_generation_prompt=False),
        # A call without content, then a generation prompt after the tool turn.
        dict(messages=[u, {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Oslo"})]},
                       {"role": "tool", "content": "-3"}], tools=[WEATHER], add_generation_prompt=True,
             enable_thinking=False),
        # Content given as text parts; Unicode whitespace trimmed (\u3000, \xa0).
        dict(messages=[{"role": "user", "content": [{"type": "text", "text": "\u3000Hi "},
                                                    {"type": "text", "text": "there\xa0"}]}],
             add_generation_prompt=True),
        # Refusals: no user query, a system message later than first.
        dict(messages=[{"role": "system", "content": "S"}], add_generation_prompt=True),
        dict(messages=[u, {"role": "system", "content": "late"}], add_generation_prompt=True),
    ]


def random_cases(rng, n):
    texts = ['Hi', '', '\n', '\nlead', 'trail\n\n', 'a<think>b', '<think>\nR\n</think>\n\nA',
             '<think>x</think>y', 'x</think>', '\n\n<think>\n\nR1\n\n</think>\n\n\nA1\n',
             '<tool_response>\nr\n</tool_response>', 'héllo 世界 🦙', '{"a": 1}', ' \t pad \t ']
    values = ['Paris', 'two\nlines', 'a<b', '', 7, -1.5, False, None, {"k": "v"}, [1, "x"], 'ü']
    tools_pool = [None, [], [WEATHER], [WEATHER, NESTED]]
    cases = []
    while len(cases) < n:
        msgs = [] if rng.random() < 0.3 else [{'role': 'system', 'content': rng.choice(texts)}]
        for _ in range(rng.randint(1, 5)):
            role = rng.choice(['user', 'user', 'assistant', 'assistant', 'tool'])
            m = {'role': role, 'content': rng.choice(texts)}
            if role == 'assistant':
                if rng.random() < 0.3:
                    m['reasoning_content'] = rng.choice(texts)
                if rng.random() < 0.4:
                    m['tool_calls'] = [call(rng.choice(['get', 'put']),
                                            {rng.choice(['a', 'b', 'c']): rng.choice(values)
                                             for _ in range(rng.randint(0, 2))})
                                       for _ in range(rng.randint(1, 2))]
            msgs.append(m)
        case = dict(messages=msgs, add_generation_prompt=rng.random() < 0.8)
        tools = rng.choice(tools_pool)
        if tools is not None:
            case['tools'] = tools
        thinking = rng.choice([True, False, None])
        if thinking is not None:
            case['enable_thinking'] = thinking
        cases.append(case)
    return cases


def main():
    gguf = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        HERE, '..', '..', '..', 'shared', 'fixtures', 'qwen35', 'qwen35-tiny-q1_0.gguf')
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters['tojson'] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals['raise_exception'] = raise_exception
    tmpl = env.from_string(read_chat_template(gguf))
    out_cases = []
    for case in hand_cases() + random_cases(random.Random(35), 30):
        kwargs = dict(case)
        row = {'messages': case['messages'], 'tools': case.get('tools'),
               'add_generation_prompt': case['add_generation_prompt'],
               'enable_thinking': case.get('enable_thinking', True)}
        try:
            row['prompt'] = tmpl.render(**kwargs)
        except TemplateError as e:
            row['error'] = str(e)
        out_cases.append(row)
    out = os.path.join(HERE, 'data', 'qwen35_chat_jinja_cases.json')
    with open(out, 'w', encoding='utf-8') as f:
        json.dump({'generator': 'tests/tokenizer/gen_qwen35_chat_cases.py', 'cases': out_cases}, f,
                  ensure_ascii=False, separators=(',', ':'))
        f.write('\n')
    print(len(out_cases), 'cases,', sum('error' in c for c in out_cases), 'refused ->', out)


if __name__ == '__main__':
    main()
