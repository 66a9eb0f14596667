// `pnpm bench torch-sample`: sampled decode steps of the serving engine on the torch executor (CPU
// torch here) at Llama 3's 128,256-token vocabulary, the pick made where the logits are
// (`Engine.decodeSample`: the worker draws each row with the host's draw and sends one id per row)
// against the logits crossing to the host and picked there (`Engine.decode` + `samplePick`, what the
// scheduler did for every step with a sampled row). The model is thin (the step's compute is
// small) so that what is measured is what sampling costs: the reply, its decoding and the picks.
// Both paths draw the same numbers; their tokens are compared.
import { cpSync, mkdtempSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { Engine, type RowSample, writeRandomLlama } from '@stageml/engine';
import { type LlamaShape, type SamplingOptions, makePicker, pickPlan } from '@stageml/models';
import { createTorchExecutor, isTorchAvailable } from '@stageml/runtime';
import { type BenchCase, writeResults } from './lib/harness.js';

if (!isTorchAvailable()) {
  console.error('torch-sample: needs Python 3 with torch (apt-get install python3-torch, or STAGEML_PYTHON)');
  process.exit(1);
}
const shape: LlamaShape & { maxPositions: number } = { vocabSize: 128256, hiddenSize: 64, intermediateSize: 128, numLayers: 2, numHeads: 4, numKvHeads: 2, maxPositions: 512 };
const STEPS = 8;
const CONTEXT = 16;
const SETTINGS: readonly { readonly label: string; readonly sampling: Exclude<SamplingOptions, { readonly greedy: true }> }[] = [
  { label: 'top-p 0.95, T 0.8', sampling: { temperature: 0.8, topP: 0.95 } },
  { label: 'top-k 50, T 0.7', sampling: { temperature: 0.7, topK: 50 } },
  { label: 'top-p 0.95, T 0.8, presence 0.5, repetition 1.1', sampling: { temperature: 0.8, topP: 0.95, presencePenalty: 0.5, repetitionPenalty: 1.1 } },
];
const dir = mkdtempSync(join(tmpdir(), 'stageml-bench-torch-sample-'));
const loadBefore = loadavg()[0]!;
try {
  const model = join(dir, 'model');
  await writeRandomLlama(model, shape, 7);
  cpSync(new URL('../fixtures/peft-tiny/llama/base/tokenizer.json', import.meta.url), join(model, 'tokenizer.json'));
  const executor = await createTorchExecutor({ device: 'cpu' });
  const cases: BenchCase[] = [];
  const equal: string[] = [];
  try {
    // executorPicks: the worker picks (the default only on CUDA); the baseline picks from decode's logits.
    const e = await Engine.load(model, { executor, maxLoras: 1, maxLoraRank: 8, executorPicks: true });
    for (const rows of [1, 16, 64]) {
      for (const setting of SETTINGS) {
        const tokensOf: Record<string, number[][]> = {};
        for (const onWorker of [false, true]) {
          const seqs = Array.from({ length: rows }, (_, r) => e.open(undefined, Array.from({ length: CONTEXT }, (_, i) => 1 + ((i * 7919 + r * 104729) % 128000))));
          for (const s of seqs) await e.attach(s);
          while (seqs.some((s) => !s.ready)) await e.prefillMany(seqs.filter((s) => !s.ready));
          // One picker per row, as the scheduler holds them: on the host it picks from the logits;
          // for the worker its plan gives the row's spec (its draw, its processing) and takes the pick.
          const pickers = seqs.map((s, r) => makePicker({ ...setting.sampling, seed: 1000 + r, promptIds: s.prompt }));
          const plans = pickers.map((p) => pickPlan(p)!);
          let tokens = seqs.map((_, r) => 3 + r);
          const out: number[][] = seqs.map(() => []);
          const times: number[] = [];
          let received = 0;
          for (let i = 0; i < STEPS; i++) {
            const r0 = executor.traffic().receivedBytes;
            const t0 = performance.now();
            if (onWorker) {
              const specs: RowSample[] = plans.map((p) => {
                if (p.kind !== 'sample') throw new RangeError('a sampling plan was expected');
                const processing = p.processing?.();
                return { temperature: p.temperature, topK: p.topK, topP: p.topP, u: p.draw(), ...(processing === undefined ? {} : { processing }) };
              });
              tokens = await e.decodeSample(seqs, tokens, specs);
              tokens.forEach((t, r) => plans[r]!.accept?.(t));
            } else tokens = (await e.decode(seqs, tokens)).map((l, r) => pickers[r]!(l));
            times.push(performance.now() - t0);
            received = executor.traffic().receivedBytes - r0;
            tokens.forEach((t, r) => out[r]!.push(t));
          }
          for (const s of seqs) e.release(s);
          times.sort((a, b) => a - b);
          const medianMs = (times[(STEPS >> 1) - 1]! + times[STEPS >> 1]!) / 2;
          const label = (w: boolean): string => `${String(rows)} row${rows > 1 ? 's' : ''}, ${setting.label}, ${w ? 'picked on the worker (decodeSample)' : 'logits to the host, picked there'}`;
          const peer = onWorker ? cases.find((c) => c.name === label(false)) : undefined;
          cases.push({ name: label(onWorker), medianMs, runs: STEPS, ...(peer === undefined ? {} : { baseline: peer.name, ratio: medianMs / peer.medianMs }), extra: { receivedBytesPerStep: received } });
          tokensOf[String(onWorker)] = out;
        }
        equal.push(`${String(rows)} rows, ${setting.label}: ${JSON.stringify(tokensOf['true']) === JSON.stringify(tokensOf['false']) ? 'the same tokens' : 'TOKENS DIFFER'}`);
      }
    }
    e.dispose();
  } finally {
    await executor.close();
  }
  const loadAfter = loadavg()[0]!;
  writeResults(
    'torch-sample',
    `Sampled decode steps of the serving engine on the torch executor (CPU torch), a thin random Llama (${String(shape.numLayers)} layers, hidden ${String(shape.hiddenSize)}) with Llama 3's ${String(shape.vocabSize)}-token vocabulary, ${String(CONTEXT)} prompt positions per row, KV resident on the worker: each row's token drawn on the worker (\`Engine.decodeSample\`, one i64 per row in the reply) against the logits sent to the host (f32, rows × vocabulary) and drawn there with \`samplePick\` (baseline: what every step with a sampled row did), each row's picker driving both (its draws; its processing for the penalized setting, sent with the row to the worker). Both draw the same numbers. Median of ${String(STEPS)} steps.`,
    cases,
    [
      '## Bytes received per step; tokens',
      '',
      ...cases.map((c) => `- ${c.name}: ${String(c.extra!['receivedBytesPerStep'])} B received per step`),
      '',
      ...equal.map((l) => `- ${l}`),
      '',
      `Load average (1 min): ${loadBefore.toFixed(2)} before, ${loadAfter.toFixed(2)} after (a 2-core machine). On this CPU the worker's own pick is compute the host would otherwise do: a stable sort of each row for top-p alone (slower than the host's radix sort), the candidates at or above the k-th value for top-k (faster than the host's pick with the reply); on a GPU it runs where the logits are, and what leaves the device is the ids. No peer runs here: vLLM samples on the GPU, which this path now does too; torch's CPU warpers are bench/results/sampling.md's peer for the host sampler.`,
    ],
  );
} finally {
  rmSync(dir, { recursive: true, force: true });
}
