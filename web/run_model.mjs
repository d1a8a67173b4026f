// Runs a .tflite in headless Chromium through runner.html and prints its outputs as JSON.
//   node run_model.mjs <page url> <model url> <inputs.json> [signature] [--snippet=<module url>]
// With --snippet the model is loaded and run by that ES module (the web target's generated snippet).
// inputs.json: {inputName: {dtype, shape, data}}. Output on stdout: {outputName: {dtype, shape, data}}.
// The page and the model must be served from 127.0.0.1 (see tests/targets/web_harness.py).
import {chromium} from 'playwright-core';
import {mkdtempSync, readFileSync, rmSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';

const flags = process.argv.slice(2).filter((a) => a.startsWith('--'));
const [pageUrl, modelUrl, inputsPath, signature] = process.argv.slice(2).filter((a) => !a.startsWith('--'));
const snippet = (flags.find((f) => f.startsWith('--snippet=')) || '').slice('--snippet='.length) || null;
if (!pageUrl || !modelUrl || !inputsPath) {
  console.error('usage: node run_model.mjs <page url> <model url> <inputs.json> [signature]');
  process.exit(2);
}
const inputs = JSON.parse(readFileSync(inputsPath, 'utf8'));
// A fresh profile every run, and every background service off: the test machine has no network.
const profile = mkdtempSync(join(tmpdir(), 'litertjs-chromium-'));
// playwright passes the profile as --user-data-dir itself (launchPersistentContext).
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: [
    '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
  ],
});
let code = 0;
try {
  const page = await browser.newPage();
  const logs = [];
  page.on('console', (m) => logs.push(`[${m.type()}] ${m.text()}`));
  page.on('pageerror', (e) => logs.push(`[pageerror] ${e.message}`));
  await page.goto(pageUrl);
  await page.waitForFunction(() => window.liteRtReady || window.liteRtError, null, {timeout: 60000});
  const err = await page.evaluate(() => window.liteRtError);
  if (err) throw new Error(`LiteRT.js failed to load: ${err}\n${logs.join('\n')}`);
  const out = snippet
    ? await page.evaluate(([mod, url, ins, sig]) => window.runSnippet(mod, url, ins, sig),
                          [snippet, modelUrl, inputs, signature || null])
    : await page.evaluate(([url, ins, sig]) => window.runModel(url, ins, sig), [modelUrl, inputs, signature || null]);
  process.stdout.write(JSON.stringify(out));
  if (logs.length) process.stderr.write(logs.join('\n') + '\n');
} catch (e) {
  console.error(String(e && e.stack || e));
  code = 1;
} finally {
  await browser.close();
  rmSync(profile, {recursive: true, force: true});
}
process.exit(code);
