// `pnpm bench torch-engine`: the serving engine on the torch executor (CPU torch here): decode
// steps with the KV cache fed from the host against the KV resident on the worker
// (`EngineOptions.residentKv`), in f32 and bf16 — median step time and the bytes one step sends
// to the worker (`TorchExecutor.traffic()`), at 64 and 512 positions of context, 1 and 8 rows.
import { cpSync, mkdtempSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { Engine, writeRandomAdapter, writeRandomLlama } from '@stageml/engine';
import type { LlamaShape } from '@stageml/models';
import { createTorchExecutor, isTorchAvailable } from '@stageml/runtime';
import { type BenchCase, writeResults } from './lib/harness.js';

if (!isTorchAvailable()) {
  console.error('torch-engine: needs Python 3 with torch (apt-get install python3-torch, or STAGEML_PYTHON)');
  process.exit(1);
}
const shape: LlamaShape & { maxPositions: number } = { vocabSize: 2048, hiddenSize: 512, intermediateSize: 1408, numLayers: 4, numHeads: 8, numKvHeads: 4, maxPositions: 1024 };
const dir = mkdtempSync(join(tmpdir(), 'stageml-bench-torch-engine-'));
const STEPS = 16;
const loadBefore = loadavg()[0]!;
try {
  const model = join(dir, 'model');
  await writeRandomLlama(model, shape, 3);
  cpSync(new URL('../fixtures/peft-tiny/llama/base/tokenizer.json', import.meta.url), join(model, 'tokenizer.json'));
  await writeRandomAdapter(join(dir, 'adapter'), shape, { rank: 8 });
  const executor = await createTorchExecutor({ device: 'cpu' });
  const cases: BenchCase[] = [];
  try {
    for (const dtype of ['f32', 'bf16'] as const) {
      for (const residentKv of [false, true]) {
        const e = await Engine.load(model, { executor, maxLoras: 2, maxLoraRank: 8, residentKv, dtype });
        await e.loadAdapter(join(dir, 'adapter'), 'a');
        for (const [rows, context] of [[1, 64], [1, 512], [8, 512]] as const) {
          // Every other row on the adapter.
          const seqs = Array.from({ length: rows }, (_, r) => e.open(r % 2 === 1 ? 'a' : undefined, Array.from({ length: context }, (_, i) => 1 + ((i + r) % 2000))));
          for (const s of seqs) await e.attach(s);
          while (seqs.some((s) => !s.ready)) await e.prefillMany(seqs.filter((s) => !s.ready), { maxChunk: 256 });
          const times: number[] = [];
          let bytes = 0;
          for (let i = 0; i < STEPS; i++) {
            const b0 = executor.traffic().sentBytes;
            const t0 = performance.now();
            await e.decode(seqs, seqs.map(() => 5 + i));
            times.push(performance.now() - t0);
            bytes = executor.traffic().sentBytes - b0;
          }
          for (const s of seqs) e.release(s);
          times.sort((a, b) => a - b);
          const name = `${dtype}, ${String(rows)} row${rows > 1 ? 's' : ''}, ${String(context)} positions, KV ${residentKv ? 'resident' : 'from the host'}`;
          const baseline = `${dtype}, ${String(rows)} row${rows > 1 ? 's' : ''}, ${String(context)} positions, KV from the host`;
          const medianMs = (times[(STEPS >> 1) - 1]! + times[STEPS >> 1]!) / 2;
          const peer = cases.find((c) => c.name === baseline);
          cases.push({ name, medianMs, runs: STEPS, ...(peer === undefined ? {} : { baseline, ratio: medianMs / peer.medianMs }), extra: { bytesPerStep: bytes, ...(peer === undefined ? {} : { bytesRatio: bytes / Number(peer.extra!['bytesPerStep']) }) } });
        }
        e.dispose();
      }
    }
  } finally {
    await executor.close();
  }
  const loadAfter = loadavg()[0]!;
  writeResults(
    'torch-engine',
    `Decode steps of the serving engine on the torch executor (CPU torch ${executor.info.torch}), random Llama ${String(shape.numLayers)} layers × ${String(shape.hiddenSize)} wide (GQA ${String(shape.numHeads)}/${String(shape.numKvHeads)}), slots r8, every other row on an adapter: the KV cache fed from the host each step (baseline) against resident on the worker. Median of ${String(STEPS)} steps; bytes per step = everything written to the worker for one step.`,
    cases,
    [
      '## Bytes per step',
      '',
      ...cases.map((c) => `- ${c.name}: ${String(c.extra!['bytesPerStep'])} B${c.extra!['bytesRatio'] === undefined ? '' : ` (${(Number(c.extra!['bytesRatio']) * 100).toFixed(2)} % of the host-fed step)`}`),
      '',
      `Load average (1 min): ${loadBefore.toFixed(2)} before, ${loadAfter.toFixed(2)} after (a 2-core machine shared with other work). On the CPU the step is compute-bound, so sending the context costs little time. The resident worker keeps the batch staged on its device while its rows stay the same (reads are views, appends in place), and re-stages it when they change.`,
    ],
  );
} finally {
  rmSync(dir, { recursive: true, force: true });
}
