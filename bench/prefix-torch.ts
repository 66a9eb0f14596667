// Suite `prefix-torch`: automatic prefix caching through the HTTP server on the torch executor
// (CPU torch here; the GPU run is the integrator's), where the KV lives on the worker. A random
// checkpoint smaller than `prefix`'s SmolLM2-135M shape (8 layers, hidden 256, 8/4 heads, vocab
// 8192, f32: the CPU torch worker took minutes per server at the 135M shape on this shared
// machine) and 7 LoRA adapters r16 (4 reaching every layer's K/V, 3 none: `prefix`'s set less
// `head`, which replaces lm_head and so needs the base weights on the host, while here they stay
// on the worker's device), generated into bench/tmp/prefix-torch on first run.
// BENCH_PREFIX_REQUESTS (default 14: each adapter twice) requests one after another, each a
// 1,000-token system prompt + its own 32-token question, adapters in turn; p50 time to the first
// streamed token over every request, and over the requests a cache hit (the same requests of
// each server), three servers in the same run:
//  - no prefix caching (the baseline);
//  - prefix caching with the KV on the worker only (the default): a finished sequence's cache is
//    kept on the worker, a hit forks the cached positions there (`cache_fork`);
//  - prefix caching with `--host-kv-copy`: a hit copies the host's KV and seeds the worker with it.
// The greedy tokens of every request must be equal across the three; the peak of the engine's
// live + retained KV bytes is reported against the server's KV budget.
import { existsSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { writeRandomAdapter, writeRandomLlama } from '@stageml/engine';
import { seededRandom } from '@stageml/ir';
import type { LlamaShape } from '@stageml/models';
import { createTorchExecutor, isTorchAvailable } from '@stageml/runtime';
import { createServer } from '@stageml/server';
import { type BenchCase, writeResults } from './lib/harness.js';
import { prefixAdapters } from './lib/prefix-adapters.js';
import { median, streamCompletion } from './lib/sse.js';

if (!isTorchAvailable()) {
  console.error('prefix-torch: needs Python 3 with torch (apt-get install python3-torch, or STAGEML_PYTHON)');
  process.exit(1);
}

const DIR = 'bench/tmp/prefix-torch';
const SHAPE: LlamaShape & { maxPositions: number } = { vocabSize: 8192, hiddenSize: 256, intermediateSize: 768, numLayers: 8, numHeads: 8, numKvHeads: 4, headDim: 32, tieWordEmbeddings: true, rmsNormEps: 1e-5, maxPositions: 2048 };
const LAST = SHAPE.numLayers - 1;
const ADAPTERS = prefixAdapters(LAST, false);
const SERVED = ADAPTERS.map(([name]) => name);
const REQUESTS = Number(process.env['BENCH_PREFIX_REQUESTS'] ?? 14);
const MAX_BATCH = 8;
const MAX_MODEL_LEN = 2048;
const load0 = loadavg()[0]!;

if (!existsSync(join(DIR, 'smol', 'config.json'))) await writeRandomLlama(join(DIR, 'smol'), SHAPE, 135);
for (const [name, spec] of ADAPTERS) if (!existsSync(join(DIR, 'adapters', name, 'adapter_config.json'))) await writeRandomAdapter(join(DIR, 'adapters', name), SHAPE, spec);

const rand = seededRandom(2024);
/** `n` random token ids (3 and up: no BOS/EOS). */
const ints = (n: number): number[] => Array.from({ length: n }, () => 3 + Math.floor(rand() * (SHAPE.vocabSize - 3)));
const SYSTEM = ints(1000);
const QUESTIONS = Array.from({ length: REQUESTS }, () => ints(32));



interface Run {
  ttft: number[];
  ids: number[][];
  cached: number[];
  peakKv: number;
  budget: number;
  sentMiB: number;
  line: string;
}

async function runServer(prefixCaching: boolean, hostKvCopy: boolean): Promise<Run> {
  const executor = await createTorchExecutor({ device: 'cpu' });
  const lines: string[] = [];
  const server = await createServer({ modelDir: join(DIR, 'smol'), modelName: 'smol', adaptersDir: join(DIR, 'adapters'), executor, maxBatch: MAX_BATCH, maxModelLen: MAX_MODEL_LEN, maxLoras: 8, maxLoraRank: 16, prefixCaching, hostKvCopy, log: (l) => lines.push(l) });
  const base = await server.listen('127.0.0.1', 0);
  let peakKv = 0;
  const sampler = setInterval(() => {
    const m = server.lm.memory();
    peakKv = Math.max(peakKv, m.executorKv + m.prefixKv);
  }, 10);
  try {
    const sent0 = executor.traffic().sentTensorBytes;
    const run: Run = { ttft: [], ids: [], cached: [], peakKv: 0, budget: MAX_BATCH * MAX_MODEL_LEN * server.lm.kvBytesPerToken, sentMiB: 0, line: lines.find((l) => l.startsWith('prefix caching')) ?? '' };
    for (let i = 0; i < REQUESTS; i++) {
      const r = await streamCompletion(base, SERVED[i % SERVED.length]!, [...SYSTEM, ...QUESTIONS[i]!], 8);
      run.ttft.push(r.ttftMs);
      run.ids.push(r.ids);
      run.cached.push(r.cached);
    }
    run.peakKv = peakKv;
    run.sentMiB = (executor.traffic().sentTensorBytes - sent0) / 2 ** 20;
    return run;
  } finally {
    clearInterval(sampler);
    await server.shutdown();
    await executor.close();
  }
}

const off = await runServer(false, false);
const device = await runServer(true, false);
const host = await runServer(true, true);
const same = [device, host].every((r) => JSON.stringify(r.ids) === JSON.stringify(off.ids));
/** The requests the worker-side cache served (the first of each K/V key misses). */
const hits = device.cached.flatMap((c, i) => (c > 0 ? [i] : []));
const hitTtft = (r: Run): number => median(hits.map((i) => r.ttft[i]!));
const BASE = 'TTFT p50, no prefix caching (baseline)';
const HIT_BASE = 'TTFT p50 of the hit requests, no prefix caching (baseline)';
const cases: BenchCase[] = [
  { name: HIT_BASE, medianMs: hitTtft(off), runs: hits.length },
  { name: 'TTFT p50 of the hit requests, prefix caching, KV on the worker (cache_fork)', medianMs: hitTtft(device), runs: hits.length, baseline: HIT_BASE, ratio: hitTtft(device) / hitTtft(off) },
  { name: 'TTFT p50 of the hit requests, prefix caching, --host-kv-copy', medianMs: hitTtft(host), runs: hits.length, baseline: HIT_BASE, ratio: hitTtft(host) / hitTtft(off) },
  { name: BASE, medianMs: median(off.ttft), runs: REQUESTS, extra: { sentMiB: off.sentMiB } },
  { name: 'TTFT p50, prefix caching, KV on the worker (cache_fork)', medianMs: median(device.ttft), runs: REQUESTS, baseline: BASE, ratio: median(device.ttft) / median(off.ttft), extra: { cachedTokensMedian: median(device.cached), sentMiB: device.sentMiB, peakKvMiB: device.peakKv / 2 ** 20 } },
  { name: 'TTFT p50, prefix caching, --host-kv-copy (seeded from the host)', medianMs: median(host.ttft), runs: REQUESTS, baseline: BASE, ratio: median(host.ttft) / median(off.ttft), extra: { cachedTokensMedian: median(host.cached), sentMiB: host.sentMiB } },
];
const notes = [
  `Greedy tokens identical across the three servers (${String(REQUESTS)} requests): **${same ? 'yes' : 'NO'}**.`,
  `TTFT p50 of the ${String(hits.length)} requests that hit: ${hitTtft(device).toFixed(1)} ms with caching on the worker, ${hitTtft(host).toFixed(1)} ms with --host-kv-copy, ${hitTtft(off).toFixed(1)} ms without: **${(hitTtft(device) / hitTtft(off)).toFixed(3)}×** and ${(hitTtft(host) / hitTtft(off)).toFixed(3)}×.`,
  `TTFT p50 of all requests: ${median(device.ttft).toFixed(1)} ms with caching on the worker, ${median(host.ttft).toFixed(1)} ms with --host-kv-copy, ${median(off.ttft).toFixed(1)} ms without: **${(median(device.ttft) / median(off.ttft)).toFixed(3)}×** and ${(median(host.ttft) / median(off.ttft)).toFixed(3)}×. Cached tokens per request (worker): ${device.cached.join(', ')}.`,
  `Tensor bytes sent to the worker over the ${String(REQUESTS)} requests: ${off.sentMiB.toFixed(2)} MiB without caching, ${device.sentMiB.toFixed(2)} MiB with the KV on the worker, ${host.sentMiB.toFixed(2)} MiB with --host-kv-copy (its hits seed the worker with the copied positions).`,
  `Peak KV held (live + retained, on the worker): ${(device.peakKv / 2 ** 20).toFixed(1)} MiB with caching (budget ${(device.budget / 2 ** 20).toFixed(1)} MiB; ${device.peakKv <= device.budget ? 'within' : 'ABOVE'}).`,
  `Start-up lines: \`${device.line}\`; \`${host.line}\`.`,
  `torch executor on the CPU (${String(REQUESTS)} requests per server); load average ${load0.toFixed(2)} at start, ${loadavg()[0]!.toFixed(2)} at the end (a shared, noisy machine: ratios within this run only).`,
];
writeResults('prefix-torch', 'Automatic prefix caching through the HTTP server on the torch executor (CPU torch): a random 8-layer, 256-wide checkpoint (vocab 8192, f32), 7 LoRA adapters r16 (4 reaching every K/V, 3 reaching none), a 1,000-token shared system prompt; without caching, with the KV on the worker (cache_fork), and with --host-kv-copy, in the same run.', cases, notes);
if (!same) process.exitCode = 1;
