// Structured outputs and forced tool calls against `bonsai serve`
// (run by tests/server/structured_test.sh):
//   - the schema corpus (schemas.json, real-world shapes) through
//     response_format json_schema on every model, temperature 0 and 1: every
//     answer finishes with "stop" within 512 tokens and validates with ajv
//     (formats by ajv-formats). The Qwen3 fixtures have random weights, so only
//     the grammar makes their output valid;
//   - llama.cpp's `json_schema` and `grammar` fields on /v1/completions and
//     /v1/chat/completions, json_object, and the 400s (unsupported keyword,
//     bad GBNF, two constraints) naming the field and the keyword;
//   - tool_choice "required" / named, parallel_tool_calls true / false: every
//     answer is a valid call (known name, arguments valid against the tool's
//     parameters), finish_reason "tool_calls" (up to 8 parallel calls, so up
//     to 1500 tokens); streamed deltas reassemble to the
//     non-streamed answer (same seed); the SDK's streaming helper sees the calls;
//   - the SDK's zodResponseFormat + chat.completions.parse end to end, with
//     zod 3 (openai 4) and with zod 4's formats and number checks (openai 6,
//     20 runs each at temperature 1, every value accepted by zod's parse).
// Usage: node structured_test.mjs BASE_URL MODE MODEL... (MODE full | quick:
// quick runs each schema once per model at one temperature, for sanitizer builds).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import http from "node:http";
import Ajv from "ajv";
import addFormats from "ajv-formats";
import OpenAI from "openai";

const [baseURL, mode, ...models] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: "none", maxRetries: 2, timeout: 300_000 });
const corpus = JSON.parse(readFileSync(new URL("./schemas.json", import.meta.url), "utf8"));
const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);

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

// Runs `tasks` (async thunks) with at most `limit` in flight; results in order.
async function pool(tasks, limit) {
  const out = new Array(tasks.length);
  let next = 0;
  async function worker() {
    while (next < tasks.length) {
      const i = next++;
      out[i] = await tasks[i]();
    }
  }
  await Promise.all(Array.from({ length: Math.min(limit, tasks.length) }, worker));
  return out;
}

// One request on its own connection (no keep-alive: a server closing an idle
// connection must not race a reused socket). Returns {status, json}.
function post(path, body) {
  const data = JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = http.request(`${baseURL}${path}`, { method: "POST", agent: false, headers: { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(data) } }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (d) => (text += d));
      res.on("end", () => {
        try { resolve({ status: res.statusCode, json: JSON.parse(text) }); } catch (e) { reject(new Error(`HTTP ${res.statusCode}: ${text}`)); }
      });
    });
    req.on("error", reject);
    req.end(data);
  });
}

// Every model loaded before the timed parts (a model still loading answers 503).
for (const model of models) {
  for (let i = 0; ; i++) {
    const r = await post("/v1/completions", { model, prompt: "x", max_tokens: 1 });
    if (r.status === 200) break;
    if (r.status !== 503 || i > 600) throw new Error(`warm-up of ${model}: HTTP ${r.status} ${JSON.stringify(r.json)}`);
    await new Promise((ok) => setTimeout(ok, 500));
  }
}

const messages = [{ role: "user", content: "Answer in JSON." }];

