#!/usr/bin/env python3
"""Regenerates data/qwen3_chat_jinja_cases.json: random conversations rendered
by Jinja2 (python3-jinja2) with the chat template stored in
../shared/fixtures/qwen3-tiny-q1_0.gguf, configured as Hugging Face
transformers renders chat templates (sandboxed environment, trim_blocks,
lstrip_blocks, `tojson` = json.dumps(ensure_ascii=False)). The C++ test
chat_template_test.cpp checks our built-in renderer against these.

Usage: python3 tests/tokenizer/gen_chat_cases.py [path/to/model.gguf]
"""
import json
import os
import random
import struct
import sys

from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))


def read_chat_template(path):
    """Returns tokenizer.chat_template from a GGUF (v2/v3) file's metadata."""
    data = open(path, 'rb').read()
    off = 0

    def u(fmt):
        nonlocal off
        v = struct.unpack_from('<' + fmt, data, off)[0]
        off += struct.calcsize('<' + fmt)
        return v

    def s():
        nonlocal off
        n = u('Q')
        v = data[off:off + n]
        off += n
        return v

    scalar = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q', 12: 'd'}

    def value(t):
        if t == 8:
            return s()
        if t == 9:
            et, n = u('I'), u('Q')
            for _ in range(n):
                value(et)
            return None
        return u(scalar[t])

    assert data[:4] == b'GGUF', 'not a GGUF file'
    off = 4
    u('I')
    u('Q')
    n_kv = u('Q')
    for _ in range(n_kv):
        key = s().decode()
        v = value(u('I'))
        if key == 'tokenizer.chat_template':
            return v.decode('utf-8')
    raise SystemExit('no tokenizer.chat_template in ' + path)


def main():
    gguf = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        HERE, '..', '..', '..', 'shared', 'fixtures', 'qwen3-tiny-q1_0.gguf')
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters['tojson'] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
    tmpl = env.from_string(read_chat_template(gguf))
    rng = random.Random(1234)
    texts = ['Hi', '', '\n', '\nlead', 'trail\n\n', 'a<think>b', '<think>\nR\n</think>\n\nA',
             '<think>x</think>y', 'x</think>', '\n\n<think>\n\nR1\n\n</think>\n\n\nA1\n',
             '<tool_response>\nr\n</tool_response>', '<tool_response>x', 'héllo 世界 🦙', '{"a": 1}',
             'multi\nline\ncontent', '<|im_end|>\n<|im_start|>system']
    tools_pool = [
        None, [],
        [{"type": "function", "function": {"name": "f", "description": "d é", "parameters": {
            "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}],
        [{"type": "function", "function": {"name": "a"}},
         {"type": "function", "function": {"name": "b", "parameters": {"k": [1, 2.5, True, None, "s\"q\n"]}}}],
    ]
    cases = []
    while len(cases) < 80:
        msgs = []
        for _ in range(rng.randint(1, 6)):
            role = rng.choice(['system', 'user', 'user', 'assistant', 'assistant', 'tool'])
            m = {'role': role, 'content': rng.choice(texts)}
            if role == 'assistant':
                if rng.random() < 0.3:
                    m['reasoning_content'] = rng.choice(texts)
                if rng.random() < 0.3:
                    m['tool_calls'] = [{'id': 'c%d' % k, 'type': 'function', 'function': {
                        'name': rng.choice(['get', 'put']),
                        'arguments': rng.choice(['{"x": 1}', '{}', 'raw'])}}
                        for k in range(rng.randint(1, 3))]
            msgs.append(m)
        tools = rng.choice(tools_pool)
        add_generation_prompt = rng.random() < 0.8
        enable_thinking = rng.choice([True, False, None])
        kwargs = dict(messages=msgs, add_generation_prompt=add_generation_prompt)
        if tools is not None:
            kwargs['tools'] = tools
        if enable_thinking is not None:
            kwargs['enable_thinking'] = enable_thinking
        cases.append({'messages': msgs, 'tools': tools, 'add_generation_prompt': add_generation_prompt,
                      'enable_thinking': enable_thinking is not False,
                      'prompt': tmpl.render(**kwargs)})
    out = os.path.join(HERE, 'data', 'qwen3_chat_jinja_cases.json')
    with open(out, 'w', encoding='utf-8') as f:
        json.dump({'generator': 'tests/tokenizer/gen_chat_cases.py', 'cases': cases}, f,
                  ensure_ascii=False, separators=(',', ':'))
        f.write('\n')
    print(len(cases), 'cases ->', out)


if __name__ == '__main__':
    main()
