// The official OpenAI Node SDK against `bonsai serve`: non-streamed and
// streamed chat and completions, streamed == non-streamed for seeded
// requests (byte for byte), n > 1, stop strings, usage, models, errors.
// Usage: node sdk_test.mjs BASE_URL API_KEY MODEL [QWEN_MODEL]
// MODEL is stories260K (a trained llama-architecture model); QWEN_MODEL a
// Qwen3 fixture with random weights and the real 151k-token vocabulary,
// whose output is full of multi-byte characters split across tokens.
import assert from "node:assert/strict";
import OpenAI from "openai";

const [baseURL, apiKey, model, qwen] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 60_000 });
let passed = 0;
async function check(name, fn) {
  try {
    await fn();
    passed++;
    console.log(`ok - ${name}`);
  } catch (e) {
    console.error(`not ok - ${name}\n${e.stack || e}`);
    process.exitCode = 1;
  }
}

// usage without prompt_tokens_details: cached_tokens depends on what the
// prompt cache holds (a repeated prompt is mostly cached), the counts do not.
const counts = (u) => (u ? { prompt_tokens: u.prompt_tokens, completion_tokens: u.completion_tokens, total_tokens: u.total_tokens } : u);

// Collects a stream: per-choice text, finish reasons, role chunks, usage.
async function collect(stream) {
  const out = { text: {}, finish: {}, roles: {}, usage: null, chunks: 0, order: [] };
  for await (const chunk of stream) {
    out.chunks++;
    if (chunk.usage) {
      assert.deepEqual(chunk.choices, []);
      out.usage = chunk.usage;
      continue;
    }
    for (const c of chunk.choices) {
      const i = c.index;
      out.text[i] ??= "";
      if (c.delta) {
        if (c.delta.role) out.roles[i] = c.delta.role;
        if (c.delta.content) out.text[i] += c.delta.content;
      } else if (c.text) {
        out.text[i] += c.text;
      }
      if (c.finish_reason) {
        assert.equal(out.finish[i], undefined, `two finish chunks for choice ${i}`);
        out.finish[i] = c.finish_reason;
      }
    }
  }
  return out;
}

const messages = [
  { role: "system", content: "You tell short stories." },
  { role: "user", content: "Tell me about a cat." },
];

await check("models.list and models.retrieve", async () => {
  const list = await client.models.list();
  const ids = list.data.map((m) => m.id);
  assert.ok(ids.includes(model), `models: ${ids}`);
  const m = await client.models.retrieve(model);
  assert.equal(m.id, model);
  assert.equal(m.object, "model");
});

await check("chat: non-streamed == streamed (seeded), role first, usage", async () => {
  const req = { model, messages, max_tokens: 48, temperature: 0.9, seed: 1234 };
  const full = await client.chat.completions.create(req);
  assert.equal(full.object, "chat.completion");
  assert.equal(full.choices.length, 1);
  const msg = full.choices[0].message;
  assert.equal(msg.role, "assistant");
  assert.ok(msg.content.length > 0);
  assert.ok(["stop", "length"].includes(full.choices[0].finish_reason));
  assert.equal(full.usage.total_tokens, full.usage.prompt_tokens + full.usage.completion_tokens);
  assert.ok(full.usage.completion_tokens > 0 && full.usage.completion_tokens <= 48);

  const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  const got = await collect(stream);
  assert.equal(got.roles[0], "assistant");
  assert.equal(got.text[0], msg.content, "streamed text differs from non-streamed");
  assert.equal(got.finish[0], full.choices[0].finish_reason);
  assert.deepEqual(counts(got.usage), counts(full.usage));
});

await check("chat: same seed twice gives the same answer; another seed differs", async () => {
  const req = { model, messages, max_tokens: 32, temperature: 1.0, seed: 77 };
  const a = await client.chat.completions.create(req);
  const b = await client.chat.completions.create(req);
  const c = await client.chat.completions.create({ ...req, seed: 78 });
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  assert.notEqual(a.choices[0].message.content, c.choices[0].message.content);
});

