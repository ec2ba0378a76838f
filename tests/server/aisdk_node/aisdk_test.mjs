// @ai-sdk/openai's default provider (createOpenAI({baseURL})(model): the
// Responses API) and LangChain's ChatOpenAI with useResponsesApi: true
// against `bonsai serve` (issue 32's acceptance). Usage:
//   node aisdk_test.mjs BASE_URL API_KEY STORIES_MODEL QWEN_MODEL
import assert from 'node:assert/strict';
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, streamText, generateObject } from 'ai';
import { z } from 'zod';
import { ChatOpenAI } from '@langchain/openai';

const [base, key, stories, qwen] = process.argv.slice(2);
const provider = createOpenAI({ baseURL: `${base}/v1`, apiKey: key });
let failed = 0;
async function check(name, fn) {
  try {
    await fn();
    console.log(`ok - ${name}`);
  } catch (e) {
    failed++;
    console.log(`not ok - ${name}: ${e?.stack ?? e}`);
  }
}

// The same request through /v1/chat/completions (temperature 0) as the reference text.
async function chatText(model, prompt, maxTokens) {
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${key}` },
    body: JSON.stringify({ model, messages: [{ role: 'user', content: prompt }], max_tokens: maxTokens, temperature: 0 }),
  });
  assert.equal(r.status, 200);
  return (await r.json()).choices[0].message.content;
}

await check('generateText (Responses API) equals chat completions at temperature 0', async () => {
  const prompt = 'Once upon a time';
  const r = await generateText({ model: provider(stories), prompt, maxOutputTokens: 24, temperature: 0 });
  assert.ok(r.text.length > 0, 'empty text');
  assert.equal(r.text, await chatText(stories, prompt, 24));
  assert.equal(r.finishReason, 'length');
  assert.equal(r.usage.outputTokens, 24);
  assert.ok(r.usage.inputTokens > 0);
});

await check('streamText streams the same text as generateText', async () => {
  const prompt = 'The little dog';
  const whole = await generateText({ model: provider(stories), prompt, maxOutputTokens: 20, temperature: 0 });
  const s = streamText({ model: provider(stories), prompt, maxOutputTokens: 20, temperature: 0 });
  let text = '';
  let parts = 0;
  for await (const delta of s.textStream) {
    text += delta;
    parts++;
  }
  assert.ok(parts > 1, `one part only (${parts})`);
  assert.equal(text, whole.text);
  assert.equal(await s.finishReason, 'length');
});

await check('generateObject with a zod schema returns an object zod accepts', async () => {
  const schema = z.object({ name: z.string().max(12), age: z.number().int().min(0).max(120), tags: z.array(z.string().max(8)).max(3) });
  for (let i = 0; i < 3; i++) {
    const r = await generateObject({ model: provider(qwen), schema, prompt: 'Describe a person as JSON.', temperature: 1 });
    schema.parse(r.object);
  }
});

await check('LangChain ChatOpenAI with useResponsesApi: invoke and stream', async () => {
  const llm = new ChatOpenAI({
    model: stories, apiKey: key, configuration: { baseURL: `${base}/v1` }, useResponsesApi: true,
    temperature: 0, maxTokens: 16,
  });
  const msg = await llm.invoke('Once upon a time');
  const text = typeof msg.content === 'string' ? msg.content : msg.content.map((c) => c.text ?? '').join('');
  assert.equal(text, await chatText(stories, 'Once upon a time', 16));
  let streamed = '';
  for await (const chunk of await llm.stream('Once upon a time')) {
    streamed += typeof chunk.content === 'string' ? chunk.content : chunk.content.map((c) => c.text ?? '').join('');
  }
  assert.equal(streamed, text);
});

await check('LangChain withStructuredOutput (Responses API) parses with the schema', async () => {
  const llm = new ChatOpenAI({ model: qwen, apiKey: key, configuration: { baseURL: `${base}/v1` }, useResponsesApi: true, maxTokens: 200 });
  const schema = z.object({ city: z.string().max(16), population: z.number().int().min(0) });
  const out = await llm.withStructuredOutput(schema, { name: 'city' }).invoke('Name a city.');
  schema.parse(out);
});

console.log(failed === 0 ? 'all passed' : `${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
