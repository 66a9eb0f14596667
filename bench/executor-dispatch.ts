// Suite `executor-dispatch`: per-op dispatch overhead of the tfjs executor (wasm and cpu backends)
// against the reference interpreter, on a chain of N tiny element-wise ops over an f32[1, 8]
// tensor (median run time / N), plus the marginal cost per op ((t_N − t_1) / (N − 1), which removes
// the fixed per-run cost of input checks, upload, download and dispose), and a medium case: one
// 256×256 matmul. Baselines: the interpreter on the same graph, measured in the same run.
import { type Graph, GraphBuilder, type HostTensor, hostTensor } from '@stageml/ir';

import { interpreterExecutor } from '../packages/runtime/src/interpreter-executor.js';
import type { Executor } from '../packages/runtime/src/executor.js';
import { createTfjsExecutor } from '../packages/runtime/src/tfjs/index.js';
import { type BenchCase, writeResults } from './lib/harness.js';

const N = 200;
const RUNS = Number(process.env['BENCH_RUNS'] ?? 201);

/** Median wall time (ms) of an async `fn` over `runs` runs after `warmup` unmeasured runs. */
async function medianMsAsync(fn: () => Promise<unknown>, runs: number, warmup = Math.max(3, runs >> 3)): Promise<number> {
  for (let i = 0; i < warmup; i++) await fn();
  const times: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    await fn();
    times.push(performance.now() - t0);
  }
  times.sort((a, b) => a - b);
  const mid = times.length >> 1;
  return times.length % 2 === 1 ? times[mid]! : (times[mid - 1]! + times[mid]!) / 2;
}

/** y = x, then n ops alternating y + a and y · m over f32[1, 8] (a, m parameters of shape [8]). */
function chain(n: number): Graph {
  const b = new GraphBuilder(`chain${String(n)}`);
  let y = b.input('x', ['f32', [1, 8]]);
  const a = b.param('a', ['f32', [8]]);
  const m = b.param('m', ['f32', [8]]);
  for (let i = 0; i < n; i++) y = i % 2 === 0 ? b.add(y, a) : b.mul(y, m);
  b.output('y', y);
  return b.build();
}

function matmulGraph(): Graph {
  const b = new GraphBuilder('matmul256');
  b.output('y', b.matmul(b.input('x', ['f32', [256, 256]]), b.param('w', ['f32', [256, 256]])));
  return b.build();
}

function filled(shape: readonly number[], f: (i: number) => number): HostTensor {
  const n = shape.reduce((p, d) => p * d, 1);
  return hostTensor('f32', shape, Array.from({ length: n }, (_, i) => f(i)));
}

const chainWeights = { a: filled([8], (i) => 0.5 + i / 64), m: filled([8], () => 0.5) };
const chainInputs = { x: filled([1, 8], (i) => i) };
const mmWeights = { w: filled([256, 256], (i) => ((i * 7919) % 101) / 101 - 0.5) };
const mmInputs = { x: filled([256, 256], (i) => ((i * 104729) % 97) / 97 - 0.5) };

async function timeRun(executor: Executor, graph: Graph, weights: Record<string, HostTensor>, inputs: Record<string, HostTensor>, runs: number): Promise<number> {
  const prepared = await executor.prepare(graph, weights);
  try {
    return await medianMsAsync(() => prepared.run(inputs), runs);
  } finally {
    prepared.dispose();
  }
}

const executors: { label: string; executor: Executor }[] = [
  { label: 'interpreter', executor: interpreterExecutor },
  { label: 'tfjs-wasm', executor: await createTfjsExecutor({ backend: 'wasm' }) },
  { label: 'tfjs-cpu', executor: await createTfjsExecutor({ backend: 'cpu' }) },
];

const cases: BenchCase[] = [];
const notes: string[] = [];
const one = chain(1);
const many = chain(N);
const mm = matmulGraph();
let interpChain = 0;
let interpMatmul = 0;
for (const { label, executor } of executors) {
  const t1 = await timeRun(executor, one, chainWeights, chainInputs, RUNS);
  const tN = await timeRun(executor, many, chainWeights, chainInputs, RUNS);
  const perOpUs = (tN / N) * 1000;
  const marginalUs = ((tN - t1) / (N - 1)) * 1000;
  if (label === 'interpreter') interpChain = tN;
  cases.push({
    name: `chain of ${String(N)} ops, f32[1,8], ${label}`,
    medianMs: tN,
    runs: RUNS,
    ...(label === 'interpreter' ? {} : { baseline: `chain of ${String(N)} ops, f32[1,8], interpreter`, ratio: tN / interpChain }),
    extra: { perOpUs: Number(perOpUs.toFixed(2)), marginalPerOpUs: Number(marginalUs.toFixed(2)), singleOpRunMs: Number(t1.toFixed(4)) },
  });
  notes.push(`- ${label}: ${perOpUs.toFixed(2)} µs per op (run / N), ${marginalUs.toFixed(2)} µs marginal per op, ${(t1 * 1000).toFixed(1)} µs for a one-op run.`);
}
for (const { label, executor } of executors) {
  const runs = label === 'interpreter' ? 11 : 31;
  const t = await timeRun(executor, mm, mmWeights, mmInputs, runs);
  if (label === 'interpreter') interpMatmul = t;
  cases.push({
    name: `matmul 256×256·256×256, ${label}`,
    medianMs: t,
    runs,
    ...(label === 'interpreter' ? {} : { baseline: 'matmul 256×256·256×256, interpreter', ratio: t / interpMatmul }),
    extra: { gflops: Number(((2 * 256 ** 3) / (t * 1e6)).toFixed(3)) },
  });
}

writeResults(
  'executor-dispatch',
  `Per-op dispatch overhead of the tfjs executor: a chain of ${String(N)} element-wise ops (add/mul alternating with [8] parameters) over an f32[1, 8] input, median run time; per op = run / N, marginal = (t_N − t_1)/(N − 1). Medium case: one 256×256 matmul. Ratios are against the reference interpreter on the same graph in the same process.`,
  cases,
  [
    '## Per-op overhead',
    '',
    ...notes,
    '',
    'A run includes input checks, one upload per input, the kernels inside one tf.tidy scope, one download per output and disposal. tfjs under Node runs wasm single-threaded.',
  ],
);