await check("chat: n = 3 streamed == non-streamed, one finish chunk per choice", async () => {
  const req = { model, messages, max_tokens: 24, temperature: 1.0, seed: 5, n: 3 };
  const full = await client.chat.completions.create(req);
  assert.equal(full.choices.length, 3);
  assert.deepEqual(full.choices.map((c) => c.index), [0, 1, 2]);
  const got = await collect(await client.chat.completions.create({ ...req, stream: true }));
  for (let i = 0; i < 3; i++) {
    assert.equal(got.roles[i], "assistant");
    assert.equal(got.text[i], full.choices[i].message.content, `choice ${i}`);
    assert.equal(got.finish[i], full.choices[i].finish_reason);
  }
  assert.equal(got.usage, null, "no usage chunk unless include_usage");
});

await check("completions: non-streamed == streamed, greedy text, usage", async () => {
  const req = { model, prompt: "Once upon a time", max_tokens: 40, temperature: 0 };
  const full = await client.completions.create(req);
  assert.equal(full.object, "text_completion");
  assert.equal(full.choices[0].finish_reason, "length");
  assert.equal(full.usage.completion_tokens, 40);
  assert.ok(full.choices[0].text.startsWith(", there was a little girl named Lily."), full.choices[0].text);
  const got = await collect(await client.completions.create({ ...req, stream: true, stream_options: { include_usage: true } }));
  assert.equal(got.text[0], full.choices[0].text);
  assert.equal(got.finish[0], "length");
  assert.deepEqual(counts(got.usage), counts(full.usage));
});

await check("completions: stop string is withheld, finish_reason stop, streamed == non-streamed", async () => {
  const req = { model, prompt: "Once upon a time", max_tokens: 60, temperature: 0, stop: ["Lily", "zzz"] };
  const full = await client.completions.create(req);
  assert.equal(full.choices[0].text, ", there was a little girl named ");
  assert.equal(full.choices[0].finish_reason, "stop");
  const got = await collect(await client.completions.create({ ...req, stream: true }));
  assert.equal(got.text[0], full.choices[0].text);
  assert.equal(got.finish[0], "stop");
});

await check("errors come back as SDK error classes with OpenAI bodies", async () => {
  await assert.rejects(client.chat.completions.create({ model: "no-such-model", messages }), (e) => {
    assert.equal(e.status, 404);
    assert.equal(e.code, "model_not_found");
    return true;
  });
  await assert.rejects(client.chat.completions.create({ model, messages, temperature: "hot" }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.param, "temperature");
    return true;
  });
  const bad = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: "wrong", maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e.status === 401);
});

if (qwen) {
  await check("qwen3 chat (multi-byte text): n = 2 streamed == non-streamed, pieces are whole characters", async () => {
    const req = { model: qwen, messages: [{ role: "user", content: "你好, who are you?" }], max_tokens: 40,
                  temperature: 1.0, seed: 11, n: 2, chat_template_kwargs: { enable_thinking: false } };
    const full = await client.chat.completions.create(req);
    assert.equal(full.choices.length, 2);
    const pieces = [];
    const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
    const got = { text: {}, finish: {} };
    let usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        got.text[c.index] ??= "";
        if (c.delta?.content) {
          pieces.push(c.delta.content);
          got.text[c.index] += c.delta.content;
        }
        if (c.finish_reason) got.finish[c.index] = c.finish_reason;
      }
    }
    for (let i = 0; i < 2; i++) {
      assert.equal(got.text[i], full.choices[i].message.content, `choice ${i}`);
      assert.equal(got.finish[i], full.choices[i].finish_reason);
    }
    assert.deepEqual(counts(usage), counts(full.usage));
    const all = pieces.join("");
    assert.ok(/[^\x00-\x7f]/.test(all), "expected some non-ASCII text from a 151k vocabulary");
    // A piece never starts with a lone low surrogate or ends with a high one
    // (a split character would show up as U+FFFD or a broken pair).
    for (const p of pieces) {
      assert.ok(!/^[\udc00-\udfff]/.test(p) && !/[\ud800-\udbff]$/.test(p), `split character in ${JSON.stringify(p)}`);
    }
  });
}

console.log(`${passed} checks passed`);
