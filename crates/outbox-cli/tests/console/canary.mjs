// Drives the console's canary tile in Debian's Chromium for crates/outbox-cli/tests/canary.rs:
// the tile appears, turns green with a latency once probes arrive, and its tooltip counts them.
// Every wait follows the page (waitForFunction), none is a fixed sleep.
//
// Environment (set by the Rust test):
//   OUTBOX_UI_URL     base URL of the relay's metrics listener, e.g. http://127.0.0.1:9187
//   OUTBOX_CHROMIUM   the browser (default /usr/bin/chromium)
//
// Prints `OK ...` lines; exits 1 on failure.
import { chromium } from "playwright-core";

const base = process.env.OUTBOX_UI_URL;
if (!base) {
  console.error("OUTBOX_UI_URL must be set");
  process.exit(2);
}
const browser = await chromium.launch({
  executablePath: process.env.OUTBOX_CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"],
});
const problems = [];
try {
  const page = await browser.newPage();
  page.setDefaultTimeout(45_000);
  page.on("pageerror", (e) => problems.push("page error: " + e.message));
  page.on("console", (m) => { if (m.type() === "error") problems.push("console error: " + m.text()); });
  const response = await page.goto(base + "/ui", { waitUntil: "load" });
  if (response.status() !== 200) throw new Error("GET /ui answered " + response.status());
  await page.waitForFunction(() => !document.getElementById("canary").hidden);
  console.log("OK the canary tile is shown");
  await page.waitForFunction(() => {
    const state = document.getElementById("canary-state");
    return state.className === "ok" && /\d( ms| s)$/.test(state.textContent);
  });
  const state = await page.textContent("#canary-state");
  const detail = await page.textContent("#canary-detail");
  console.log("OK the canary tile shows a latency: " + state + " (" + detail + ")");
  const title = await page.getAttribute("#canary", "title");
  const arrived = Number((/(\d+) arrived/.exec(title) || [])[1]);
  if (!(arrived >= 1) || !/0 lost, 0 out of order/.test(title)) {
    throw new Error("the tile's tooltip does not count the probes: " + title);
  }
  console.log("OK the tooltip counts the probes: " + title);
  if (problems.length) throw new Error(problems.join("; "));
} catch (e) {
  console.error("FAILED: " + e.message);
  process.exitCode = 1;
} finally {
  await browser.close();
}
