// Drives the relay's web console in Debian's Chromium for crates/outbox-cli/tests/console.rs:
// the numbers move while events flow, a dead letter is found, shown, explained (`why`),
// retried by a click, and then told as delivered. Every wait follows the page's readiness
// (waitFor / waitForFunction), none is a fixed sleep.
//
// Environment (set by the Rust test):
//   OUTBOX_UI_URL        base URL of the relay's metrics listener, e.g. http://127.0.0.1:9187
//   OUTBOX_CHROMIUM      the browser (default /usr/bin/chromium)
//   OUTBOX_POISON_TYPE   the event type of the dead letter to find
//   OUTBOX_POISON_TEXT   a piece of its payload the detail must show
//   OUTBOX_SCREENSHOT    when set, the path of the screenshot to write
//
// Prints `FIGURES {json}` (page weight and load timings) and `OK ...` lines; exits 1 on failure.
import { chromium } from "playwright-core";

const base = process.env.OUTBOX_UI_URL;
const poisonType = process.env.OUTBOX_POISON_TYPE;
const poisonText = process.env.OUTBOX_POISON_TEXT;
const screenshot = process.env.OUTBOX_SCREENSHOT;
if (!base || !poisonType || !poisonText) {
  console.error("OUTBOX_UI_URL, OUTBOX_POISON_TYPE and OUTBOX_POISON_TEXT must be set");
  process.exit(2);
}
const step = (what) => console.log("OK " + what);
const DASH = "\u2013";
const count = (text) => Number(String(text).replace(/[^0-9]/g, ""));

const browser = await chromium.launch({
  executablePath: process.env.OUTBOX_CHROMIUM || "/usr/bin/chromium",
  headless: true,
  // Root needs --no-sandbox; the rest keeps Chromium off the (closed) network.
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"],
});
const problems = [];
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 1100 }, colorScheme: "light" });
  const page = await context.newPage();
  page.setDefaultTimeout(45_000);
  page.on("pageerror", (e) => problems.push("page error: " + e.message));
  page.on("console", (m) => { if (m.type() === "error") problems.push("console error: " + m.text()); });

  // Load, and measure what loading cost.
  const response = await page.goto(base + "/ui", { waitUntil: "load" });
  if (response.status() !== 200) throw new Error("GET /ui answered " + response.status());
  await page.waitForFunction((dash) => document.getElementById("published").textContent !== dash, DASH);
  const figures = await page.evaluate(() => {
    const nav = performance.getEntriesByType("navigation")[0];
    const assets = performance.getEntriesByType("resource")
      .filter((r) => /\/ui\/console\.(js|css)$/.test(r.name))
      .map((r) => ({ name: new URL(r.name).pathname, bytes: r.encodedBodySize }));
    const overview = performance.getEntriesByType("resource").find((r) => r.name.includes("/ui/api/overview"));
    return {
      html_bytes: nav.encodedBodySize,
      assets,
      page_bytes: nav.encodedBodySize + assets.reduce((n, a) => n + a.bytes, 0),
      dom_content_loaded_ms: Math.round(nav.domContentLoadedEventEnd),
      load_ms: Math.round(nav.loadEventEnd),
      first_numbers_ms: Math.round(performance.now()),
      first_overview_bytes: overview ? overview.encodedBodySize : null,
    };
  });
  console.log("FIGURES " + JSON.stringify(figures));
  step("loaded /ui: " + figures.page_bytes + " bytes, load event at " + figures.load_ms + " ms");

  // The numbers move while events flow.
  const before = count(await page.locator("#published").textContent());
  await page.waitForFunction(
    ([start, dash]) => {
      const text = document.getElementById("published").textContent;
      return text !== dash && Number(text.replace(/[^0-9]/g, "")) >= start + 5;
    },
    [before, DASH],
  );
  const after = count(await page.locator("#published").textContent());
  step("published count moved from " + before + " to " + after);
  await page.locator("#c-rate polyline").waitFor();
  await page.locator("#c-pending polyline").waitFor();
  step("charts drawn");
  await page.locator("#sinks tbody td.ok", { hasText: "up" }).waitFor();
  step("sink shown up");

  // Find the dead letter by filtering on its type, and show it.
  await page.fill("#dead-filter input[name=type]", poisonType);
  await page.click("#dead-filter button[type=submit]");
  const row = page.locator("#dead-list tbody tr", { hasText: poisonType });
  await row.waitFor();
  const id = (await row.locator("button.id").textContent()).trim();
  step("dead letter listed: " + id);
  await row.locator("button.id").click();
  await page.waitForFunction(
    ([text]) => {
      const t = document.getElementById("detail-text").textContent;
      return t.includes("payload") && t.includes(text) && t.includes("422");
    },
    [poisonText],
  );
  step("dead letter shown with payload, headers and last error");
  await page.click("#detail-why");
  await page.locator("#why-text", { hasText: "dead-lettered at" }).waitFor();
  step("why tells it is dead-lettered");
  if (screenshot) {
    // A picture worth keeping: let the charts fill for a while first.
    await page.waitForFunction(() => Number(document.getElementById("span").dataset.seconds) >= 30, null, { timeout: 90_000 });
    await page.screenshot({ path: screenshot, fullPage: true });
    step("screenshot written to " + screenshot);
  }

  // Retry by a click; the relay delivers it.
  await page.locator("#detail-retry").click();
  await page.locator("#message", { hasText: "1 dead letter(s) put back in line" }).waitFor();
  await row.waitFor({ state: "detached" });
  step("retried: gone from the dead letters");
  // The why box keeps telling the story it shows at every refresh, until delivery.
  await page.locator("#why-text", { hasText: "delivered at" }).waitFor();
  step("why tells it was delivered");
  if (problems.length) throw new Error(problems.join("\n"));
  step("no page errors");
} catch (e) {
  console.error("FAILED: " + (e && e.stack ? e.stack : e));
  if (problems.length) console.error(problems.join("\n"));
  await browser.close();
  process.exit(1);
}
await browser.close();
