// The official Anthropic Node SDK (@anthropic-ai/sdk) against `bonsai
// serve`'s POST /v1/messages: messages.create streamed and not (the
// stream's text deltas make the non-streamed text, which equals chat
// completions' answer), messages.stream().finalMessage(), a forced tool
// (tool_choice {type: "tool"}) as tool_use streamed and not and its
// tool_result sent back, stop_sequences, messages.countTokens, and errors
// as the SDK's typed exceptions (400, 401).
// Usage: node anthropic_test.mjs BASE_URL API_KEY MODEL QWEN_MODEL
// MODEL is stories260K; QWEN_MODEL a Qwen3 fixture (its chat template
// renders tools; its random weights are steered by the grammar).
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";

const [baseURL, apiKey, model, qwen] = process.argv.slice(2);
// The SDK sends the key as x-api-key (and anthropic-version).
const client = new Anthropic({ baseURL, apiKey, maxRetries: 0, timeout: 120_000 });
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

const weather = {
  name: "get_weather",
  description: "The weather in a city",
  input_schema: { type: "object", properties: { city: { type: "string", maxLength: 16 } }, required: ["city"], additionalProperties: false },
};
const story = {
  model,
  max_tokens: 12,
  temperature: 0,
  system: "Tell a story.",
  messages: [{ role: "user", content: "Once upon a time" }],
};
const textOf = (m) => m.content.filter((b) => b.type === "text").map((b) => b.text).join("");

let whole;
await check("messages.create: text equals chat completions' answer", async () => {
  whole = await client.messages.create(story);
  assert.equal(whole.type, "message");
  assert.equal(whole.role, "assistant");
  assert.equal(whole.model, model);
  assert.match(whole.id, /^msg_[0-9a-f]{24}$/);
  assert.equal(whole.content.length, 1);
  assert.equal(whole.content[0].type, "text");
  assert.ok(whole.content[0].text.length > 0);
  assert.ok(["end_turn", "max_tokens"].includes(whole.stop_reason));
  assert.equal(whole.stop_sequence, null);
  assert.ok(whole.usage.input_tokens > 0);
  assert.ok(whole.usage.output_tokens > 0 && whole.usage.output_tokens <= 12);
  const res = await fetch(`${baseURL}/v1/chat/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${apiKey}` },
    body: JSON.stringify({ model, max_tokens: 12, temperature: 0,
      messages: [{ role: "system", content: "Tell a story." }, { role: "user", content: "Once upon a time" }] }),
  });
  assert.equal(res.status, 200);
  const chat = await res.json();
  assert.equal(textOf(whole), chat.choices[0].message.content);
  assert.equal(whole.usage.input_tokens, chat.usage.prompt_tokens);
  assert.equal(whole.usage.output_tokens, chat.usage.completion_tokens);
  assert.equal(whole.stop_reason, chat.choices[0].finish_reason === "length" ? "max_tokens" : "end_turn");
});

await check("messages.create stream: events in order, deltas make the text", async () => {
  const stream = await client.messages.create({ ...story, stream: true });
  const types = [];
  let text = "";
  let delta;
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === "content_block_delta") {
      assert.equal(ev.index, 0);
      assert.equal(ev.delta.type, "text_delta");
      text += ev.delta.text;
    }
    if (ev.type === "message_start") {
      assert.match(ev.message.id, /^msg_/);
      assert.deepEqual(ev.message.content, []);
      assert.equal(ev.message.usage.input_tokens, whole.usage.input_tokens);
    }
    if (ev.type === "message_delta") delta = ev;
  }
  // The SDK drops `ping` events (the C++ test sees the one after message_start).
  assert.deepEqual(types.slice(0, 2), ["message_start", "content_block_start"]);
  assert.deepEqual(types.slice(-3), ["content_block_stop", "message_delta", "message_stop"]);
  assert.ok(types.slice(2, -3).every((t) => t === "content_block_delta"));
  assert.ok(types.length >= 7, types.join(" "));  // the text came in pieces
  assert.equal(text, textOf(whole));
  assert.equal(delta.delta.stop_reason, whole.stop_reason);
  assert.equal(delta.usage.output_tokens, whole.usage.output_tokens);
});

