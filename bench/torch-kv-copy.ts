// `pnpm bench torch-kv-copy`: what the engine's host copy of resident KV costs per decode step on
// the torch executor (CPU torch here): greedy steps with `hostKvCopy: true` (every step's new keys
// and values cross to the host, f32, and are appended to each sequence's host buffers; the
// behaviour before the KV lived on the worker only) against the default (they stay on the worker,
// `RunOptions.omit`). The model is thin but its KV is the Llama-3-8B shape (32 layers, 8 KV heads
// of 128), so the bytes per step are the 8B's: 64 rows × 256 KB = 16.8 MB.
import { cpSync, mkdtempSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { Engine, writeRandomLlama } from '@stageml/engine';
import type { LlamaShape } from '@stageml/models';
import { createTorchExecutor, isTorchAvailable } from '@stageml/runtime';
import { type BenchCase, writeResults } from './lib/harness.js';

if (!isTorchAvailable()) {
  console.error('torch-kv-copy: needs Python 3 with torch (apt-get install python3-torch, or STAGEML_PYTHON)');
  process.exit(1);
}
const shape: LlamaShape & { maxPositions: number } = { vocabSize: 2048, hiddenSize: 128, intermediateSize: 256, numLayers: 32, numHeads: 8, numKvHeads: 8, headDim: 128, maxPositions: 1024 };
const STEPS = 12;
const CONTEXT = 128;
const dir = mkdtempSync(join(tmpdir(), 'stageml-bench-torch-kv-copy-'));
const loadBefore = loadavg()[0]!;
try {
  const model = join(dir, 'model');
  await writeRandomLlama(model, shape, 5);
  cpSync(new URL('../fixtures/peft-tiny/llama/base/tokenizer.json', import.meta.url), join(model, 'tokenizer.json'));
  const executor = await createTorchExecutor({ device: 'cpu' });
  const cases: BenchCase[] = [];
  try {
    for (const rows of [1, 16, 64]) {
      for (const hostKvCopy of [true, false]) {
        const e = await Engine.load(model, { executor, maxLoras: 1, maxLoraRank: 8, hostKvCopy });
        const seqs = Array.from({ length: rows }, (_, r) => e.open(undefined, Array.from({ length: CONTEXT }, (_, i) => 1 + ((i * 7 + r) % 2000))));
        for (const s of seqs) await e.attach(s);
        while (seqs.some((s) => !s.ready)) await e.prefillMany(seqs.filter((s) => !s.ready), { maxChunk: 128 });
        const times: number[] = [];
        let received = 0;
        let tokens = seqs.map((_, r) => 3 + r);
        for (let i = 0; i < STEPS; i++) {
          const r0 = executor.traffic().receivedBytes;
          const t0 = performance.now();
          tokens = await e.decodeGreedy(seqs, tokens);
          times.push(performance.now() - t0);
          received = executor.traffic().receivedBytes - r0;
        }
        const hostKv = e.memory().kv;
        for (const s of seqs) e.release(s);
        e.dispose();
        times.sort((a, b) => a - b);
        const label = (copy: boolean): string => `${String(rows)} row${rows > 1 ? 's' : ''}, ${copy ? 'host copy (hostKvCopy)' : 'KV on the worker only'}`;
        const medianMs = (times[(STEPS >> 1) - 1]! + times[STEPS >> 1]!) / 2;
        const peer = hostKvCopy ? undefined : cases.find((c) => c.name === label(true));
        cases.push({ name: label(hostKvCopy), medianMs, runs: STEPS, ...(peer === undefined ? {} : { baseline: peer.name, ratio: medianMs / peer.medianMs }), extra: { receivedBytesPerStep: received, hostKvBytes: hostKv } });
      }
    }
  } finally {
    await executor.close();
  }
  const loadAfter = loadavg()[0]!;
  writeResults(
    'torch-kv-copy',
    `Greedy decode steps of the serving engine on the torch executor (CPU torch), a random Llama with the Llama-3-8B KV shape (${String(shape.numLayers)} layers, ${String(shape.numKvHeads)} KV heads × ${String(shape.headDim)}) and thin layers (hidden ${String(shape.hiddenSize)}), ${String(CONTEXT)} prompt positions per row, base rows: the engine's host copy of the KV (baseline: each step's new keys and values received as f32 and appended on the host) against the KV on the worker only (the default). Median of ${String(STEPS)} steps.`,
    cases,
    [
      '## Bytes received per step, host KV held',
      '',
      ...cases.map((c) => `- ${c.name}: ${String(c.extra!['receivedBytesPerStep'])} B received per step; host KV ${(Number(c.extra!['hostKvBytes']) / 2 ** 20).toFixed(1)} MiB`),
      '',
      `Load average (1 min): ${loadBefore.toFixed(2)} before, ${loadAfter.toFixed(2)} after (a 2-core machine). The step's compute here is the thin model's on the CPU; on a GPU the compute is the 8B's and the copy's share of the step is what the GPU worker measurements give (bench/results/gpu-worker.md).`,
    ],
  );
} finally {
  rmSync(dir, { recursive: true, force: true });
}
