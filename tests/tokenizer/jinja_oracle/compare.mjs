// Sends every conversation of a TEMPLATE.cases.json (oracle.mjs) to bonsai's
// POST /apply-template and compares the prompt byte for byte with
// @huggingface/jinja's; a conversation the reference refused must get a 400.
// Usage: node compare.mjs URL CASES_JSON NAME MIN_RENDERED
// Exit 1 on any difference, or when fewer than MIN_RENDERED conversations
// were rendered by both.
import fs from "node:fs";

const [url, casesPath, name, minRendered] = process.argv.slice(2);
const cases = JSON.parse(fs.readFileSync(casesPath, "utf8"));
let same = 0, refused = 0;
const failures = [];
for (let i = 0; i < cases.length; i++) {
  const c = cases[i];
  const res = await fetch(`${url}/apply-template`, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify(c.body) });
  const got = await res.json();
  if (c.error !== undefined) {
    if (res.status === 400) refused++;
    else failures.push(`case ${i}: the reference refused (${c.error}) but bonsai answered ${res.status}`);
    continue;
  }
  if (res.status !== 200) {
    failures.push(`case ${i}: bonsai answered ${res.status}: ${JSON.stringify(got)}`);
  } else if (got.prompt !== c.prompt) {
    failures.push(`case ${i}: prompts differ\n--- @huggingface/jinja\n${JSON.stringify(c.prompt)}\n--- bonsai\n${JSON.stringify(got.prompt)}`);
  } else {
    same++;
  }
}
console.log(`${name}: ${same} byte-identical, ${refused} refused by both, ${failures.length} differ`);
for (const f of failures.slice(0, 5)) console.log(f);
if (failures.length > 0 || same < Number(minRendered)) {
  if (same < Number(minRendered)) console.log(`${name}: FAIL: fewer than ${minRendered} conversations rendered`);
  process.exit(1);
}