await check("messages.stream: finalMessage() is the non-streamed Message", async () => {
  const stream = client.messages.stream(story);
  let text = "";
  stream.on("text", (t) => { text += t; });
  const m = await stream.finalMessage();
  assert.deepEqual(m.content, whole.content);
  assert.equal(m.stop_reason, whole.stop_reason);
  assert.deepEqual(m.usage, whole.usage);
  assert.equal(text, textOf(whole));
});

await check("messages.create: stop_sequences", async () => {
  const full = await client.messages.create({ ...story, max_tokens: 40 });
  const t = textOf(full);
  assert.ok(t.length >= 12, t);
  const stop = t.slice(Math.floor(t.length / 2), Math.floor(t.length / 2) + 3);
  const m = await client.messages.create({ ...story, max_tokens: 40, stop_sequences: [stop] });
  assert.equal(m.stop_reason, "stop_sequence");
  assert.equal(m.stop_sequence, stop);
  assert.equal(textOf(m), t.slice(0, t.indexOf(stop)));
});

await check("messages.countTokens: the prompt messages.create counts", async () => {
  const n = await client.messages.countTokens({ model, system: story.system, messages: story.messages });
  assert.equal(n.input_tokens, whole.usage.input_tokens);
});

const ask = { role: "user", content: "What is the weather in Paris?" };
const forced = {
  model: qwen,
  max_tokens: 300,
  temperature: 0,
  tools: [weather],
  tool_choice: { type: "tool", name: "get_weather" },
  messages: [ask],
};
let call;
await check("messages.create with tools: a forced tool_use", async () => {
  const m = await client.messages.create(forced);
  assert.equal(m.stop_reason, "tool_use");
  call = m.content.find((b) => b.type === "tool_use");
  assert.ok(call, JSON.stringify(m.content));
  assert.match(call.id, /^toolu_[0-9a-f]{24}$/);
  assert.equal(call.name, "get_weather");
  assert.equal(typeof call.input, "object");
  assert.equal(typeof call.input.city, "string");
  assert.deepEqual(Object.keys(call.input), ["city"]);

  const next = await client.messages.create({
    model: qwen,
    max_tokens: 8,
    temperature: 0,
    tools: [weather],
    messages: [ask, { role: "assistant", content: m.content },
      { role: "user", content: [{ type: "tool_result", tool_use_id: call.id, content: "Sunny, 21 C" }] }],
  });
  assert.equal(next.type, "message");
  assert.ok(next.usage.input_tokens > m.usage.input_tokens);
  assert.ok(["end_turn", "max_tokens", "tool_use"].includes(next.stop_reason));
});

await check("messages.stream with tools: finalMessage() has the tool_use input as an object", async () => {
  const stream = client.messages.stream(forced);
  const partials = [];  // one input_json_delta per tool_use block here
  stream.on("inputJson", (partial) => { partials.push(partial); });
  const m = await stream.finalMessage();
  assert.equal(m.stop_reason, "tool_use");
  const streamed = m.content.find((b) => b.type === "tool_use");
  assert.ok(streamed, JSON.stringify(m.content));
  assert.match(streamed.id, /^toolu_/);
  assert.equal(streamed.name, "get_weather");
  assert.deepEqual(streamed.input, call.input);  // temperature 0: the same call
  const uses = m.content.filter((b) => b.type === "tool_use");
  assert.equal(partials.length, uses.length);
  partials.forEach((p, k) => assert.deepEqual(JSON.parse(p), uses[k].input));
});

await check("errors: typed exceptions with Anthropic's error types", async () => {
  await assert.rejects(client.messages.create({ model, messages: story.messages }), (e) => {
    assert.ok(e instanceof Anthropic.BadRequestError, String(e));
    assert.equal(e.status, 400);
    assert.equal(e.error.type, "error");
    assert.equal(e.error.error.type, "invalid_request_error");
    assert.match(e.error.error.message, /max_tokens/);
    return true;
  });
  await assert.rejects(client.messages.create({ ...story, model: "nope" }), (e) => {
    assert.ok(e instanceof Anthropic.NotFoundError, String(e));
    assert.equal(e.error.error.type, "not_found_error");
    return true;
  });
  const wrong = new Anthropic({ baseURL, apiKey: "wrong-key", maxRetries: 0 });
  await assert.rejects(wrong.messages.create(story), (e) => {
    assert.ok(e instanceof Anthropic.AuthenticationError, String(e));
    assert.equal(e.error.error.type, "authentication_error");
    return true;
  });
});

console.log(`# ${passed} passed`);