// ---- the corpus -------------------------------------------------------------------
await check(`corpus: ${corpus.length} schemas`, async () => assert.ok(corpus.length >= 40));
const temps = mode === "quick" ? [1] : [0, 1];
const corpusModels = mode === "quick" ? models.slice(0, 2) : models;
const corpusStats = { answers: 0, stop: 0, valid: 0, maxTokens: 0, tokens: 0 };
{
  // Every (model, temperature, schema) request, interleaved across models so
  // several models' step loops work at once; at most 8 in flight.
  const tasks = [];
  corpus.forEach((c, i) => {
    for (const temperature of temps) {
      for (const model of corpusModels) {
        tasks.push(async () => {
          const r = await post("/v1/chat/completions", {
            model, messages, temperature, seed: 1000 + i, max_tokens: 512,
            response_format: { type: "json_schema", json_schema: { name: c.name, schema: c.schema, strict: true } },
          });
          return { c, r, model, temperature };
        });
      }
    }
  });
  const failures = {};
  for (const { c, r, model, temperature } of await pool(tasks, 8)) {
    const key = `${model} at temperature ${temperature}`;
    failures[key] ??= [];
    corpusStats.answers++;
    if (r.status !== 200) { failures[key].push(`${c.name}: HTTP ${r.status} ${JSON.stringify(r.json)}`); continue; }
    const choice = r.json.choices[0];
    corpusStats.maxTokens = Math.max(corpusStats.maxTokens, r.json.usage.completion_tokens);
    corpusStats.tokens += r.json.usage.completion_tokens;
    if (choice.finish_reason !== "stop") { failures[key].push(`${c.name}: finish_reason ${choice.finish_reason} after ${r.json.usage.completion_tokens} tokens: ${choice.message.content}`); continue; }
    corpusStats.stop++;
    let value;
    try { value = JSON.parse(choice.message.content); } catch (e) { failures[key].push(`${c.name}: not JSON: ${choice.message.content}`); continue; }
    const validate = ajv.compile(c.schema);
    if (!validate(value)) { failures[key].push(`${c.name}: invalid: ${choice.message.content} ${JSON.stringify(validate.errors)}`); continue; }
    corpusStats.valid++;
  }
  for (const [key, f] of Object.entries(failures)) await check(`corpus on ${key}`, async () => assert.deepEqual(f, []));
}
console.log(`# corpus: ${corpusStats.answers} answers, ${corpusStats.stop} finished with stop, ${corpusStats.valid} valid by ajv, longest ${corpusStats.maxTokens} tokens, mean ${(corpusStats.tokens / Math.max(1, corpusStats.answers)).toFixed(1)}`);

const qwen = models.find((m) => m.startsWith("qwen")) ?? models[0];

// ---- llama.cpp fields, json_object, errors ---------------------------------------------
await check("completions: json_schema and grammar fields", async () => {
  const schema = { type: "object", properties: { n: { type: "integer", minimum: 1, maximum: 20 } }, required: ["n"], additionalProperties: false };
  for (const model of corpusModels) {
    const a = await post("/v1/completions", { model, prompt: "Once upon a time", json_schema: schema, max_tokens: 64, temperature: 1, seed: 3 });
    assert.equal(a.status, 200, JSON.stringify(a.json));
    assert.equal(a.json.choices[0].finish_reason, "stop");
    const v = JSON.parse(a.json.choices[0].text);
    assert.ok(ajv.validate(schema, v), a.json.choices[0].text);
    const g = await post("/v1/completions", { model, prompt: "Once upon a time", grammar: 'root ::= ("yes" | "no") "!"', max_tokens: 16, temperature: 1, seed: 4 });
    assert.equal(g.status, 200, JSON.stringify(g.json));
    assert.match(g.json.choices[0].text, /^(yes|no)!$/);
    assert.equal(g.json.choices[0].finish_reason, "stop");
  }
});

await check("chat: grammar and json_schema fields, streamed == non-streamed", async () => {
  const body = { model: qwen, messages, grammar: 'root ::= "[" [0-9]{1,3} ("," [0-9]{1,3}){0,3} "]"', max_tokens: 64, temperature: 1, seed: 9 };
  const a = await post("/v1/chat/completions", body);
  assert.equal(a.status, 200, JSON.stringify(a.json));
  assert.match(a.json.choices[0].message.content, /^\[[0-9]{1,3}(,[0-9]{1,3}){0,3}\]$/);
  const stream = await client.chat.completions.create({ ...body, stream: true });
  let text = "", finish = null;
  for await (const ch of stream) for (const c of ch.choices) { text += c.delta.content ?? ""; finish = c.finish_reason ?? finish; }
  assert.equal(text, a.json.choices[0].message.content);
  assert.equal(finish, "stop");
  const j = await post("/v1/chat/completions", { model: qwen, messages, json_schema: { type: "array", items: { type: "boolean" }, minItems: 1, maxItems: 3 }, max_tokens: 64, temperature: 1, seed: 5 });
  assert.equal(j.status, 200, JSON.stringify(j.json));
  const v = JSON.parse(j.json.choices[0].message.content);
  assert.ok(Array.isArray(v) && v.length >= 1 && v.length <= 3 && v.every((x) => typeof x === "boolean"));
});

