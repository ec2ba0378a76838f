// Drives bonsai's web chat page (GET /) in Debian's headless Chromium with
// playwright-core, as a person would: open it, see the model list, send a
// message, watch the answer stream in, stop a long answer, start a new chat,
// reload and find the conversations kept. Writes a screenshot.
//   node chat_page_test.mjs URL CHROMIUM_PATH SCREENSHOT_PNG
// Exits non-zero on the first failed check.
import { chromium } from "playwright-core";

const [url, chromiumPath, shot] = process.argv.slice(2);
const fail = (msg) => { console.error("not ok - " + msg); process.exitCode = 1; throw new Error(msg); };
const ok = (msg) => console.log("ok - " + msg);

const browser = await chromium.launch({ executablePath: chromiumPath, args: ["--no-sandbox"] });
try {
  const page = await browser.newPage({ viewport: { width: 1100, height: 700 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  await page.goto(url, { waitUntil: "load" });

  // The model picker fills from /v1/models.
  await page.waitForFunction(() => document.querySelectorAll("#model option").length > 0, null, { timeout: 10000 });
  const models = await page.$$eval("#model option", (os) => os.map((o) => o.value));
  if (!models.includes("stories")) fail("model list lacks 'stories': " + JSON.stringify(models));
  ok("model picker lists " + models.join(", "));

  // A short answer streams in and completes (Send enabled again, Stop disabled).
  await page.click("#toggle-settings");
  await page.fill("#max_tokens", "24");
  await page.fill("#temperature", "0");
  await page.fill("#input", "Once upon a time");
  await page.click("#send");
  await page.waitForFunction(() => {
    const a = document.querySelectorAll(".msg.assistant .content");
    return a.length === 1 && a[0].textContent.trim().length > 0;
  }, null, { timeout: 20000 });
  await page.waitForFunction(() => !document.querySelector("#send").disabled, null, { timeout: 30000 });
  const first = await page.textContent(".msg.assistant .content");
  if (first.trim().length < 5) fail("answer too short: " + JSON.stringify(first));
  ok("streamed answer: " + JSON.stringify(first.trim().slice(0, 60)));
  if (!(await page.textContent(".msg.user")).includes("Once upon a time")) fail("user message not shown");

  // A long answer is stopped mid-stream. The model writes ~1,600 tokens/s, so
  // the page's download is throttled (Chromium network emulation, 3 KB/s:
  // a few SSE chunks a second) to make "mid-stream" certain, not a race.
  const cdp = await page.context().newCDPSession(page);
  await cdp.send("Network.enable");
  await cdp.send("Network.emulateNetworkConditions",
                 { offline: false, latency: 0, downloadThroughput: 3000, uploadThroughput: -1 });
  await page.fill("#max_tokens", "300");
  await page.fill("#input", "Tell a long story");
  await page.click("#send");
  await page.waitForFunction(() => {
    const a = document.querySelectorAll(".msg.assistant .content");
    return a.length === 2 && a[1].textContent.trim().length > 0;
  }, null, { timeout: 20000 });
  if (await page.isDisabled("#stop")) fail("Stop is disabled while streaming");
  await page.click("#stop");
  await page.waitForFunction(() => !document.querySelector("#send").disabled, null, { timeout: 10000 });
  await cdp.send("Network.emulateNetworkConditions",
                 { offline: false, latency: 0, downloadThroughput: -1, uploadThroughput: -1 });
  const stopped = await page.$$eval(".msg.assistant .content", (a) => a[1].textContent);
  await page.waitForTimeout(500);
  const later = await page.$$eval(".msg.assistant .content", (a) => a[1].textContent);
  if (later !== stopped) fail("text kept growing after Stop");
  // The whole answer (same request, greedy, not streamed) is longer.
  const full = await page.evaluate(async () => {
    const r = await fetch("/v1/chat/completions", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model: "stories", max_tokens: 300, temperature: 0, top_p: 0.95,
                             messages: [{ role: "user", content: "Once upon a time" },
                                        { role: "assistant", content: document.querySelectorAll(".msg.assistant .content")[0].textContent },
                                        { role: "user", content: "Tell a long story" }] }),
    });
    return (await r.json()).choices[0].message.content;
  });
  if (!(stopped.trim().length < full.trim().length)) {
    fail(`Stop did not cut the answer (${stopped.length} chars shown, whole answer ${full.length})`);
  }
  ok(`Stop ended the stream (${stopped.trim().length} of ${full.trim().length} chars)`);

  await page.screenshot({ path: shot });
  ok("screenshot " + shot);

  // New chat: empty message list, two conversations in the sidebar.
  await page.click("#new-chat");
  if ((await page.$$(".msg")).length !== 0) fail("new chat is not empty");
  if ((await page.$$("#chats li")).length !== 2) fail("sidebar does not list two chats");
  ok("new chat");

  // Conversations survive a reload (localStorage).
  await page.reload({ waitUntil: "load" });
  if ((await page.$$("#chats li")).length !== 2) fail("chats lost on reload");
  await page.click("#chats li:nth-child(2)");
  if ((await page.$$(".msg")).length !== 4) fail("first chat does not have its 4 messages after reload");
  ok("conversations kept across reload");

  if (errors.length) fail("page errors: " + errors.join("; "));
  ok("no page errors");
} finally {
  await browser.close();
}
