// A targeted engine decode benchmark (no HTTP): a random Llama-shaped checkpoint (8 layers, hidden
// 512, MLP 1408, 8/4 heads, vocab 8192; f32) on onnxruntime (BENCH_THREADS, default 2), 8 rows over
// 4 adapters and base decoding together; prints load ms and decode ms/step (median of 5 rounds of
// 20 steps). For before/after comparisons of changes to how the engine builds its programs.
import { existsSync } from 'node:fs';
import { Engine, writeRandomAdapter, writeRandomLlama } from '@stageml/engine';
import { createOrtExecutor } from '@stageml/runtime';

const dir = 'bench/tmp/engine-decode';
const shape = { vocabSize: 8192, hiddenSize: 512, intermediateSize: 1408, numLayers: 8, numHeads: 8, numKvHeads: 4 };
if (!existsSync(`${dir}/model.safetensors`)) {
  await writeRandomLlama(dir, shape);
  for (let a = 0; a < 4; a++) await writeRandomAdapter(`${dir}/adapters/a${String(a)}`, shape, { rank: 16, seed: a + 2 });
}
const t0 = performance.now();
const engine = await Engine.load(dir, { executor: await createOrtExecutor({ intraOpNumThreads: Number(process.env['BENCH_THREADS'] ?? 2) }), maxLoras: 4, maxLoraRank: 16 });
const loadMs = performance.now() - t0;
for (let a = 0; a < 4; a++) await engine.loadAdapter(`${dir}/adapters/a${String(a)}`, `a${String(a)}`);
const seqs = Array.from({ length: 8 }, (_, i) => engine.open(i % 5 === 4 ? undefined : `a${String(i % 4)}`, Array.from({ length: 32 }, (_, k) => (k * 7 + i) % 8192)));
for (const s of seqs) {
  await engine.attach(s);
  while (!s.ready) await engine.prefill(s);
}
const last = seqs.map(() => 1);
const rounds: number[] = [];
for (let r = 0; r < 5; r++) {
  const t = performance.now();
  for (let k = 0; k < 20; k++) await engine.decode(seqs, last);
  rounds.push((performance.now() - t) / 20);
}
rounds.sort((a, b) => a - b);
console.log(JSON.stringify({ loadMs: Math.round(loadMs), decodeMsPerStep: Number(rounds[2]!.toFixed(2)), rounds: rounds.map((x) => Number(x.toFixed(2))) }));
engine.dispose();