await check("response_format json_object: an object (or a cut-off prefix of one)", async () => {
  for (const temperature of [0, 1]) {
    const r = await post("/v1/chat/completions", { model: qwen, messages, response_format: { type: "json_object" }, max_tokens: 48, temperature, seed: 2 });
    assert.equal(r.status, 200, JSON.stringify(r.json));
    const c = r.json.choices[0];
    assert.ok(c.message.content.startsWith("{"), c.message.content);
    if (c.finish_reason === "stop") assert.equal(typeof JSON.parse(c.message.content), "object");
    else assert.equal(c.finish_reason, "length");
  }
});

await check("400s name the field and the keyword", async () => {
  const cases = [
    [{ response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "object", patternProperties: { "^a": { type: "string" } } } } } }, "response_format.json_schema.schema", /patternProperties/],
    [{ json_schema: { type: "string", format: "cuid2" } }, "json_schema", /cuid2/],
    [{ grammar: 'root ::= "a" undefined-rule' }, "grammar", /undefined-rule/],
    [{ grammar: "root ::= (" }, "grammar", /line 1/],
    [{ grammar: 'root ::= "a"', json_schema: { type: "boolean" } }, "json_schema", /grammar/],
    [{ tools: [{ type: "function", function: { name: "f", parameters: { type: "object", properties: { a: { type: "string", not: { const: "x" } } } } } }], tool_choice: "required" }, "tools[0].function.parameters", /not/],
  ];
  for (const [extra, param, re] of cases) {
    const r = await post("/v1/chat/completions", { model: qwen, messages, max_tokens: 8, ...extra });
    assert.equal(r.status, 400, JSON.stringify(extra));
    assert.equal(r.json.error.type, "invalid_request_error");
    assert.equal(r.json.error.param, param, JSON.stringify(r.json));
    assert.match(r.json.error.message, re);
  }
  const c = await post("/v1/completions", { model: qwen, prompt: "x", max_tokens: 8, json_schema: { type: "object", properties: { a: { type: "number", multipleOf: 1234567 } } } });
  assert.equal(c.status, 400);
  assert.equal(c.json.error.param, "json_schema");
  assert.match(c.json.error.message, /multipleOf/);
});

// ---- tool calls ------------------------------------------------------------------------
const tools = [
  { type: "function", function: { name: "get_weather", description: "Weather for a city", parameters: { type: "object", properties: { city: { type: "string", maxLength: 16 }, unit: { enum: ["c", "f"] } }, required: ["city", "unit"], additionalProperties: false } } },
  { type: "function", function: { name: "add", parameters: { type: "object", properties: { a: { type: "integer", minimum: -100, maximum: 100 }, b: { type: "integer", minimum: -100, maximum: 100 } }, required: ["a", "b"], additionalProperties: false } } },
  { type: "function", function: { name: "get_time", description: "No arguments" } },
  { type: "function", function: { name: "lookup", parameters: { $defs: { id: { type: "string", pattern: "^[A-Z]{2}[0-9]{3}$" } }, type: "object", properties: { ids: { type: "array", items: { $ref: "#/$defs/id" }, minItems: 1, maxItems: 2 } }, required: ["ids"], additionalProperties: false } } },
];
const toolSchema = Object.fromEntries(tools.map((t) => [t.function.name, t.function.parameters ?? { type: "object", properties: {}, additionalProperties: false }]));

