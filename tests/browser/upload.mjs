// Opens ocrctl serve's upload page in headless Chromium, gives it files and prints as JSON
// what it shows once every document has streamed in: the shown markdown, the status line,
// every status line shown on the way, the failures listed, each document's entry, and each
// document's "Download .md" file (name and text).
// Usage: node upload.mjs [--drop] http://127.0.0.1:PORT/ MAX_TOKENS FILE...
// One file goes through the page's file input; with --drop, the files are dropped on the
// drop zone together (a DataTransfer of them). Greedy: the temperature field is set to 0.
import { chromium } from "playwright-core";
import { readFile } from "node:fs/promises";
import { basename } from "node:path";

const args = process.argv.slice(2);
const dropped = args[0] === "--drop";
const [url, maxTokens, ...files] = dropped ? args.slice(1) : args;
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox"],
});

// Drops `files` on the drop zone as a browser does: one DataTransfer holding them all.
async function dropFiles(page, files) {
  const payload = [];
  for (const f of files) {
    payload.push({ name: basename(f), b64: (await readFile(f)).toString("base64") });
  }
  const transfer = await page.evaluateHandle((items) => {
    const dt = new DataTransfer();
    for (const { name, b64 } of items) {
      const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
      const type = name.endsWith(".pdf") ? "application/pdf" : "image/png";
      dt.items.add(new File([bytes], name, { type }));
    }
    return dt;
  }, payload);
  await page.dispatchEvent("#drop", "drop", { dataTransfer: transfer });
}

// Each document's "Download .md": shown by its entry, then downloaded.
async function downloads(page) {
  const out = [];
  const entries = await page.$$("#docs button");
  for (const entry of entries) {
    await entry.click();
    const [dl] = await Promise.all([page.waitForEvent("download"), page.click("#download")]);
    const path = await dl.path();
    out.push({ name: dl.suggestedFilename(), text: await readFile(path, "utf8") });
  }
  return out;
}

try {
  const context = await browser.newContext({ acceptDownloads: true });
  const page = await context.newPage();
  await page.goto(url);
  if (maxTokens) await page.fill("#max", maxTokens);
  await page.fill("#temp", "0");
  if (dropped) await dropFiles(page, files);
  else await page.setInputFiles("#file", files);
  await page.waitForSelector("body[data-done='1']", { timeout: 120000 });
  const result = {
    text: await page.textContent("#out"),
    status: await page.textContent("#status"),
    statusClass: await page.getAttribute("#status", "class"),
    history: await page.evaluate(() => window.ocrStatus),
    failures: await page.$$eval("#failures li", (lis) => lis.map((li) => li.textContent)),
    docs: await page.$$eval("#docs button", (bs) => bs.map((b) => b.textContent)),
  };
  result.downloads = await downloads(page);
  console.log(JSON.stringify(result));
} finally {
  await browser.close();
}
