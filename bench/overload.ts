// Suite `overload`: the reference server past its capacity, on loopback (autocannon; the server
// runs in its own process so that the load generator does not share its event loop).
//
// 1. Saturation: tenant A alone at 200 connections, then at 400 connections (BENCH_OVERLOAD_S
//    seconds each, default 15). Past capacity the extra connections are refused with cheap 429s;
//    the successes/s at 400 must stay ≥ 0.8× those at 200, with the server's RSS bounded.
// 2. Isolation: tenant B (8 connections) alone, then while tenant A floods with 300 connections.
//    B's p99 latency under the flood must stay within 2× of its solo p99.
//
// Model: the fixture Llama; 4 new tokens per request; executor BENCH_EXECUTOR or the fastest here.
import { readFileSync } from 'node:fs';
import autocannon from 'autocannon';
import { startServerChild } from './lib/child.js';
import { type BenchCase, writeResults } from './lib/harness.js';

const SECONDS = Number(process.env['BENCH_OVERLOAD_S'] ?? 15);
const ISOLATION_SECONDS = Math.max(5, Math.round(SECONDS * (2 / 3)));
const A = 'overload-tenant-a-key';
const B = 'overload-tenant-b-key';
const prompts = [
  [0, 52, 317, 335, 262, 438, 309, 487],
  [0, 54, 264, 479, 455, 278, 297, 316, 73],
  [0, 500, 72, 283, 10, 90, 11],
  [0, 54, 272, 301, 86, 223, 25, 382, 77, 278],
];
const load0 = readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
const server = await startServerChild({
  executor: process.env['BENCH_EXECUTOR'] ?? 'auto',
  maxBatch: 32,
  maxQueue: 64,
  config: {
    version: 1,
    tenants: [
      { name: 'a', api_keys: [A], adapters: ['qv-r8', 'o-r2'], max_running: 8 },
      { name: 'b', api_keys: [B], adapters: ['o-r2'], base: false },
    ],
  },
});

interface Run {
  ok: number;
  rejected: number;
  other: number;
  okPerSecond: number;
  p50: number;
  p99: number;
  durationS: number;
  rssMaxMiB: number;
}

function run(key: string, models: readonly string[], connections: number, seconds: number): { done: Promise<Run> } {
  let i = 0;
  let ok = 0;
  let rejected = 0;
  let other = 0;
  let rssMax = 0;
  const sampler = setInterval(() => {
    rssMax = Math.max(rssMax, server.rssMiB());
  }, 250);
  const done = autocannon({
    url: `${server.base}/v1/completions`,
    connections,
    duration: seconds,
    timeout: 30,
    requests: [
      {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
        setupRequest: (req) => {
          const k = i++;
          return { ...req, body: JSON.stringify({ model: models[k % models.length], prompt: prompts[k % prompts.length], max_tokens: 4, temperature: 0, ignore_eos: true }) };
        },
        onResponse: (status) => {
          if (status === 200) ok++;
          else if (status === 429) rejected++;
          else other++;
        },
      },
    ],
  }).then((r) => {
    clearInterval(sampler);
    const durationS = r.duration;
    // NOTE: autocannon's latency histogram covers every response; for the isolation runs only
    // one tenant's client runs per instance, and its responses are all 200s (below its share).
    return { ok, rejected, other: other + r.errors + r.timeouts, okPerSecond: ok / durationS, p50: r.latency.p50, p99: r.latency.p99, durationS, rssMaxMiB: Math.round(Math.max(rssMax, server.rssMiB())) };
  });
  return { done };
}

const warm = await run(A, ['qv-r8'], 32, 3).done;
const rssAfterWarmup = Math.round(server.rssMiB());
const at200 = await run(A, ['qv-r8'], 200, SECONDS).done;
const at400 = await run(A, ['qv-r8'], 400, SECONDS).done;
const solo = await run(B, ['o-r2'], 8, ISOLATION_SECONDS).done;
async function underFloodOf(adapter: string): Promise<[Run, Run]> {
  const flood = run(A, [adapter], 300, ISOLATION_SECONDS + 2);
  await new Promise((r) => setTimeout(r, 1000));
  const b = await run(B, ['o-r2'], 8, ISOLATION_SECONDS).done;
  return [b, await flood.done];
}
// A floods on B's adapter (isolation by admission alone) and on another adapter (every step then
// mixes two adapters: the engine's mixed-batch cost comes on top).
const [underFlood, floodRun] = await underFloodOf('o-r2');
const [underMixedFlood, mixedFloodRun] = await underFloodOf('qv-r8');
await server.stop();
const load1 = readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');

