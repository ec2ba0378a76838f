// The official OpenAI Node SDK's Responses API (client.responses.create)
// against `bonsai serve`: plain text streamed and not (the stream's deltas
// make the final text), a function tool (tool_choice required) and its
// output sent back, a json_schema text.format, previous_response_id,
// store: false, and a 400 naming the field.
// Usage: node responses_test.mjs BASE_URL API_KEY MODEL QWEN_MODEL
// MODEL is stories260K; QWEN_MODEL a Qwen3 fixture (its chat template
// renders tools; its random weights are steered by the grammar).
import assert from "node:assert/strict";
import OpenAI from "openai";

const [baseURL, apiKey, model, qwen] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 120_000 });
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
  type: "function",
  name: "get_weather",
  description: "The weather in a city",
  parameters: { type: "object", properties: { city: { type: "string", maxLength: 16 } }, required: ["city"], additionalProperties: false },
  strict: true,
};

await check("responses.create: text", async () => {
  const r = await client.responses.create({ model, input: "Once upon a time", max_output_tokens: 12, temperature: 0 });
  assert.equal(r.object, "response");
  assert.match(r.id, /^resp_/);
  assert.ok(["completed", "incomplete"].includes(r.status));
  assert.equal(r.output[0].type, "message");
  assert.equal(r.output[0].content[0].type, "output_text");
  assert.ok(r.output_text.length > 0, "output_text is empty");
  assert.equal(r.output_text, r.output[0].content[0].text);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.ok(r.usage.output_tokens > 0 && r.usage.output_tokens <= 12);
});

await check("responses.create: streamed deltas make the non-streamed text", async () => {
  const params = { model, input: "Once upon a time", max_output_tokens: 10, temperature: 0, instructions: "Tell a story." };
  const whole = await client.responses.create(params);
  const stream = await client.responses.create({ ...params, stream: true });
  let text = "";
  let last = -1;
  const types = [];
  let final = null;
  for await (const ev of stream) {
    assert.equal(ev.sequence_number, last + 1);
    last = ev.sequence_number;
    types.push(ev.type);
    if (ev.type === "response.output_text.delta") text += ev.delta;
    if (ev.type === "response.completed" || ev.type === "response.incomplete") final = ev.response;
  }
  assert.equal(types[0], "response.created");
  assert.equal(types[1], "response.in_progress");
  assert.ok(types.includes("response.output_text.done"));
  assert.ok(final, `no terminal event in ${types.join(",")}`);
  assert.equal(text, whole.output_text);
  assert.equal(final.output[0].content[0].text, text);
  assert.equal(final.status, whole.status);
  assert.equal(final.instructions, "Tell a story.");
});

await check("responses.create: max_output_tokens cuts to incomplete", async () => {
  const r = await client.responses.create({ model, input: "Once upon a time", max_output_tokens: 3, temperature: 0, ignore_eos: true });
  assert.equal(r.status, "incomplete");
  assert.deepEqual(r.incomplete_details, { reason: "max_output_tokens" });
  assert.equal(r.usage.output_tokens, 3);
});

let call = null;
let first = null;
await check("responses.create: function tool -> function_call item", async () => {
  first = await client.responses.create({
    model: qwen, input: "What is the weather in Paris?", tools: [weather], tool_choice: "required", parallel_tool_calls: false, temperature: 0, max_output_tokens: 300,
  });
  call = first.output.find((o) => o.type === "function_call");
  assert.ok(call, JSON.stringify(first.output));
  assert.equal(call.name, "get_weather");
  assert.match(call.call_id, /^call_/);
  const args = JSON.parse(call.arguments);
  assert.equal(typeof args.city, "string");
});

await check("responses.create: streamed function call", async () => {
  const stream = await client.responses.create({
    model: qwen, input: "What is the weather in Paris?", tools: [weather], tool_choice: "required", parallel_tool_calls: false, temperature: 0, max_output_tokens: 300, stream: true,
  });
  let args = null;
  let done = null;
  for await (const ev of stream) {
    if (ev.type === "response.function_call_arguments.done") args = ev.arguments;
    if (ev.type === "response.output_item.done" && ev.item.type === "function_call") done = ev.item;
  }
  assert.ok(done && args !== null);
  assert.equal(done.arguments, args);
  assert.equal(done.name, "get_weather");
  assert.equal(args, call.arguments);  // temperature 0: the non-streamed call
});

