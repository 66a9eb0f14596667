// Suite `soak` (issue 39): `pnpm bench soak --minutes M` (default 30; BENCH_SOAK_MINUTES). The
// reference server runs in its own process with 3 tenants (and a 4th, hostile one), 16 adapters
// loaded on demand from an adapter root into 18 slots (4 hold the start adapters; loads and
// evictions throughout) while an
// admin loads and unloads adapters of its own every 2 s (churn).
// Traffic from 4 closed-loop clients per tenant: plain and SSE, `n` 1–4, logprobs, stop strings,
// 10 % of clients leaving early. The first third of the run is quiet; for the rest, one hostile
// client sends the malformed and heavy requests of issue 39 items 2–7 throughout. Checked:
//
// - 0 lost (every request a 200 with a whole answer, unless its client left early);
// - 0 wrong answers: every greedy answer equals the solo run's for its model and prompt (cut at
//   its stop string, where it has one), each of its `n` choices;
// - each tenant's p99 latency with the hostile client within 2× of the quiet phase's;
// - the server's RSS slope after warm-up (the first quarter) below 1 MB/min.
//
// Writes bench/results/soak.{json,md} and the RSS curve soak.svg. BENCH_SOAK_ATTACKS=2,7 limits
// the hostile client to those items (its notes list each item's count, latency and statuses).
import { closeSync, cpSync, ftruncateSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startServerChild } from './lib/child.js';
import { type BenchCase, RESULTS_DIR, writeResults } from './lib/harness.js';

/** `--minutes M` from the command line (`pnpm bench soak --minutes 2`), else BENCH_SOAK_MINUTES, else 30. */
function minutesArg(): number {
  const i = process.argv.indexOf('--minutes');
  const raw = i >= 0 ? process.argv[i + 1] : process.env['BENCH_SOAK_MINUTES'];
  const m = raw === undefined ? 30 : Number(raw);
  if (!(m > 0 && m <= 24 * 60)) throw new Error(`--minutes must be a number of minutes in (0, 1440], got ${String(raw)}`);
  return m;
}

const MINUTES = minutesArg();
const DURATION_MS = MINUTES * 60_000;
const ADMIN = 'soak-admin-key-0001';
const TENANTS = ['t1', 't2', 't3'] as const;
const KEYS: Record<string, string> = { t1: 'soak-t1-key-0001', t2: 'soak-t2-key-0002', t3: 'soak-t3-key-0003', hostile: 'soak-hostile-key-04' };
const CLIENTS_PER_TENANT = 4;
const MAX_TOKENS = 8;
const FIXTURES = ['qv-r8', 'o-r2', 'all-r16', 'mlp-r4-rslora'];
const ADAPTERS = Array.from({ length: 16 }, (_, i) => `ad-${String(i)}`);
const MODELS = ['llama', ...ADAPTERS];
const PROMPTS = [
  [0, 52, 317, 335, 262, 438, 309, 487],
  [0, 54, 264, 479, 455, 278, 297, 316, 73],
  [0, 500, 72, 283, 10, 90, 11],
];

const root = mkdtempSync(join(tmpdir(), 'stageml-soak-'));
ADAPTERS.forEach((a, i) => {
  cpSync(`fixtures/peft-tiny/llama/adapters/${FIXTURES[i % FIXTURES.length]!}`, join(root, a), { recursive: true });
});
// Item 5's crafted adapter: a header declaring a 2 GiB tensor (a sparse file).
cpSync('fixtures/peft-tiny/llama/adapters/o-r2', join(root, 'ad-huge'), { recursive: true });
{
  const header = Buffer.from(JSON.stringify({ 'base_model.model.lm_head.weight': { dtype: 'F32', shape: [512, 2 ** 20], data_offsets: [0, 2 ** 31] } }));
  const prefix = Buffer.alloc(8);
  prefix.writeBigUInt64LE(BigInt(header.length));
  const fd = openSync(join(root, 'ad-huge', 'adapter_model.safetensors'), 'w');
  writeSync(fd, prefix);
  writeSync(fd, header);
  ftruncateSync(fd, 8 + header.length + 2 ** 31);
  closeSync(fd);
}

