// Suite `soak`: a bounded soak test of the reference server on loopback. BENCH_SOAK_REQUESTS
// completion requests (default 30,000) from 32 connections over the base model and three
// adapters, while an admin loads and unloads an adapter every second (churn). Every request must
// succeed (0 lost: 200 with its 4 tokens), and the server's RSS must stay flat after warm-up: the
// mean RSS of the last quarter of the run within 10% of the second quarter's. The RSS curve is
// written to bench/results/soak.svg. The server runs in its own process.
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import autocannon from 'autocannon';
import { startServerChild } from './lib/child.js';
import { type BenchCase, RESULTS_DIR, writeResults } from './lib/harness.js';

const TOTAL = Number(process.env['BENCH_SOAK_REQUESTS'] ?? 30_000);
const CONNECTIONS = 32;
const ADMIN = 'soak-admin-key-0001';
const root = mkdtempSync(join(tmpdir(), 'stageml-soak-'));
cpSync('fixtures/peft-tiny/llama/adapters/o-r2', join(root, 'churn'), { recursive: true });
const load0 = readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
const server = await startServerChild({ executor: process.env['BENCH_EXECUTOR'] ?? 'auto', adminKey: ADMIN, adapterRoots: [root], maxBatch: 32, maxQueue: 256 });
const prompts = [
  [0, 52, 317, 335, 262, 438, 309, 487],
  [0, 54, 264, 479, 455, 278, 297, 316, 73],
  [0, 500, 72, 283, 10, 90, 11],
];
const models = ['llama', 'qv-r8', 'qv-r8', 'mlp-r4-rslora'];

const samples: { t: number; rss: number; done: number }[] = [];
let done = 0;
let lost = 0;
const t0 = performance.now();
const sampler = setInterval(() => {
  samples.push({ t: (performance.now() - t0) / 1000, rss: server.rssMiB(), done });
}, 500);

let churns = 0;
let churnFailures = 0;
const churnState = { stop: false };
const admin = (path: string, body: unknown): Promise<number> =>
  fetch(`${server.base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${ADMIN}` }, body: JSON.stringify(body) }).then(async (r) => {
    await r.arrayBuffer();
    return r.status;
  });
const churn = (async () => {
  while (!churnState.stop) {
    const name = `churn-${String(churns % 4)}`;
    const loaded = await admin('/v1/load_lora_adapter', { lora_name: name, lora_path: join(root, 'churn') });
    await new Promise((r) => setTimeout(r, 500));
    const unloaded = await admin('/v1/unload_lora_adapter', { lora_name: name });
    if (loaded !== 200 || unloaded !== 200) churnFailures++;
    churns++;
    await new Promise((r) => setTimeout(r, 500));
  }
})();

let i = 0;
const result = await autocannon({
  url: `${server.base}/v1/completions`,
  connections: CONNECTIONS,
  amount: TOTAL,
  timeout: 60,
  requests: [
    {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      setupRequest: (req) => {
        const k = i++;
        return { ...req, body: JSON.stringify({ model: models[k % models.length], prompt: prompts[k % prompts.length], max_tokens: 4, temperature: 0, ignore_eos: true }) };
      },
      onResponse: (status, body) => {
        done++;
        if (status !== 200 || (JSON.parse(body) as { usage?: { completion_tokens?: number } }).usage?.completion_tokens !== 4) lost++;
      },
    },
  ],
});
churnState.stop = true;
await churn;
clearInterval(sampler);
samples.push({ t: (performance.now() - t0) / 1000, rss: server.rssMiB(), done });
await server.stop();
rmSync(root, { recursive: true, force: true });
const load1 = readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
lost += result.errors + result.timeouts + Math.max(0, TOTAL - done);

const quarter = (k: number): number => {
  const n = samples.length;
  const part = samples.slice(Math.floor((n * k) / 4), Math.max(Math.floor((n * k) / 4) + 1, Math.floor((n * (k + 1)) / 4)));
  return part.reduce((a, s) => a + s.rss, 0) / part.length;
};
const warm = quarter(1);
const last = quarter(3);
const growth = last / warm;
const flat = growth <= 1.1;

// The RSS curve as a small standalone SVG.
const W = 640;
const H = 240;
const maxT = Math.max(...samples.map((s) => s.t), 1);
const maxR = Math.max(...samples.map((s) => s.rss), 1) * 1.1;
const pts = samples.map((s) => `${(40 + (s.t / maxT) * (W - 60)).toFixed(1)},${(H - 30 - (s.rss / maxR) * (H - 50)).toFixed(1)}`).join(' ');
const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="${String(W)}" height="${String(H)}" viewBox="0 0 ${String(W)} ${String(H)}" font-family="sans-serif" font-size="11">
<rect width="100%" height="100%" fill="white"/>
<text x="40" y="14">soak: server RSS (MiB) over ${maxT.toFixed(0)} s, ${String(done)} requests, adapter churn every second</text>
<line x1="40" y1="${String(H - 30)}" x2="${String(W - 20)}" y2="${String(H - 30)}" stroke="black"/>
<line x1="40" y1="20" x2="40" y2="${String(H - 30)}" stroke="black"/>
<text x="4" y="${String(H - 30)}">0</text>
<text x="4" y="24">${maxR.toFixed(0)}</text>
<text x="${String(W - 40)}" y="${String(H - 12)}">${maxT.toFixed(0)} s</text>
<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="${pts}"/>
</svg>
`;
writeFileSync(join(RESULTS_DIR, 'soak.svg'), svg);

const cases: BenchCase[] = [
  {
    name: `soak: ${String(TOTAL)} requests, ${String(CONNECTIONS)} connections, base + 3 adapters, load/unload churn every second`,
    medianMs: result.latency.p50,
    runs: done,
    baseline: 'RSS in the second quarter (after warm-up)',
    ratio: growth,
    extra: { p50Ms: result.latency.p50, p99Ms: result.latency.p99, requestsPerSecond: Math.round(done / result.duration), lost, churns, churnFailures, rssWarmMiB: Math.round(warm), rssLastQuarterMiB: Math.round(last), rssMaxMiB: Math.round(Math.max(...samples.map((s) => s.rss))), durationS: Math.round(result.duration) },
  },
];
writeResults(
  'soak',
  `Soak on loopback (autocannon, server in its own process, executor ${server.executor}), 4 new tokens per request. "median ms" is p50 latency; ratio = mean RSS of the last quarter ÷ mean RSS of the second quarter (flat: ≤ 1.10). RSS curve: soak.svg.`,
  cases,
  [
    `Load average before: ${load0}; after: ${load1} (2 shared cores).`,
    `${String(done)} requests, ${String(lost)} lost; ${String(churns)} load/unload cycles, ${String(churnFailures)} failed; RSS ${warm.toFixed(0)} → ${last.toFixed(0)} MiB (${growth.toFixed(3)}×): ${flat ? 'flat' : 'GROWING'}.`,
  ],
);
if (lost > 0 || churnFailures > 0 || !flat) process.exitCode = 1;
