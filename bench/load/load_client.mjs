// Load client for `bonsai serve` (run by bench/load/load_test.sh). Node's
// built-in fetch, no dependencies.
//
// 1. Solo phase: every (model, prompt, seed) case once, non-streamed, one
//    at a time: the reference answers.
// 2. Load phase: CLIENTS concurrent streaming clients for DURATION seconds,
//    each looping over the cases; every completed stream's text must equal
//    the solo answer. 503s (deliberate overload, with Retry-After) are
//    counted and retried after a short pause; any other non-200 is an error.
// Prints one JSON object with the figures on stdout.
// Usage: node load_client.mjs URL CLIENTS DURATION_S MAX_TOKENS MODEL...
const [url, clientsArg, durationArg, maxTokensArg, ...models] = process.argv.slice(2);
const CLIENTS = Number(clientsArg);
const DURATION_MS = Number(durationArg) * 1000;
const MAX_TOKENS = Number(maxTokensArg);
const prompts = [
  "Once upon a time",
  "The little dog",
  "Lily wanted to",
  "One day, Tom and Sue",
  "The sun was",
  "In the big forest",
  "Ben had a red ball",
  "Mom said",
];
const cases = [];
for (const model of models)
  for (let i = 0; i < prompts.length; i++) cases.push({ model, prompt: prompts[i], seed: 1000 + i });

function body(c, stream) {
  return JSON.stringify({
    model: c.model, prompt: c.prompt, seed: c.seed, max_tokens: MAX_TOKENS, temperature: 0.8, stream,
  });
}

async function solo(c) {
  const r = await fetch(`${url}/v1/completions`, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: body(c, false),
  });
  if (r.status !== 200) throw new Error(`solo ${c.model}/${c.prompt}: HTTP ${r.status} ${await r.text()}`);
  const j = await r.json();
  return j.choices[0].text;
}

// One streamed request: status, text, time to first byte of content, tokens (chunks).
async function streamed(c) {
  const t0 = performance.now();
  const r = await fetch(`${url}/v1/completions`, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: body(c, true),
  });
  if (r.status !== 200) {
    await r.text();
    return { status: r.status, retryAfter: r.headers.get("retry-after") };
  }
  const decoder = new TextDecoder();
  let buf = "", text = "", ttft = null, done = false, finish = null, error = null;
  for await (const part of r.body) {
    buf += decoder.decode(part, { stream: true });
    let k;
    while ((k = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, k);
      buf = buf.slice(k + 2);
      if (!ev.startsWith("data: ")) continue;
      const data = ev.slice(6);
      if (data === "[DONE]") { done = true; continue; }
      const j = JSON.parse(data);
      if (j.error) { error = j.error; continue; }
      for (const ch of j.choices) {
        if (ch.text && ttft === null) ttft = performance.now() - t0;
        text += ch.text ?? "";
        if (ch.finish_reason) finish = ch.finish_reason;
      }
    }
  }
  return { status: 200, text, ttft, done, finish, error, ms: performance.now() - t0 };
}

function pct(a, p) {
  if (!a.length) return 0;
  const s = [...a].sort((x, y) => x - y);
  return s[Math.max(0, Math.ceil((p / 100) * s.length) - 1)];
}

const reference = new Map();
for (const c of cases) reference.set(`${c.model}|${c.prompt}|${c.seed}`, await solo(c));

const stats = { completed: 0, mismatches: 0, overload503: 0, other_errors: 0, no_done: 0, stream_errors: 0,
                statuses: {}, ttft_ms: [], chars: 0 };
const mismatchSamples = [];
const t_start = performance.now();
async function client(id) {
  let i = id;
  while (performance.now() - t_start < DURATION_MS) {
    const c = cases[i++ % cases.length];
    let r;
    try {
      r = await streamed(c);
    } catch (e) {
      stats.other_errors++;
      stats.statuses.exception = (stats.statuses.exception ?? 0) + 1;
      await new Promise((res) => setTimeout(res, 100));
      continue;
    }
    stats.statuses[r.status] = (stats.statuses[r.status] ?? 0) + 1;
    if (r.status === 503) {
      stats.overload503++;
      await new Promise((res) => setTimeout(res, 50 + Math.random() * 100));
      continue;
    }
    if (r.status !== 200) { stats.other_errors++; continue; }
    if (r.error) { stats.stream_errors++; continue; }
    if (!r.done) { stats.no_done++; continue; }
    stats.completed++;
    stats.chars += r.text.length;
    if (r.ttft !== null) stats.ttft_ms.push(r.ttft);
    const want = reference.get(`${c.model}|${c.prompt}|${c.seed}`);
    if (r.text !== want) {
      stats.mismatches++;
      if (mismatchSamples.length < 3) mismatchSamples.push({ case: c, want, got: r.text });
    }
  }
}
await Promise.all(Array.from({ length: CLIENTS }, (_, k) => client(k)));
const elapsed = (performance.now() - t_start) / 1000;
console.log(JSON.stringify({
  clients: CLIENTS, duration_s: Number(elapsed.toFixed(1)), cases: cases.length, models,
  completed: stats.completed, completed_per_s: Number((stats.completed / elapsed).toFixed(2)),
  mismatches: stats.mismatches, overload_503: stats.overload503, other_errors: stats.other_errors,
  stream_errors: stats.stream_errors, missing_done: stats.no_done, statuses: stats.statuses,
  ttft_p50_ms: Number(pct(stats.ttft_ms, 50).toFixed(1)), ttft_p95_ms: Number(pct(stats.ttft_ms, 95).toFixed(1)),
  mismatch_samples: mismatchSamples,
}));
