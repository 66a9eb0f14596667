// Suite `executor-auto`: the measurements behind `--executor auto`'s candidates and fallbacks.
// Every executor (cpu-native, onnxruntime, tfjs-wasm, tfjs-cpu) runs the probe `selectExecutor`
// uses — 4 Llama decoder layers' decode step at a model's widths (the fixture's 2), at batch 1 and 8 — on the
// bundled fixture's shape, SmolLM2-135M's and TinyLlama-1.1B's, f32 and int8 (blocks of 32).
// Writes bench/results/executor-auto.{json,md}: the median step per batch and which executor
// `auto` picks from cpu-native and onnxruntime.
import { writeFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { type ExecutorName, type ExecutorProbeShape, selectExecutor } from '@stageml/runtime';

const ALL: readonly ExecutorName[] = ['cpu-native', 'onnxruntime', 'tfjs-wasm', 'tfjs-cpu'];
const q8 = { bits: 8 as const, blockSize: 32, symmetric: true };
const MODELS: readonly { name: string; shape: ExecutorProbeShape }[] = [
  { name: 'fixture (peft-tiny llama)', shape: { hidden: 64, intermediate: 176, heads: 4, kvHeads: 2, headDim: 16, layers: 2 } },
  { name: 'SmolLM2-135M', shape: { hidden: 576, intermediate: 1536, heads: 9, kvHeads: 3, headDim: 64 } },
  { name: 'TinyLlama-1.1B', shape: { hidden: 2048, intermediate: 5632, heads: 32, kvHeads: 4, headDim: 64 } },
];

interface Row {
  model: string;
  dtype: string;
  ms: Partial<Record<ExecutorName, readonly number[]>>;
  auto: string;
}
const rows: Row[] = [];
const load0 = loadavg()[0]!;
for (const m of MODELS) {
  for (const quantize of [undefined, q8]) {
    const shape = { layers: 4, ...m.shape, batches: [1, 8], ...(quantize === undefined ? {} : { quantize }) };
    const every = await selectExecutor({ candidates: ALL, fallbacks: [], shape, cacheFile: false, refresh: true });
    const auto = await selectExecutor({ shape, cacheFile: false, refresh: true });
    const row = { model: m.name, dtype: quantize === undefined ? 'f32' : 'int8', ms: every.probeMs, auto: `${auto.name} (${Object.entries(auto.probeMs).map(([n, t]) => `${n} ${t.map((x) => (Number.isFinite(x) ? x.toFixed(2) : '–')).join(' + ')}`).join(', ')} ms)` };
    rows.push(row);
    console.log(JSON.stringify(row));
  }
}
const fmt = (t: readonly number[] | undefined, i: number): string => (t === undefined ? 'failed' : Number.isFinite(t[i]) ? t[i]!.toFixed(2) : 'gave up');
const lines = [
  '# executor-auto: a stack of decoder layers\' decode step per executor',
  '',
  `Written by \`bench/executor-auto.ts\` (${new Date().toISOString()}, load average ${load0.toFixed(2)} → ${loadavg()[0]!.toFixed(2)} on a 2-core machine shared with other work).`,
  'Median ms of the probe `selectExecutor` runs: 4 decoder layers (2 for the fixture), each RMSNorm, q/k/v, attention over 128 cached tokens, o, residual, RMSNorm, gated MLP, residual (over 128 MB of f32 weights, fewer heads and MLP rows: TinyLlama\'s 4 layers at 0.16×);',
  'an executor whose first run at a batch is over 4× the best median so far is not run further ("gave up": it cannot win).',
  '',
  `| model | weights | ${ALL.map((n) => `${n} b1 | ${n} b8`).join(' | ')} | \`auto\` picks |`,
  `| --- | --- | ${ALL.map(() => '---: | ---:').join(' | ')} | --- |`,
  ...rows.map((r) => `| ${r.model} | ${r.dtype} | ${ALL.map((n) => `${fmt(r.ms[n], 0)} | ${fmt(r.ms[n], 1)}`).join(' | ')} | ${r.auto} |`),
  '',
  'tfjs-wasm and tfjs-cpu are 10–1000× slower than cpu-native and onnxruntime on every row, so `auto` measures them only where neither of those runs (`DEFAULT_FALLBACKS`).',
  '',
];
writeFileSync('bench/results/executor-auto.md', lines.join('\n'));
writeFileSync('bench/results/executor-auto.json', `${JSON.stringify({ suite: 'executor-auto', date: new Date().toISOString(), rows }, null, 2)}\n`);