function checkCalls(msg, { only = null, parallel = true } = {}) {
  assert.ok(Array.isArray(msg.tool_calls) && msg.tool_calls.length >= 1, JSON.stringify(msg));
  if (!parallel) assert.equal(msg.tool_calls.length, 1);
  for (const call of msg.tool_calls) {
    assert.equal(call.type, "function");
    assert.match(call.id, /^call_/);
    assert.ok(call.function.name in toolSchema, call.function.name);
    if (only) assert.equal(call.function.name, only);
    const args = JSON.parse(call.function.arguments);
    assert.ok(ajv.validate(toolSchema[call.function.name], args), `${call.function.name} ${call.function.arguments} ${JSON.stringify(ajv.errors)}`);
  }
}

const toolStats = { answers: 0, valid: 0, calls: 0 };
for (const model of corpusModels) {
  await check(`tool_choice required / named on ${model}`, async () => {
    const variants = [];
    for (const temperature of [0, 1]) {
      for (const seed of mode === "quick" ? [1] : [1, 2, 3]) {
        variants.push({ tool_choice: "required", parallel_tool_calls: true, temperature, seed });
        variants.push({ tool_choice: "required", parallel_tool_calls: false, temperature, seed });
        for (const name of ["get_weather", "get_time", "lookup"])
          variants.push({ tool_choice: { type: "function", function: { name } }, temperature, seed, only: name });
        if (temperature === 0) break;
      }
    }
    const results = await pool(variants.map((v) => async () => {
      const { only, ...req } = v;
      const r = await post("/v1/chat/completions", { model, messages: [{ role: "user", content: "What is the weather in Paris?" }], tools, max_tokens: 1500, ...req });
      return { v, r };
    }), 4);
    for (const { v, r } of results) {
      toolStats.answers++;
      assert.equal(r.status, 200, JSON.stringify(r.json));
      const c = r.json.choices[0];
      assert.equal(c.finish_reason, "tool_calls", JSON.stringify(c));
      assert.equal(c.message.content, null);
      checkCalls(c.message, { only: v.only, parallel: v.parallel_tool_calls !== false });
      toolStats.valid++;
      toolStats.calls += c.message.tool_calls.length;
    }
  });
}
console.log(`# tool calls: ${toolStats.answers} answers, ${toolStats.valid} valid, ${toolStats.calls} calls`);

await check("streamed tool-call deltas reassemble to the non-streamed answer", async () => {
  for (const model of corpusModels) {
    for (const [temperature, seed, tool_choice] of [[0, 1, "required"], [1, 7, "required"], [1, 8, { type: "function", function: { name: "add" } }]]) {
      const body = { model, messages: [{ role: "user", content: "Add 2 and 3." }], tools, tool_choice, temperature, seed, max_tokens: 1500 };
      const full = await client.chat.completions.create(body);
      const want = full.choices[0].message.tool_calls.map((t) => ({ name: t.function.name, arguments: t.function.arguments }));
      const stream = await client.chat.completions.create({ ...body, stream: true });
      const got = [];
      let finish = null;
      for await (const ch of stream) {
        for (const c of ch.choices) {
          finish = c.finish_reason ?? finish;
          for (const d of c.delta.tool_calls ?? []) {
            got[d.index] ??= { name: "", arguments: "" };
            if (d.function?.name) got[d.index].name += d.function.name;
            if (d.function?.arguments) got[d.index].arguments += d.function.arguments;
          }
        }
      }
      assert.deepEqual(got, want);
      assert.equal(finish, "tool_calls");
    }
  }
});

await check("SDK streaming helper sees the forced tool calls", async () => {
  const runner = client.beta.chat.completions.stream({ model: qwen, messages: [{ role: "user", content: "Weather?" }], tools, tool_choice: { type: "function", function: { name: "get_weather" } }, temperature: 1, seed: 11, max_tokens: 256 });
  const done = [];
  runner.on("tool_calls.function.arguments.done", (e) => done.push(e));
  const final = await runner.finalChatCompletion();
  checkCalls(final.choices[0].message, { only: "get_weather" });
  assert.equal(done.length, final.choices[0].message.tool_calls.length);
  assert.equal(done[0].name, "get_weather");
});

