#!/usr/bin/env node
// `npm run bench:browser -- [the flags of npm run bench] [--peer 0] [--peer-model tiny|4b] [--peer-prompt N] [--peer-steps N] [--json FILE]`
// The benchmark suite in headless Chromium: starts Vite on a free port, opens bench.html with the
// flags as URL parameters, prints the page's progress lines and its table, and writes the report
// as JSON with --json. The page is the same one a user opens in Chrome (npm start, /bench.html).
// Not part of the e2e run (playwright.config.ts): a benchmark, slow on SwiftShader, asserts nothing.
import { writeFileSync } from 'node:fs';
import { chromium } from '@playwright/test';
import { createServer } from 'vite';

const args = process.argv.slice(2);
const params = new URLSearchParams({ run: '' });
let json;
for (let i = 0; i < args.length; i++) {
  const a = args[i];
  if (!a.startsWith('--')) throw new Error(`bench:browser: unexpected argument '${a}' (flags are --name value)`);
  const name = a.slice(2);
  if (name === 'quick' || name === 'full') params.set(name, '');
  else if (name === 'json') json = args[++i];
  else if (i + 1 < args.length) params.set(name, args[++i]);
  else throw new Error(`bench:browser: --${name} needs a value`);
}

// No HMR and no file watching: an edit elsewhere in the tree must not reload the page mid-run.
const server = await createServer({
  server: { host: '127.0.0.1', port: 5211, strictPort: false, hmr: false, watch: null },
  logLevel: 'warn',
});
await server.listen();
const base = server.resolvedUrls?.local[0] ?? 'http://127.0.0.1:5211/';
// Debian's Chromium with SwiftShader gives headless WebGPU without a GPU (/work/shared/WEBGPU-TESTING.md).
const browser = await chromium.launch({
  executablePath: process.env.CHROME_PATH ?? '/usr/bin/chromium',
  args: [
    '--enable-unsafe-webgpu',
    '--enable-unsafe-swiftshader',
    '--use-angle=swiftshader',
    '--no-sandbox',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    '--no-first-run',
  ],
});
let failed = false;
try {
  const page = await browser.newPage();
  page.on('console', (msg) => {
    if (msg.type() === 'log') console.log(msg.text());
    else if (msg.type() === 'error') console.error(`[page] ${msg.text()}`);
  });
  page.on('pageerror', (e) => console.error(`[page error] ${e.message}`));
  const url = `${base}bench.html?${params.toString().replace(/=(&|$)/g, '$1')}`;
  console.log(`bench:browser: ${url}`);
  await page.goto(url, { timeout: 180_000 }); // Vite's first transform of the page can be slow on a loaded machine
  await page.waitForFunction(() => window.spyrlBench?.done === true, null, { timeout: 0, polling: 1000 });
  const state = await page.evaluate(() => window.spyrlBench);
  if (state.error) {
    console.error(`bench:browser: the page failed: ${state.error}`);
    failed = true;
  } else if (json) {
    writeFileSync(json, JSON.stringify(state.report, null, 2) + '\n');
    console.log(`\nreport written to ${json}`);
  }
} finally {
  await browser.close();
  await server.close();
}
process.exit(failed ? 1 : 0);