const saturation = at400.okPerSecond / at200.okPerSecond;
const isolation = underFlood.p99 / Math.max(1, solo.p99);
const mixedIsolation = underMixedFlood.p99 / Math.max(1, solo.p99);
const extra = (r: Run): Record<string, number> => ({ okPerSecond: Math.round(r.okPerSecond), ok: r.ok, rejected429: r.rejected, otherFailures: r.other, p50Ms: r.p50, p99Ms: r.p99, rssMaxMiB: r.rssMaxMiB, durationS: Math.round(r.durationS) });
const cases: BenchCase[] = [
  { name: `tenant A alone, 200 connections, ${String(SECONDS)} s`, medianMs: at200.p50, runs: at200.ok, extra: extra(at200) },
  { name: `tenant A alone, 400 connections, ${String(SECONDS)} s`, medianMs: at400.p50, runs: at400.ok, baseline: '200 connections (successes/s)', ratio: saturation, extra: extra(at400) },
  { name: `tenant B alone, 8 connections, ${String(ISOLATION_SECONDS)} s`, medianMs: solo.p50, runs: solo.ok, extra: extra(solo) },
  { name: `tenant B, 8 connections, while A floods with 300 on B's adapter`, medianMs: underFlood.p50, runs: underFlood.ok, baseline: 'B alone (p99)', ratio: isolation, extra: { ...extra(underFlood), floodOk: floodRun.ok, flood429: floodRun.rejected } },
  { name: `tenant B, 8 connections, while A floods with 300 on another adapter (mixed batches)`, medianMs: underMixedFlood.p50, runs: underMixedFlood.ok, baseline: 'B alone (p99)', ratio: mixedIsolation, extra: { ...extra(underMixedFlood), floodOk: mixedFloodRun.ok, flood429: mixedFloodRun.rejected } },
];
const holds = saturation >= 0.8 && isolation <= 2 && underFlood.rejected === 0 && underFlood.other === 0 && underMixedFlood.rejected === 0 && underMixedFlood.other === 0 && at400.other === 0;
writeResults(
  'overload',
  `Overload on loopback (autocannon, server in its own process, executor ${server.executor}), 4 new tokens per request, max batch 32, per-tenant queue 64. "median ms" is p50 latency. Ratios: successes/s at 400 ÷ at 200 connections (target ≥ 0.8); B's p99 under A's flood ÷ B's solo p99 (target ≤ 2).`,
  cases,
  [
    `Load average before: ${load0}; after: ${load1} (2 shared cores: other work ran at the same time).`,
    `RSS after warm-up: ${String(rssAfterWarmup)} MiB; max at 200: ${String(at200.rssMaxMiB)} MiB; max at 400: ${String(at400.rssMaxMiB)} MiB; warm-up ok ${String(warm.ok)}.`,
    `Saturation ratio ${saturation.toFixed(2)} (target ≥ 0.8); isolation ratio ${isolation.toFixed(2)} (target ≤ 2; B solo p99 ${String(solo.p99)} ms, under a flood on its adapter ${String(underFlood.p99)} ms; B got ${String(underFlood.rejected + underMixedFlood.rejected)} 429s). ${holds ? 'Both targets hold.' : 'A target is MISSED.'}`,
    `With A flooding on another adapter every decode step mixes two adapters: B's p99 ${String(underMixedFlood.p99)} ms (${mixedIsolation.toFixed(2)}× solo) and A's successes/s ${String(Math.round(mixedFloodRun.okPerSecond))} vs ${String(Math.round(floodRun.okPerSecond))} on one adapter — the engine's mixed-batch step cost, not admission (B still gets its slots and no 429s).`,
  ],
);
if (!holds) process.exitCode = 1;
