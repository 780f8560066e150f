// dashboard.test.mjs - kt-serve's GET /dashboard in a real browser: Debian's
// chromium, headless, driven by playwright-core (pinned in package-lock.json).
//
//   node dashboard.test.mjs PORT SCREENSHOT.png [CHROMIUM [API_KEY]]
//
// Loads the page from the kt-serve on 127.0.0.1:PORT, waits for the expert
// heat map to fill, checks it against /kt/placement (one cell per expert of
// every MoE layer, each at one of the places), that the counters show
// numbers, that the page reached no other host and logged no error, saves a
// screenshot, then cuts the page off the server and checks it says so
// without throwing.  Exits 1 with the reasons on any failure.
// tests/test_dashboard.c starts the server and runs this.
import { chromium } from 'playwright-core';

const [port, screenshot, executablePath = '/usr/bin/chromium', key] = process.argv.slice(2);
if (!port || !screenshot) {
  console.error('usage: node dashboard.test.mjs PORT SCREENSHOT.png [CHROMIUM [API_KEY]]');
  process.exit(2);
}
const origin = `http://127.0.0.1:${port}`;
const failures = [];
const check = (ok, what) => {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}`);
  if (!ok) failures.push(what);
};
const isNumber = (text) => text !== null && /^-?\d+(\.\d+)?$/.test(text.trim());

const browser = await chromium.launch({ executablePath, args: ['--no-sandbox'], headless: true });
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors = [], foreign = [];
  page.on('console', (m) => m.type() === 'error' && errors.push(`console: ${m.text()}`));
  page.on('pageerror', (e) => errors.push(`page error: ${e.message}`));
  page.on('request', (r) => new URL(r.url()).origin !== origin && foreign.push(r.url()));

  const response = await page.goto(`${origin}/dashboard` + (key ? `#key=${key}` : ''));
  check(response.status() === 200 && /^text\/html/.test(response.headers()['content-type']),
    `GET /dashboard answers 200 text/html (${response.status()} ${response.headers()['content-type']})`);
  await page.waitForSelector('#heatmap[data-filled="true"]', { timeout: 30000 });
  // rates need two polls; wait for the first rate, then for a poll after it
  await page.waitForFunction(() => /\d/.test(document.getElementById('gen-rate').textContent), null,
    { timeout: 10000 });
  await page.waitForTimeout(1500);

  const placement = await (await fetch(`${origin}/kt/placement`,
    { headers: key ? { Authorization: `Bearer ${key}` } : {} })).json();
  const moe = placement.layers.filter((l) => l.moe);
  const names = placement.places.map((p) => p.name);
  const shown = await page.$$eval('#heatmap .cell', (cells) => cells.map((c) => ({
    layer: +c.dataset.layer, expert: +c.dataset.expert, place: c.dataset.place, heat: +c.dataset.heat,
    title: c.title,
  })));
  check(moe.length > 0 && shown.length === moe.length * placement.n_expert,
    `the heat map has ${moe.length} MoE layers x ${placement.n_expert} experts = ` +
    `${moe.length * placement.n_expert} cells (${shown.length})`);
  const layers = [...new Set(shown.map((c) => c.layer))].join(',');
  check(layers === moe.map((l) => l.layer).join(','), `one row per MoE layer (${layers})`);
  const stray = shown.filter((c) => !names.includes(c.place));
  check(stray.length === 0, `every cell lives at one of the places ${JSON.stringify(names)}` +
    (stray.length ? ` (layer ${stray[0].layer} expert ${stray[0].expert}: "${stray[0].place}")` : ''));
  const held = names.map((n) => shown.filter((c) => c.place === n).length);
  const served = names.map((_, f) => moe.reduce((k, l) => k + l.place.filter((q) => q === f).length, 0));
  check(held.join(',') === served.join(','), `each place holds the experts the server says (${held.join(', ')})`);
  check(shown.some((c) => c.heat > 0) && shown.every((c) => c.heat >= 0 && c.heat <= 1), 'heat in 0..1, some > 0');
  check(shown.every((c) => c.title.includes(`expert ${c.expert}`)), 'every cell has a tooltip naming its expert');
  const legend = await page.textContent('#legend');
  check(names.every((n) => legend.includes(n)), `the legend names every place (${legend})`);

  for (const id of ['gen-rate', 'prompt-rate', 'running', 'waiting', 'kv-use', 'steps']) {
    const text = await page.textContent(`#${id}`);
    check(isNumber(text), `#${id} shows a number (${JSON.stringify(text)})`);
  }
  const kvWidth = await page.$eval('#kv-bar', (d) => d.style.width);
  check(/^\d+(\.\d+)?%$/.test(kvWidth), `the KV cache bar has a width (${kvWidth})`);
  check((await page.textContent('#state')) === 'ready', 'the state is ready');
  const rebalancer = await page.textContent('#rb-enabled');
  check(rebalancer === (placement.rebalancer ? (placement.rebalancer.enabled ? 'on' : 'off') : 'n/a'),
    `the rebalancer shows as ${rebalancer}`);
  const migrations = await page.$$eval('#migrations tr', (rows) => rows.map((r) => r.textContent));
  const expected = (placement.migrations || []).length;
  check(expected ? migrations.length >= 1 && /layer \d+ expert \d+: .+ \u2192 .+ MiB/.test(migrations[0])
    : migrations.length === 1 && /none yet/.test(migrations[0]),
  `the migrations list (${expected} on the server): ${JSON.stringify(migrations.slice(0, 2))}`);
  const cache = placement.expert_cache;
  const cacheHit = await page.textContent('#cache-hit');
  check(cache ? isNumber(cacheHit) : cacheHit === 'off', `the expert cache's hit rate shows as ${cacheHit}`);
  const cachedCells = await page.$$eval('#heatmap .cell.cached', (cells) =>
    cells.map((c) => `${c.dataset.layer}:${c.dataset.expert}`).sort().join(' '));
  const cachedServer = moe.flatMap((l) => (l.cached || []).map((x) => `${l.layer}:${x}`)).sort().join(' ');
  check(cachedCells === cachedServer && (!cache || cachedServer !== ''),
    `the cached experts are marked (${cachedCells || 'none'}; the server: ${cachedServer || 'none'})`);
  check((await page.textContent('#error')) === '', 'no poll failed');

  await page.screenshot({ path: screenshot, type: 'png', fullPage: true });
  console.log(`screenshot: ${screenshot}`);
  check(errors.length === 0, `no console or page errors${errors.length ? ': ' + errors.join('; ') : ''}`);
  check(foreign.length === 0, `no request left ${origin}${foreign.length ? ': ' + foreign.join(', ') : ''}`);

  // the server goes away: the page says so and keeps polling, throwing nothing
  const thrown = [];
  page.on('pageerror', (e) => thrown.push(e.message));
  await page.route('**/kt/*', (route) => route.abort('connectionrefused'));
  await page.waitForFunction(() => document.getElementById('error').textContent !== '', null, { timeout: 10000 });
  await page.waitForTimeout(1500);
  check((await page.textContent('#state')) === 'unreachable', 'a dead server shows as unreachable');
  check(thrown.length === 0, `no page error while the server is away${thrown.length ? ': ' + thrown.join('; ') : ''}`);
  await page.unroute('**/kt/*');
  await page.waitForFunction(() => document.getElementById('error').textContent === '', null, { timeout: 10000 });
  check(true, 'the error line clears when the server answers again');
} catch (e) {
  check(false, `the page did not behave: ${e.message}`);
} finally {
  await browser.close();
}
if (failures.length) {
  console.error(`dashboard: ${failures.length} check(s) failed:\n  ${failures.join('\n  ')}`);
  process.exit(1);
}
console.log('dashboard: all checks passed');