const config = {
  version: 1,
  tenants: [
    ...TENANTS.map((t) => ({ name: t, api_keys: [KEYS[t]!], adapters: ADAPTERS })),
    { name: 'hostile', api_keys: [KEYS['hostile']!], adapters: [...ADAPTERS, 'ad-huge'] },
  ],
};
const load0 = readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
const server = await startServerChild({ executor: process.env['BENCH_EXECUTOR'] ?? 'auto', config, adminKey: ADMIN, adapterRoots: [root], maxBatch: 32, maxQueue: 256, maxLoras: 18 });

interface Res { status: number; json: any; text: string }
async function post(path: string, body: unknown, key: string | undefined, signal?: AbortSignal): Promise<Res> {
  const r = await fetch(`${server.base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...(key === undefined ? {} : { authorization: `Bearer ${key}` }) }, body: typeof body === 'string' ? body : JSON.stringify(body), ...(signal === undefined ? {} : { signal }) });
  const text = await r.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: r.status, json, text };
}

// The solo run: each model and prompt alone, greedy, before any traffic.
const solo = new Map<string, string>();
for (const model of MODELS) {
  for (const [p, prompt] of PROMPTS.entries()) {
    const r = await post('/v1/completions', { model, prompt, max_tokens: MAX_TOKENS, temperature: 0, ignore_eos: true }, KEYS['t1']);
    if (r.status !== 200) throw new Error(`solo run: ${model} prompt ${String(p)}: ${String(r.status)} ${r.text.slice(0, 200)}`);
    solo.set(`${model}/${String(p)}`, r.json.choices[0].text as string);
  }
}

const t0 = performance.now();
const elapsed = (): number => performance.now() - t0;
const quietUntil = DURATION_MS / 3;
const phaseOf = (t: number): 'quiet' | 'hostile' => (t < quietUntil ? 'quiet' : 'hostile');
const latencies: Record<string, number[]> = {};
const stats = { requests: 0, lost: 0, wrong: 0, left: 0, streamed: 0, hostile: 0, hostileServerErrors: 0, churns: 0, churnUnexpected: 0 };
const wrongExamples: string[] = [];
/** Per hostile item: requests, total ms, statuses. */
const hostileByItem: Record<number, { requests: number; ms: number; statuses: Record<number, number> }> = {};
const rand = (n: number): number => Math.floor(Math.random() * n);

/** The answer a greedy request must give: the solo text, cut before its stop string. */
function expected(model: string, p: number, stop: string | undefined): string {
  const full = solo.get(`${model}/${String(p)}`)!;
  if (stop === undefined) return full;
  const at = full.indexOf(stop);
  return at < 0 ? full : full.slice(0, at);
}

/** Reads an SSE answer: the text of each choice, and whether it ended with [DONE]. */
async function readStream(r: Response, n: number, leaveEarly: AbortController | undefined): Promise<{ texts: string[]; done: boolean }> {
  const texts = Array.from({ length: n }, () => '');
  const decoder = new TextDecoder();
  let buf = '';
  let done = false;
  for await (const chunk of r.body as unknown as AsyncIterable<Uint8Array>) {
    buf += decoder.decode(chunk, { stream: true });
    let cut: number;
    while ((cut = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      if (!ev.startsWith('data: ')) continue;
      const data = ev.slice(6);
      if (data === '[DONE]') done = true;
      else {
        const j = JSON.parse(data) as { choices: { index: number; text: string }[]; error?: unknown };
        if (j.error !== undefined) throw new Error(`stream error event: ${data.slice(0, 200)}`);
        for (const c of j.choices) texts[c.index] = `${texts[c.index] ?? ''}${c.text}`;
        if (leaveEarly !== undefined) {
          leaveEarly.abort();
          return { texts, done: false };
        }
      }
    }
  }
  return { texts, done };
}

/** One tenant client: requests back to back until the end of the run. */
async function client(tenant: string): Promise<void> {
  while (elapsed() < DURATION_MS) {
    const model = MODELS[rand(MODELS.length)]!;
    const p = rand(PROMPTS.length);
    const n = 1 + rand(4);
    const stream = Math.random() < 0.5;
    const logprobs = Math.random() < 0.3 ? 2 : undefined;
    const solo0 = solo.get(`${model}/${String(p)}`)!;
    const stop = Math.random() < 0.3 && solo0.length > 4 ? solo0.slice(2, 4) : undefined;
    const leave = Math.random() < 0.1;
    const body = { model, prompt: PROMPTS[p], max_tokens: MAX_TOKENS, temperature: 0, ignore_eos: true, n, stream, ...(logprobs === undefined ? {} : { logprobs }), ...(stop === undefined ? {} : { stop: [stop] }) };
    const want = expected(model, p, stop);
    const start = performance.now();
    const phase = phaseOf(elapsed());
    stats.requests++;
    const ac = new AbortController();
    try {
      const r = await fetch(`${server.base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${KEYS[tenant]!}` }, body: JSON.stringify(body), signal: ac.signal });
      if (r.status !== 200) {
        stats.lost++;
        wrongExamples.push(`${tenant} ${model}: status ${String(r.status)} ${(await r.text()).slice(0, 160)}`);
        continue;
      }
      let texts: string[];
      if (stream) {
        stats.streamed++;
        const s = await readStream(r, n, leave ? ac : undefined);
        if (leave) {
          stats.left++;
          continue;
        }
        if (!s.done) {
          stats.lost++;
          continue;
        }
        texts = s.texts;
      } else {
        const j = (await r.json()) as { choices: { text: string }[] };
        texts = j.choices.map((c) => c.text);
        (latencies[`${tenant}/${phase}`] ??= []).push(performance.now() - start);
      }
      if (texts.length !== n || texts.some((t) => t !== want)) {
        stats.wrong++;
        if (wrongExamples.length < 10) wrongExamples.push(`${tenant} ${model} p${String(p)} stop ${JSON.stringify(stop)}: ${JSON.stringify(texts)} ≠ ${JSON.stringify(want)}`);
      }
    } catch (e) {
      if (leave && ac.signal.aborted) stats.left++;
      else {
        stats.lost++;
        if (wrongExamples.length < 10) wrongExamples.push(`${tenant} ${model}: ${String(e)}`);
      }
    }
  }
}

/** The hostile client: issue 39 items 2–7, back to back, from the end of the quiet phase. */
async function hostile(): Promise<void> {
  while (elapsed() < quietUntil) await new Promise((r) => setTimeout(r, 200));
  const key = KEYS['hostile'];
  const longPrompt = Array.from({ length: 200 }, (_, i) => 3 + ((i * 13) % 500));
  const all: (readonly [number, () => Promise<number>])[] = [
    // 2: echo + logprobs on a long prompt.
    [2, async () => (await post('/v1/completions', { model: 'llama', prompt: longPrompt, max_tokens: 1, echo: true, logprobs: 5 }, key)).status],
    // 3: values that used to fail a whole batch.
    [3, async () => (await post('/v1/completions', { model: 'ad-1', prompt: PROMPTS[0], max_tokens: 4, temperature: 1, top_k: 2147483648 }, key)).status],
    [3, async () => (await post('/v1/completions', { model: 'llama', prompt: PROMPTS[1], max_tokens: 4, logit_bias: { 1: 5, '01': 5 } }, key)).status],
    // 4: a large /tokenize with no key.
    [4, async () => (await post('/tokenize', { prompt: 'word '.repeat(200_000) }, undefined)).status],
    // 5: the crafted 2 GiB-tensor adapter, on demand.
    [5, async () => (await post('/v1/completions', { model: 'ad-huge', prompt: PROMPTS[2], max_tokens: 2 }, key)).status],
    // 6: the metrics guard, percent-encoded.
    [6, async () => {
      const r = await fetch(`${server.base}/metric%73`);
      await r.arrayBuffer();
      return r.status;
    }],
    // 7: a request of many sequences.
    [7, async () => (await post('/v1/completions', { model: 'llama', prompt: [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[0]], n: 16, max_tokens: 64 }, key)).status],
    // 10: an invalid request for an adapter that is not loaded.
    [10, async () => (await post('/v1/completions', { model: ADAPTERS[rand(ADAPTERS.length)], prompt: PROMPTS[0], max_tokens: -1 }, key)).status],
  ];
  // BENCH_SOAK_ATTACKS=2,7: only those items (for finding which one costs the tenants).
  const only = process.env['BENCH_SOAK_ATTACKS']?.split(',').map(Number);
  const attacks = all.filter(([item]) => only === undefined || only.includes(item));
  let k = 0;
  while (elapsed() < DURATION_MS && attacks.length > 0) {
    const [item, attack] = attacks[k++ % attacks.length]!;
    const start = performance.now();
    const status = await attack().catch(() => 0);
    const a = (hostileByItem[item] ??= { requests: 0, ms: 0, statuses: {} });
    a.requests++;
    a.ms += performance.now() - start;
    a.statuses[status] = (a.statuses[status] ?? 0) + 1;
    stats.hostile++;
    if (status >= 500 && status !== 503 && status !== 507) stats.hostileServerErrors++;
  }
}

/**
 * The admin: every 2 s loads one of 4 names of its own and unloads it a second later. (The 16
 * tenant adapters churn through on-demand loads and LRU evictions: 18 slots for 20 names and the admin's. An
 * admin unload would revoke the tenants' grants of a name, by design.)
 */
async function churn(): Promise<void> {
  const admin = async (path: string, body: unknown): Promise<number> => (await post(path, body, ADMIN)).status;
  while (elapsed() < DURATION_MS) {
    await new Promise((r) => setTimeout(r, 1000));
    const name = `churn-${String(stats.churns % 4)}`;
    const loaded = await admin('/v1/load_lora_adapter', { lora_name: name, lora_path: join(root, ADAPTERS[stats.churns % ADAPTERS.length]!) });
    await new Promise((r) => setTimeout(r, 1000));
    const unloaded = await admin('/v1/unload_lora_adapter', { lora_name: name });
    stats.churns++;
    // 409 on unload: requests still use it (none do here); 507: every slot busy. Anything else is unexpected.
    if (loaded !== 200 && loaded !== 507) stats.churnUnexpected++;
    if (loaded === 200 && unloaded !== 200 && unloaded !== 409) stats.churnUnexpected++;
  }
}

const samples: { t: number; rss: number }[] = [];
const sampler = setInterval(() => {
  samples.push({ t: elapsed() / 1000, rss: server.rssMiB() });
}, 1000);
await Promise.all([...TENANTS.flatMap((t) => Array.from({ length: CLIENTS_PER_TENANT }, () => client(t))), hostile(), churn()]);
clearInterval(sampler);
samples.push({ t: elapsed() / 1000, rss: server.rssMiB() });
await server.stop();
rmSync(root, { recursive: true, force: true });
const load1 = readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');

const p99 = (xs: readonly number[] | undefined): number => {
  if (xs === undefined || xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(s.length * 0.99))]!;
};
// RSS slope after warm-up (the first quarter): least squares over the rest, in MB per minute.
const warm = samples.filter((s) => s.t >= (DURATION_MS / 1000) * 0.25);
const mt = warm.reduce((a, s) => a + s.t, 0) / warm.length;
const mr = warm.reduce((a, s) => a + s.rss, 0) / warm.length;
const slopePerS = warm.reduce((a, s) => a + (s.t - mt) * (s.rss - mr), 0) / Math.max(1e-9, warm.reduce((a, s) => a + (s.t - mt) ** 2, 0));
const slopeMbPerMin = slopePerS * 60 * (2 ** 20 / 1e6);
const perTenant = TENANTS.map((t) => ({ tenant: t, quiet: p99(latencies[`${t}/quiet`]), hostile: p99(latencies[`${t}/hostile`]) }));
const within2x = perTenant.every((x) => !(x.hostile > 2 * x.quiet));

// The RSS curve as a small standalone SVG.
const W = 640;
const H = 240;
const maxT = Math.max(...samples.map((s) => s.t), 1);
const maxR = Math.max(...samples.map((s) => s.rss), 1) * 1.1;
const x = (t: number): string => (40 + (t / maxT) * (W - 60)).toFixed(1);
const pts = samples.map((s) => `${x(s.t)},${(H - 30 - (s.rss / maxR) * (H - 50)).toFixed(1)}`).join(' ');
const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="${String(W)}" height="${String(H)}" viewBox="0 0 ${String(W)} ${String(H)}" font-family="sans-serif" font-size="11">
<rect width="100%" height="100%" fill="white"/>
<text x="40" y="14">soak: server RSS (MiB) over ${maxT.toFixed(0)} s; hostile client from ${(quietUntil / 1000).toFixed(0)} s; slope after warm-up ${slopeMbPerMin.toFixed(2)} MB/min</text>
<line x1="40" y1="${String(H - 30)}" x2="${String(W - 20)}" y2="${String(H - 30)}" stroke="black"/>
<line x1="40" y1="20" x2="40" y2="${String(H - 30)}" stroke="black"/>
<line x1="${x(quietUntil / 1000)}" y1="20" x2="${x(quietUntil / 1000)}" y2="${String(H - 30)}" stroke="#d62728" stroke-dasharray="4 3"/>
<text x="4" y="${String(H - 30)}">0</text>
<text x="4" y="24">${maxR.toFixed(0)}</text>
<text x="${String(W - 40)}" y="${String(H - 12)}">${maxT.toFixed(0)} s</text>
<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="${pts}"/>
</svg>
`;
writeFileSync(join(RESULTS_DIR, 'soak.svg'), svg);

const cases: BenchCase[] = perTenant.map((x) => ({
  name: `soak ${String(MINUTES)} min: tenant ${x.tenant} p99 (plain requests) with the hostile client vs without`,
  medianMs: x.hostile,
  runs: (latencies[`${x.tenant}/hostile`] ?? []).length,
  baseline: `p99 without the hostile client (${x.quiet.toFixed(1)} ms, ${String((latencies[`${x.tenant}/quiet`] ?? []).length)} requests)`,
  ratio: x.hostile / x.quiet,
}));
cases.push({
  name: `soak ${String(MINUTES)} min: totals (ms column: p99 of every tenant's plain requests, both phases)`,
  medianMs: p99(Object.values(latencies).flat()),
  runs: stats.requests,
  extra: { ...stats, rssSlopeMbPerMin: Number(slopeMbPerMin.toFixed(3)), rssMaxMiB: Math.round(Math.max(...samples.map((s) => s.rss))), minutes: MINUTES },
});
writeResults(
  'soak',
  `Soak on loopback (server in its own process, executor ${server.executor}): 3 tenants × ${String(CLIENTS_PER_TENANT)} closed-loop clients (plain and SSE, n 1–4, logprobs, stop strings, 10 % leaving early) over the base model and 16 adapters loaded on demand (18 slots, 4 of them the start adapters: on-demand loads and LRU evictions throughout) with an admin loading and unloading adapters every 2 s; ${String(MAX_TOKENS)} new tokens per choice. The first third is quiet; then one hostile client sends issue 39's items 2–7 throughout. "median ms" here is the p99 latency of each tenant's plain requests with the hostile client; ratio = that ÷ the quiet phase's p99 (target ≤ 2). RSS curve: soak.svg.`,
  cases,
  [
    `Load average before: ${load0}; after: ${load1} (2 shared cores).`,
    `${String(stats.requests)} requests (${String(stats.streamed)} streamed, ${String(stats.left)} left early): ${String(stats.lost)} lost, ${String(stats.wrong)} wrong (greedy answers vs the solo run); hostile requests ${String(stats.hostile)}, ${String(stats.hostileServerErrors)} answered with an unexpected 5xx; churn ${String(stats.churns)} admin loads/unloads, ${String(stats.churnUnexpected)} unexpected statuses.`,
    `p99 with / without the hostile client: ${perTenant.map((x) => `${x.tenant} ${x.hostile.toFixed(1)} / ${x.quiet.toFixed(1)} ms`).join(', ')} — ${within2x ? 'within 2×' : 'NOT within 2×'}.`,
    `RSS slope after warm-up: ${slopeMbPerMin.toFixed(2)} MB/min (target < 1).`,
    `Hostile requests by issue item (count, mean ms, statuses): ${Object.entries(hostileByItem).map(([item, a]) => `${item}: ${String(a.requests)}, ${(a.ms / a.requests).toFixed(0)} ms, ${JSON.stringify(a.statuses)}`).join('; ')}.`,
    ...wrongExamples.slice(0, 10).map((w) => `- ${w}`),
  ],
);
if (stats.lost > 0 || stats.wrong > 0 || stats.hostileServerErrors > 0 || stats.churnUnexpected > 0 || !within2x || !(slopeMbPerMin < 1)) process.exitCode = 1;
