// Opens ocrctl serve's upload page in headless Chromium, uploads one file through the
// page's file input and prints {"text", "status"} as JSON once the markdown has streamed in.
// Usage: node upload.mjs http://127.0.0.1:PORT/ path/to/page.png [MAX_TOKENS]
// (greedy: the temperature field is set to 0).
import { chromium } from "playwright-core";

const [url, file, maxTokens] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox"],
});
try {
  const page = await browser.newPage();
  await page.goto(url);
  if (maxTokens) await page.fill("#max", maxTokens);
  await page.fill("#temp", "0");
  await page.setInputFiles("#file", file);
  await page.waitForSelector("body[data-done='1']", { timeout: 120000 });
  const text = await page.textContent("#out");
  const status = await page.textContent("#status");
  console.log(JSON.stringify({ text, status }));
} finally {
  await browser.close();
}
