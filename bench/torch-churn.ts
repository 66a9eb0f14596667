// `pnpm bench torch-churn`: the router's scheduler over the serving engine on CPU torch with
// resident KV, streams joining and leaving every few steps (staggered arrivals, mixed lengths,
// every other stream on an adapter): steps per second, tokens per second, and what the worker did
// to its cache batch (re-stagings of every row, single rows joining, gathered runs, dummy rows)
// and its step graphs (`EngineStats.executor`); once without graphs (CPU torch's default) and once
// with `STAGEML_TORCH_GRAPHS=emulate` (the CUDA-graph bookkeeping with eager replays, as the CPU
// tests run it: its dummy rows cost compute here that a replayed graph on a GPU does not).
// `STAGEML_TORCH_PATH=<dir>` runs another worker (e.g. an older checkout's native/) for a before/after.
import { cpSync, mkdtempSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { Engine, writeRandomAdapter, writeRandomLlama } from '@stageml/engine';
import type { LlamaShape } from '@stageml/models';
import { Scheduler } from '@stageml/router';
import { createTorchExecutor, isTorchAvailable } from '@stageml/runtime';
import { type BenchCase, writeResults } from './lib/harness.js';

if (!isTorchAvailable()) {
  console.error('torch-churn: needs Python 3 with torch (apt-get install python3-torch, or STAGEML_PYTHON)');
  process.exit(1);
}
const shape: LlamaShape & { maxPositions: number } = {
  vocabSize: 1024,
  hiddenSize: 256,
  intermediateSize: 704,
  numLayers: 4,
  numHeads: 4,
  numKvHeads: 2,
  maxPositions: 1024,
};
const STREAMS = Number(process.env['CHURN_STREAMS'] ?? 24);
const dir = mkdtempSync(join(tmpdir(), 'stageml-bench-torch-churn-'));
const loadBefore = loadavg()[0]!;
try {
  const model = join(dir, 'model');
  await writeRandomLlama(model, shape, 5);
  cpSync(new URL('../fixtures/peft-tiny/llama/base/tokenizer.json', import.meta.url), join(model, 'tokenizer.json'));
  await writeRandomAdapter(join(dir, 'adapter'), shape, { rank: 8 });
  const cases: BenchCase[] = [];
  let torchVersion = '';
  for (const graphs of ['0', 'emulate']) {
    const executor = await createTorchExecutor({ device: 'cpu', env: { STAGEML_TORCH_GRAPHS: graphs } });
    torchVersion = executor.info.torch;
    try {
      const engine = await Engine.load(model, { executor, maxLoras: 2, maxLoraRank: 8, prefillChunk: 16 });
      await engine.loadAdapter(join(dir, 'adapter'), 'a');
      const scheduler = new Scheduler(engine, { maxBatch: 16 });
      // Warm-up: the programs' first runs.
      await scheduler.submit({ tenant: 't', adapter: undefined, prompt: [1, 2, 3], maxNewTokens: 2, sampling: { greedy: true }, stopTokens: [] });
      const before = engine.stats();
      const t0 = performance.now();
      const jobs: Promise<unknown>[] = [];
      let tokens = 0;
      for (let i = 0; i < STREAMS; i++) {
        // Lengths 6..29 new tokens, prompts 8..39: streams finish (and new ones arrive) every few steps.
        const prompt = Array.from({ length: 8 + ((i * 7) % 32) }, (_, j) => 1 + ((i * 31 + j * 17) % 1000));
        jobs.push(
          scheduler
            .submit({
              tenant: 't',
              adapter: i % 2 === 1 ? 'a' : undefined,
              prompt,
              maxNewTokens: 6 + ((i * 11) % 24),
              sampling: { greedy: true },
              stopTokens: [],
            })
            .then((r) => (tokens += r.newIds.length)),
        );
        if (i % 2 === 1) await new Promise((resolve) => setTimeout(resolve, 15));
      }
      await Promise.all(jobs);
      const ms = performance.now() - t0;
      const after = engine.stats();
      const stats = Object.fromEntries(Object.entries(after.executor).map(([k, v]) => [k, v - (before.executor[k] ?? 0)]));
      const steps = after.steps - before.steps;
      cases.push({
        name: `${String(STREAMS)} streams joining and leaving, resident KV, graphs ${graphs}`,
        medianMs: ms / steps,
        runs: steps,
        extra: {
          stepsPerSecond: (1000 * steps) / ms,
          tokensPerSecond: (1000 * tokens) / ms,
          engineRuns: after.runs - before.runs,
          mergedSteps: after.mergedSteps - before.mergedSteps,
          ...stats,
        },
      });
      engine.dispose();
    } finally {
      await executor.close();
    }
  }
  const loadAfter = loadavg()[0]!;
  writeResults(
    'torch-churn',
    `The scheduler over the engine on CPU torch ${torchVersion} (resident KV), random Llama ${String(shape.numLayers)} layers × ${String(shape.hiddenSize)} wide, ${String(STREAMS)} greedy streams arriving two at a time, 6–29 new tokens each (rows join and leave every few steps), maxBatch 16. Time per step (mean), steps and tokens per second, and the worker's cache-batch and graph counters over the run.`,
    cases,
    [
      '## Counters',
      '',
      ...cases.flatMap((c) => [
        `### ${c.name}`,
        '',
        ...Object.entries(c.extra ?? {}).map(([k, v]) => `- ${k}: ${typeof v === 'number' && !Number.isInteger(v) ? v.toFixed(2) : String(v)}`),
        '',
      ]),
      '',
      `Load average (1 min): ${loadBefore.toFixed(2)} before, ${loadAfter.toFixed(2)} after (a 2-core machine shared with other work).`,
    ],
  );
} finally {
  rmSync(dir, { recursive: true, force: true });
}
