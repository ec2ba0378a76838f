// The `ollama` npm client against `bonsai serve`'s Ollama API (/api/*):
// list, show, ps, version, chat (streamed and not, a format JSON Schema,
// tools), generate (streamed and not), embed, and an error the client reads
// as Ollama's {"error": "..."}.
// Usage: node ollama_test.mjs BASE_URL API_KEY MODEL QWEN_MODEL
// MODEL is stories260K; QWEN_MODEL a Qwen3 fixture (its chat template
// renders tools; its random weights are steered by the grammar: the schema,
// or tool_choice "required" with parallel_tool_calls false: extension
// fields bonsai reads and Ollama has not).
import assert from "node:assert/strict";
import { Ollama } from "ollama";

const [host, apiKey, model, qwen] = process.argv.slice(2);
const ollama = new Ollama({ host, headers: { Authorization: `Bearer ${apiKey}` } });
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
  function: {
    name: "get_weather",
    description: "The weather in a city",
    parameters: { type: "object", properties: { city: { type: "string", maxLength: 16 } }, required: ["city"] },
  },
};

function checkFinal(r, maxEval) {
  assert.equal(r.done, true);
  assert.ok(["stop", "length"].includes(r.done_reason), r.done_reason);
  assert.ok(r.prompt_eval_count > 0, "prompt_eval_count");
  assert.ok(r.eval_count > 0 && r.eval_count <= maxEval, `eval_count ${r.eval_count}`);
  for (const k of ["total_duration", "load_duration", "prompt_eval_duration", "eval_duration"])
    assert.ok(Number.isInteger(r[k]) && r[k] >= 0, k);
  assert.ok(r.total_duration > 0);
}

await check("version", async () => {
  const v = await ollama.version();
  assert.match(v.version, /^\d+\.\d+\.\d+$/);
});

await check("list", async () => {
  const { models } = await ollama.list();
  const names = models.map((m) => m.name).sort();
  assert.deepEqual(names, [`${qwen}:latest`, `${model}:latest`].sort());
  for (const m of models) {
    assert.equal(m.model, m.name);
    assert.equal(m.details.format, "gguf");
    assert.ok(m.size > 0);
    assert.ok(!Number.isNaN(Date.parse(m.modified_at)));
  }
});

await check("show", async () => {
  const s = await ollama.show({ model: `${qwen}:latest` });
  assert.equal(s.details.family, "qwen3");
  assert.equal(s.model_info["general.architecture"], "qwen3");
  assert.ok(s.template.includes("<|im_start|>"));
  assert.ok(s.capabilities.includes("tools") && s.capabilities.includes("completion"));
});

let whole = "";
await check("chat: not streamed", async () => {
  const r = await ollama.chat({
    model,
    messages: [{ role: "user", content: "Once upon a time" }],
    options: { temperature: 0, num_predict: 12 },
  });
  assert.equal(r.model, model);
  assert.equal(r.message.role, "assistant");
  assert.ok(r.message.content.length > 0, "empty content");
  whole = r.message.content;
  checkFinal(r, 12);
});

await check("chat: streamed parts make the non-streamed text", async () => {
  const stream = await ollama.chat({
    model,
    messages: [{ role: "user", content: "Once upon a time" }],
    options: { temperature: 0, num_predict: 12 },
    stream: true,
  });
  let text = "";
  let last = null;
  for await (const part of stream) {
    text += part.message.content;
    last = part;
  }
  assert.equal(text, whole);
  checkFinal(last, 12);
});

await check("ps lists the loaded model", async () => {
  const { models } = await ollama.ps();
  const m = models.find((x) => x.name === `${model}:latest`);
  assert.ok(m, JSON.stringify(models));
  assert.ok(m.size > 0);
  assert.ok(!Number.isNaN(Date.parse(m.expires_at)));
});

await check("chat: format JSON Schema", async () => {
  const format = {
    type: "object",
    properties: { name: { type: "string", maxLength: 8 }, age: { type: "integer" } },
    required: ["name", "age"],
    additionalProperties: false,
  };
  const r = await ollama.chat({
    model: qwen,
    messages: [{ role: "user", content: "Give a name and an age." }],
    format,
    options: { temperature: 0, num_predict: 200 },
  });
  const v = JSON.parse(r.message.content);
  assert.equal(typeof v.name, "string");
  assert.ok(v.name.length <= 8);
  assert.ok(Number.isInteger(v.age));
  assert.deepEqual(Object.keys(v).sort(), ["age", "name"]);
});

await check("chat: tools, streamed and not", async () => {
  const req = {
    model: qwen,
    messages: [{ role: "user", content: "What is the weather in Paris?" }],
    tools: [weather],
    tool_choice: "required",
    parallel_tool_calls: false,
    options: { temperature: 0, num_predict: 300 },
  };
  const r = await ollama.chat(req);
  assert.equal(r.message.tool_calls.length, 1, JSON.stringify(r.message));
  const call = r.message.tool_calls[0].function;
  assert.equal(call.name, "get_weather");
  assert.equal(typeof call.arguments, "object");
  assert.equal(typeof call.arguments.city, "string");
  const calls = [];
  for await (const part of await ollama.chat({ ...req, stream: true }))
    for (const c of part.message.tool_calls ?? []) calls.push(c.function);
  assert.deepEqual(calls, [call]);
  // The result sent back as Ollama does: the assistant's call, then a tool message.
  const follow = await ollama.chat({
    model: qwen,
    messages: [...req.messages, r.message, { role: "tool", content: "Sunny, 21 C", tool_name: "get_weather" }],
    tools: [weather],
    options: { temperature: 0, num_predict: 4 },
  });
  checkFinal(follow, 4);
});

await check("generate: streamed and not", async () => {
  const req = { model, prompt: "Once upon a time", system: "Tell a story.", options: { temperature: 0, num_predict: 10 } };
  const r = await ollama.generate(req);
  assert.ok(r.response.length > 0);
  checkFinal(r, 10);
  let text = "";
  let last = null;
  for await (const part of await ollama.generate({ ...req, stream: true })) {
    text += part.response;
    last = part;
  }
  assert.equal(text, r.response);
  assert.equal(last.eval_count, r.eval_count);
  const raw = await ollama.generate({ model, prompt: "Once upon a time", raw: true, options: { temperature: 0, num_predict: 5 } });
  checkFinal(raw, 5);
});

await check("embed", async () => {
  const r = await ollama.embed({ model, input: ["Once upon a time", "a cat"] });
  assert.equal(r.model, model);
  assert.equal(r.embeddings.length, 2);
  assert.equal(r.embeddings[0].length, r.embeddings[1].length);
  for (const v of r.embeddings) {
    const norm = Math.sqrt(v.reduce((s, x) => s + x * x, 0));
    assert.ok(Math.abs(norm - 1) < 1e-4, `norm ${norm}`);
  }
  assert.ok(r.prompt_eval_count > 0);
  const one = await ollama.embed({ model, input: "a cat" });
  assert.deepEqual(one.embeddings[0], r.embeddings[1]);
});

await check("errors are Ollama's {error}", async () => {
  await assert.rejects(
    ollama.chat({ model: "no-such-model", messages: [{ role: "user", content: "x" }] }),
    (e) => e.name === "ResponseError" && e.status_code === 404 && e.error.includes("no-such-model"),
  );
  const noKey = new Ollama({ host });
  await assert.rejects(noKey.list(), (e) => e.status_code === 401 && typeof e.error === "string" && !e.error.includes("[object"));
});

console.log(`# ${passed} passed`);
