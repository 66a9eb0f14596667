// Suite `server-load`: a bounded load test of the reference server on loopback with autocannon:
// 64 concurrent clients, 10,000 completion requests spread over 4 adapters + the base model, vs the
// same load on a single adapter in the same run (ratio). Every response is checked: 0 failed,
// 0 lost. Model: the fixture Llama; executor: the fastest measured here (`selectExecutor`), or
// BENCH_EXECUTOR (interpreter, tfjs-wasm, tfjs-cpu, onnxruntime).
import autocannon from 'autocannon';
import { type ExecutorName, selectExecutor } from '@stageml/runtime';
import { createServer } from '@stageml/server';
import { type BenchCase, writeResults } from './lib/harness.js';

const TOTAL = Number(process.env['BENCH_REQUESTS'] ?? 10_000);
const CONNECTIONS = 64;
const MAX_TOKENS = 4;
const { executor } = await selectExecutor({ force: (process.env['BENCH_EXECUTOR'] ?? 'auto') as ExecutorName | 'auto' });
const server = await createServer({
  modelDir: 'fixtures/peft-tiny/llama/base',
  modelName: 'llama',
  adaptersDir: 'fixtures/peft-tiny/llama/adapters',
  executor,
  maxBatch: 64,
  maxQueue: 4096,
});
const base = await server.listen('127.0.0.1', 0);
const prompts = [
  [0, 52, 317, 335, 262, 438, 309, 487],
  [0, 54, 264, 479, 455, 278, 297, 316, 73],
  [0, 500, 72, 283, 10, 90, 11],
  [0, 54, 272, 301, 86, 223, 25, 382, 77, 278],
];

interface Run {
  p50: number;
  p99: number;
  tokensPerSecond: number;
  requestsPerSecond: number;
  ok: number;
  failed: number;
  durationS: number;
}

async function load(models: readonly string[]): Promise<Run> {
  let i = 0;
  let ok = 0;
  let failed = 0;
  let tokens = 0;
  const result = await autocannon({
    url: `${base}/v1/completions`,
    connections: CONNECTIONS,
    amount: TOTAL,
    timeout: 120,
    requests: [
      {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        setupRequest: (req) => {
          const k = i++;
          return { ...req, body: JSON.stringify({ model: models[k % models.length], prompt: prompts[k % prompts.length], max_tokens: MAX_TOKENS, temperature: 0, ignore_eos: true }) };
        },
        onResponse: (status, body) => {
          if (status !== 200) {
            failed++;
            return;
          }
          const json = JSON.parse(body) as { usage?: { completion_tokens: number } };
          if (json.usage?.completion_tokens === MAX_TOKENS) ok++;
          else failed++;
          tokens += json.usage?.completion_tokens ?? 0;
        },
      },
    ],
  });
  const durationS = result.duration;
  return {
    p50: result.latency.p50,
    p99: result.latency.p99,
    tokensPerSecond: tokens / durationS,
    requestsPerSecond: result.requests.average,
    ok,
    failed: failed + result.errors + result.timeouts + (TOTAL - ok - failed),
    durationS,
  };
}

const mixed = await load(['llama', 'qv-r8', 'all-r16', 'mlp-r4-rslora', 'o-r2']);
const single = await load(['qv-r8']);
await server.shutdown();

const cases: BenchCase[] = [
  {
    name: `mixed: 4 adapters + base, ${String(CONNECTIONS)} clients, ${String(TOTAL)} requests`,
    medianMs: mixed.p50,
    runs: TOTAL,
    baseline: 'single adapter (qv-r8), same load',
    ratio: mixed.tokensPerSecond / single.tokensPerSecond,
    extra: { p50Ms: mixed.p50, p99Ms: mixed.p99, tokensPerSecond: Math.round(mixed.tokensPerSecond), ok: mixed.ok, failedOrLost: mixed.failed, durationS: Math.round(mixed.durationS) },
  },
  {
    name: `single adapter, ${String(CONNECTIONS)} clients, ${String(TOTAL)} requests`,
    medianMs: single.p50,
    runs: TOTAL,
    extra: { p50Ms: single.p50, p99Ms: single.p99, tokensPerSecond: Math.round(single.tokensPerSecond), ok: single.ok, failedOrLost: single.failed, durationS: Math.round(single.durationS) },
  },
];
writeResults(
  'server-load',
  `Loopback load test (autocannon), ${String(MAX_TOKENS)} new tokens per request, executor ${executor.name}. "median ms" is p50 latency; ratio = mixed tokens/s ÷ single-adapter tokens/s.`,
  cases,
  [`Mixed: p50 ${String(mixed.p50)} ms, p99 ${String(mixed.p99)} ms, ${mixed.tokensPerSecond.toFixed(0)} tokens/s, ${String(mixed.ok)} ok, ${String(mixed.failed)} failed or lost.`, `Single: p50 ${String(single.p50)} ms, p99 ${String(single.p99)} ms, ${single.tokensPerSecond.toFixed(0)} tokens/s, ${String(single.ok)} ok, ${String(single.failed)} failed or lost.`],
);
if (mixed.failed > 0 || single.failed > 0) process.exitCode = 1;