await check("responses.create: function_call_output round trip", async () => {
  assert.ok(call && first, "needs the function call above");
  const withItems = await client.responses.create({
    model: qwen,
    input: [
      { role: "user", content: "What is the weather in Paris?" },
      { type: "function_call", call_id: call.call_id, name: call.name, arguments: call.arguments },
      { type: "function_call_output", call_id: call.call_id, output: "Sunny, 21 C" },
    ],
    tools: [weather], temperature: 0, max_output_tokens: 8,
  });
  const continued = await client.responses.create({
    model: qwen,
    previous_response_id: first.id,
    input: [{ type: "function_call_output", call_id: call.call_id, output: "Sunny, 21 C" }],
    tools: [weather], temperature: 0, max_output_tokens: 8,
  });
  assert.equal(continued.previous_response_id, first.id);
  assert.equal(continued.usage.input_tokens, withItems.usage.input_tokens);
  assert.equal(continued.output_text, withItems.output_text);
  assert.ok(withItems.usage.input_tokens > first.usage.input_tokens);
});

await check("responses.create: json_schema text.format", async () => {
  const schema = {
    type: "object",
    properties: { name: { type: "string", maxLength: 10 }, age: { type: "integer" } },
    required: ["name", "age"],
    additionalProperties: false,
  };
  for (const stream of [false, true]) {
    const params = { model: qwen, input: "A person, as JSON.", temperature: 0, max_output_tokens: 200,
      text: { format: { type: "json_schema", name: "person", schema, strict: true } } };
    let text;
    if (stream) {
      text = "";
      for await (const ev of await client.responses.create({ ...params, stream: true }))
        if (ev.type === "response.output_text.delta") text += ev.delta;
    } else {
      const r = await client.responses.create(params);
      assert.equal(r.status, "completed");
      text = r.output_text;
    }
    const v = JSON.parse(text);
    assert.deepEqual(Object.keys(v).sort(), ["age", "name"]);
    assert.equal(typeof v.name, "string");
    assert.ok(Number.isInteger(v.age));
  }
});

await check("responses.stream: the SDK's accumulated snapshot and finalResponse", async () => {
  const schema = { type: "object", properties: { ok: { type: "boolean" } }, required: ["ok"], additionalProperties: false };
  const stream = client.responses.stream({
    model: qwen, input: "Is it ok?", temperature: 0, max_output_tokens: 100,
    text: { format: { type: "json_schema", name: "answer", schema, strict: true } },
  });
  let text = "";
  stream.on("response.output_text.delta", (ev) => { text += ev.delta; });
  const final = await stream.finalResponse();
  assert.equal(final.status, "completed");
  // The SDK's snapshot, accumulated from output_item / content_part / delta events.
  assert.equal(final.output[0].type, "message");
  assert.equal(final.output[0].content[0].text, text);
  assert.equal(typeof JSON.parse(text).ok, "boolean");
});

await check("responses: store false, retrieve, delete, previous response not found", async () => {
  const kept = await client.responses.create({ model, input: "Hi", max_output_tokens: 2 });
  const got = await client.responses.retrieve(kept.id);
  assert.equal(got.id, kept.id);
  assert.deepEqual(got.output, kept.output);
  await client.responses.del(kept.id);
  await assert.rejects(client.responses.retrieve(kept.id), (e) => e.status === 404);
  const gone = await client.responses.create({ model, input: "Hi", max_output_tokens: 2, store: false });
  await assert.rejects(
    client.responses.create({ model, input: "x", previous_response_id: gone.id }),
    (e) => e.status === 404 && e.param === "previous_response_id",
  );
});

await check("responses.create: bad input is a 400 naming the field", async () => {
  await assert.rejects(
    client.responses.create({ model, input: "x", text: { format: { type: "json_schema", name: "s" } } }),
    (e) => e.status === 400 && e.param === "text.format.schema",
  );
  await assert.rejects(
    client.responses.create({ model, input: "x", max_output_tokens: 0 }),
    (e) => e.status === 400 && e.param === "max_output_tokens",
  );
});

console.log(`# ${passed} passed`);