// ---- the SDK's structured-output helper -----------------------------------------------
await check("zodResponseFormat + chat.completions.parse", async () => {
  const { z } = await import("zod");
  const { zodResponseFormat } = await import("openai/helpers/zod");
  // Strings bounded by patterns: zod's .max() counts UTF-16 units, JSON
  // Schema's maxLength code points, so a bounded free string with an emoji
  // is valid JSON Schema but may fail zod.
  const Step = z.object({ explanation: z.string().regex(/^[a-z ]{0,16}$/), output: z.enum(["yes", "no"]) });
  const Answer = z.object({ steps: z.array(Step).max(2), final_answer: z.string().regex(/^[0-9]{1,4}$/), confident: z.boolean(), tries: z.number().int().min(0).max(9), unit: z.enum(["kg", "m"]).nullable() });
  const parse = client.chat.completions.parse ? client.chat.completions.parse.bind(client.chat.completions) : client.beta.chat.completions.parse.bind(client.beta.chat.completions);
  for (const model of corpusModels) {
    for (const temperature of [0, 1]) {
      const r = await parse({ model, messages, temperature, seed: 21, max_tokens: 512, response_format: zodResponseFormat(Answer, "answer") });
      const msg = r.choices[0].message;
      assert.equal(r.choices[0].finish_reason, "stop", msg.content);
      assert.ok(msg.parsed, msg.content);
      Answer.parse(msg.parsed);
    }
  }
});

// zod 4 (the `zod/v4` API) through openai 6's zodResponseFormat, which
// sends z.toJSONSchema's draft-7 output: formats with zod's own patterns,
// exclusiveMinimum, decimal minimum, multipleOf. Each field 20 times at
// temperature 1 (5 in quick mode) on a random-weight Qwen3 fixture: HTTP 200,
// finish "stop", and zod's parse accepts the value (the SDK's parse and ours).
await check("zod 4 formats and number checks: 200 and zod's parse accepts", async () => {
  const { z } = await import("zod/v4");
  const { default: OpenAI6 } = await import("openai-v6");
  const { zodResponseFormat } = await import("openai-v6/helpers/zod");
  const client6 = new OpenAI6({ baseURL: `${baseURL}/v1`, apiKey: "none", maxRetries: 2, timeout: 300_000 });
  const fields = {
    email: z.email(), uuid: z.uuid(), url: z.url(), date: z.iso.date(), datetime: z.iso.datetime(),
    positive: z.number().positive(), min_half: z.number().min(0.5), multiple_of_5: z.number().multipleOf(5),
  };
  const runs = mode === "quick" ? 5 : 20;
  const tasks = [];
  for (const [name, field] of Object.entries(fields)) {
    const Schema = z.object({ v: field });
    for (let seed = 0; seed < runs; seed++) {
      tasks.push(async () => {
        try {
          const r = await client6.chat.completions.parse({ model: qwen, messages, temperature: 1, seed, max_tokens: 512, response_format: zodResponseFormat(Schema, name) });
          const c = r.choices[0];
          if (c.finish_reason !== "stop") return `${name} seed ${seed}: finish_reason ${c.finish_reason}: ${c.message.content}`;
          const ok = Schema.safeParse(JSON.parse(c.message.content));
          if (!ok.success) return `${name} seed ${seed}: zod rejects ${c.message.content}: ${ok.error.message}`;
          if (JSON.stringify(c.message.parsed) !== JSON.stringify(ok.data)) return `${name} seed ${seed}: SDK parsed ${JSON.stringify(c.message.parsed)}`;
          return null;
        } catch (e) {
          return `${name} seed ${seed}: ${e.status ?? ""} ${e.message}`;
        }
      });
    }
  }
  const started = Date.now();
  const failures = (await pool(tasks, 8)).filter((f) => f !== null);
  console.log(`# zod 4: ${tasks.length} answers, ${tasks.length - failures.length} accepted by zod, ${((Date.now() - started) / 1000).toFixed(1)} s`);
  assert.deepEqual(failures, []);
});

console.log(`# ${passed} checks passed`);
