// Suite `prefix`: automatic prefix caching through the HTTP server, on a random-weight
// SmolLM2-135M-shaped checkpoint (30 layers, hidden 576, 9/3 heads, vocab 49152, tied; f32),
// cpu-native executor (BENCH_THREADS threads, default 2), generated into bench/tmp/prefix on first
// run. 8 LoRA adapters r16: four on all 7 projections of every layer (they reach every layer's K/V:
// blocks of their own), two on the MLP of the last layer, one on q/o of the last layer, one
// replacing lm_head (these reach no K/V: they share the base model's blocks).
// Cases, each server with and without prefix caching in the same run:
//  - TTFT: BENCH_PREFIX_REQUESTS (default 32) requests one after another, each a 1,000-token system
//    prompt + its own 32-token question, adapters in turn; p50 time to the first streamed token;
//  - chat: BENCH_PREFIX_CHATS (default 8) conversations at once (one per adapter), 4 turns each (the
//    system prompt, every earlier question and answer, a new 32-token question; 32 new tokens):
//    aggregate generated tokens per second;
//  - the greedy tokens of every request equal with and without caching; the peak of the engine's
//    live + retained KV bytes against the server's KV budget (max batch × max model length).
import { existsSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { writeRandomAdapter, writeRandomLlama } from '@stageml/engine';
import { seededRandom } from '@stageml/ir';
import type { LlamaShape } from '@stageml/models';
import { createCpuNativeExecutor } from '@stageml/runtime';
import { createServer } from '@stageml/server';
import { type BenchCase, writeResults } from './lib/harness.js';
import { prefixAdapters } from './lib/prefix-adapters.js';
import { median, streamCompletion } from './lib/sse.js';

const DIR = 'bench/tmp/prefix';
const SHAPE: LlamaShape & { maxPositions: number } = { vocabSize: 49152, hiddenSize: 576, intermediateSize: 1536, numLayers: 30, numHeads: 9, numKvHeads: 3, headDim: 64, tieWordEmbeddings: true, rmsNormEps: 1e-5, maxPositions: 2048 };
const LAST = SHAPE.numLayers - 1;
const ADAPTERS = prefixAdapters(LAST, true);
const REQUESTS = Number(process.env['BENCH_PREFIX_REQUESTS'] ?? 32);
const CHATS = Number(process.env['BENCH_PREFIX_CHATS'] ?? 8);
const TURNS = 4;
const MAX_BATCH = 8;
const MAX_MODEL_LEN = 2048;
const threads = Number(process.env['BENCH_THREADS'] ?? 2);
const load0 = loadavg()[0]!;

if (!existsSync(join(DIR, 'smol', 'config.json'))) await writeRandomLlama(join(DIR, 'smol'), SHAPE, 135);
for (const [name, spec] of ADAPTERS) if (!existsSync(join(DIR, 'adapters', name, 'adapter_config.json'))) await writeRandomAdapter(join(DIR, 'adapters', name), SHAPE, spec);

const rand = seededRandom(2024);
/** `n` random token ids (3 and up: no BOS/EOS). */
const ints = (n: number): number[] => Array.from({ length: n }, () => 3 + Math.floor(rand() * (SHAPE.vocabSize - 3)));
const SYSTEM = ints(1000);
const QUESTIONS = Array.from({ length: Math.max(REQUESTS, CHATS * TURNS) }, () => ints(32));



interface Run {
  ttft: number[];
  ttftIds: number[][];
  cached: number[];
  chatIds: number[][];
  chatMs: number;
  chatTokens: number;
  peakKv: number;
  budget: number;
}

async function runServer(prefixCaching: boolean): Promise<Run> {
  const server = await createServer({ modelDir: join(DIR, 'smol'), modelName: 'smol', adaptersDir: join(DIR, 'adapters'), executor: createCpuNativeExecutor({ threads }), maxBatch: MAX_BATCH, maxModelLen: MAX_MODEL_LEN, maxLoras: 8, maxLoraRank: 16, prefixCaching });
  const base = await server.listen('127.0.0.1', 0);
  let peakKv = 0;
  const sampler = setInterval(() => {
    const m = server.lm.memory();
    peakKv = Math.max(peakKv, m.kv + m.prefixKv);
  }, 10);
  try {
    const run: Run = { ttft: [], ttftIds: [], cached: [], chatIds: [], chatMs: 0, chatTokens: 0, peakKv: 0, budget: MAX_BATCH * MAX_MODEL_LEN * server.lm.kvBytesPerToken };
    for (let i = 0; i < REQUESTS; i++) {
      const r = await streamCompletion(base, ADAPTERS[i % ADAPTERS.length]![0], [...SYSTEM, ...QUESTIONS[i]!], 8);
      run.ttft.push(r.ttftMs);
      run.ttftIds.push(r.ids);
      run.cached.push(r.cached);
    }
    const t0 = performance.now();
    const chats = await Promise.all(
      Array.from({ length: CHATS }, async (_, c) => {
        let history = [...SYSTEM];
        const ids: number[] = [];
        for (let t = 0; t < TURNS; t++) {
          const q = QUESTIONS[c * TURNS + t]!;
          const r = await streamCompletion(base, ADAPTERS[c % ADAPTERS.length]![0], [...history, ...q], 32);
          history = [...history, ...q, ...r.ids];
          ids.push(...r.ids);
        }
        return ids;
      }),
    );
    run.chatMs = performance.now() - t0;
    run.chatIds = chats;
    run.chatTokens = chats.reduce((a, c) => a + c.length, 0);
    run.peakKv = peakKv;
    return run;
  } finally {
    clearInterval(sampler);
    await server.shutdown();
  }
}

const off = await runServer(false);
const on = await runServer(true);
const same = JSON.stringify(on.ttftIds) === JSON.stringify(off.ttftIds) && JSON.stringify(on.chatIds) === JSON.stringify(off.chatIds);
const ttftRatio = median(on.ttft) / median(off.ttft);
const chatRatio = on.chatTokens / on.chatMs / (off.chatTokens / off.chatMs);
const cases: BenchCase[] = [
  { name: 'TTFT p50, no prefix caching (baseline)', medianMs: median(off.ttft), runs: REQUESTS },
  { name: 'TTFT p50, prefix caching', medianMs: median(on.ttft), runs: REQUESTS, baseline: 'TTFT p50, no prefix caching (baseline)', ratio: ttftRatio, extra: { goal: '≤ 0.15×', cachedTokensMedian: median(on.cached) } },
  { name: `4-turn chat × ${String(CHATS)}, no prefix caching (baseline): ms for all`, medianMs: off.chatMs, runs: 1, extra: { tokensPerSecond: (1000 * off.chatTokens) / off.chatMs } },
  { name: `4-turn chat × ${String(CHATS)}, prefix caching: ms for all`, medianMs: on.chatMs, runs: 1, baseline: `4-turn chat × ${String(CHATS)}, no prefix caching (baseline): ms for all`, ratio: on.chatMs / off.chatMs, extra: { tokensPerSecond: (1000 * on.chatTokens) / on.chatMs, throughputRatio: chatRatio, goal: 'throughput ≥ 2×' } },
];
const notes = [
  `Greedy tokens identical with and without prefix caching (${String(REQUESTS)} TTFT requests, ${String(CHATS)} × ${String(TURNS)} chat turns): **${same ? 'yes' : 'NO'}**.`,
  `TTFT p50: ${median(on.ttft).toFixed(1)} ms with caching, ${median(off.ttft).toFixed(1)} ms without: **${ttftRatio.toFixed(3)}×** (goal ≤ 0.15×). Cached tokens per request (with caching): ${on.cached.join(', ')}.`,
  `4-turn chat: ${((1000 * on.chatTokens) / on.chatMs).toFixed(1)} tokens/s with caching, ${((1000 * off.chatTokens) / off.chatMs).toFixed(1)} without: **${chatRatio.toFixed(2)}×** (goal ≥ 2×).`,
  `Peak KV held (live + retained, host bytes): ${(on.peakKv / 2 ** 20).toFixed(1)} MiB with caching (budget ${(on.budget / 2 ** 20).toFixed(1)} MiB = max batch ${String(MAX_BATCH)} × max model len ${String(MAX_MODEL_LEN)} × ${String(on.budget / (MAX_BATCH * MAX_MODEL_LEN))} B/position; ${on.peakKv <= on.budget ? 'within' : 'ABOVE'}), ${(off.peakKv / 2 ** 20).toFixed(1)} MiB without.`,
  `cpu-native executor, ${String(threads)} thread(s); load average ${load0.toFixed(2)} at start, ${loadavg()[0]!.toFixed(2)} at the end (a shared, noisy machine: ratios within this run only).`,
];
writeResults('prefix', 'Automatic prefix caching through the HTTP server: SmolLM2-135M-shaped random checkpoint, 8 LoRA adapters r16 (4 reaching every K/V, 4 reaching none), a 1,000-token shared system prompt, cpu-native; with vs without caching in the same run.', cases, notes);
if (!same) process.exitCode = 1;
