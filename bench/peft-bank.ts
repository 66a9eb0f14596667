// Suite `peft-bank`: one linear layer (d_in = d_out = 512) over a mixed batch of 256 rows served by
// 64 LoRA adapters of ranks 4–64 (seeded), some rows base-only. Case: the grouped (SGMV-style) bank,
// one graph for the whole batch. Baseline: a per-adapter loop, one single-adapter `loraLinear`
// graph per adapter run on that adapter's rows plus a base graph for the base-only rows, with the
// host-side gather/scatter of rows that such a loop needs. Same executor, same run, medians of
// interleaved repetitions. Executor: tfjs (wasm backend) when it prepares the graphs, else the
// reference interpreter; the results say which.
import { GraphBuilder, type HostTensor, hostTensor, seededRandom } from '@stageml/ir';
import { type Executor, type PreparedGraph, createTfjsExecutor, interpreterExecutor } from '@stageml/runtime';
// NOTE: by path, because the root package does not (yet) list @stageml/peft among its devDependencies.
import { bankLinearGathered, bankLinearGrouped, chooseBankForm, loraLinear } from '../packages/peft/src/index.js';
import { cpus, loadavg } from 'node:os';
import { type BenchCase, writeResults } from './lib/harness.js';

const RUNS = Number(process.env['BENCH_RUNS'] ?? 21);
const WARMUP = 3;
const D = 512;
const ROWS = 256;
const ADAPTERS = 64;
const BASE_SHARE = 0.1;

/** Seeded uniform stream (mulberry32, the IR interpreter's), so every run is the same. */
const prng = seededRandom;

const rand = prng(0x5eed);
const randn = (n: number, scale: number): Float32Array => Float32Array.from({ length: n }, () => (rand() * 2 - 1) * scale);
const ranks = Array.from({ length: ADAPTERS }, () => 4 + Math.floor(rand() * 61));
const adapterOfRow = Array.from({ length: ROWS }, () => (rand() < BASE_SHARE ? -1 : Math.floor(rand() * ADAPTERS)));
const rowsOf = ranks.map((_, a) => adapterOfRow.flatMap((x, i) => (x === a ? [i] : [])));
const baseRows = adapterOfRow.flatMap((x, i) => (x === -1 ? [i] : []));
const active = ranks.map((_, a) => a).filter((a) => rowsOf[a]!.length > 0);

const x = hostTensor('f32', [ROWS, D], randn(ROWS * D, 1));
const w = hostTensor('f32', [D, D], randn(D * D, 1 / Math.sqrt(D)));
const bias = hostTensor('f32', [D], randn(D, 0.1));
const factors = ranks.map((r) => ({ A: hostTensor('f32', [r, D], randn(r * D, 1 / Math.sqrt(D))), B: hostTensor('f32', [D, r], randn(D * r, 1 / Math.sqrt(r))), scale: 16 / r }));

function grouped(): { graph: ReturnType<GraphBuilder['build']>; weights: Record<string, HostTensor>; inputs: Record<string, HostTensor> } {
  const b = new GraphBuilder('bank');
  const xv = b.input('x', ['f32', ['rows', D]]);
  const weights: Record<string, HostTensor> = { w, bias };
  const inputs: Record<string, HostTensor> = { x };
  const groups = active.map((a) => {
    const f = factors[a]!;
    weights[`A${String(a)}`] = f.A;
    weights[`B${String(a)}`] = f.B;
    inputs[`rows${String(a)}`] = hostTensor('i64', [rowsOf[a]!.length], rowsOf[a]!);
    return {
      rows: b.input(`rows${String(a)}`, ['i64', [`n${String(a)}`]]),
      lora: { A: b.param(`A${String(a)}`, ['f32', [ranks[a]!, D]]), B: b.param(`B${String(a)}`, ['f32', [D, ranks[a]!]]), scale: f.scale },
    };
  });
  b.output('y', bankLinearGrouped(b, xv, b.param('w', ['f32', [D, D]]), b.param('bias', ['f32', [D]]), groups));
  return { graph: b.build(), weights, inputs };
}

/** The BGMV-style form: factors stacked and zero-padded to the largest rank, slot 0 = base-only. */
function gathered(): { graph: ReturnType<GraphBuilder['build']>; weights: Record<string, HostTensor>; inputs: Record<string, HostTensor> } {
  const rMax = Math.max(...ranks);
  const slots = ADAPTERS + 1;
  const A = new Float32Array(slots * rMax * D);
  const B = new Float32Array(slots * D * rMax);
  const scales = new Float32Array(slots);
  factors.forEach((f, a) => {
    const r = ranks[a]!;
    A.set(f.A.data, (a + 1) * rMax * D);
    for (let o = 0; o < D; o++) B.set(f.B.data.subarray(o * r, (o + 1) * r), ((a + 1) * D + o) * rMax);
    scales[a + 1] = f.scale;
  });
  const b = new GraphBuilder('bgmv');
  const xv = b.input('x', ['f32', ['rows', 1, D]]);
  const stacked = { A: b.param('A', ['f32', [slots, rMax, D]]), B: b.param('B', ['f32', [slots, D, rMax]]), scales: b.param('scales', ['f32', [slots]]) };
  const y = bankLinearGathered(b, xv, b.param('w', ['f32', [D, D]]), b.param('bias', ['f32', [D]]), stacked, b.input('slot', ['i64', ['rows']]));
  b.output('y', b.reshape(y, ['rows', D]));
  return {
    graph: b.build(),
    weights: { w, bias, A: hostTensor('f32', [slots, rMax, D], A), B: hostTensor('f32', [slots, D, rMax], B), scales: hostTensor('f32', [slots], scales) },
    inputs: { x: { ...x, shape: [ROWS, 1, D] }, slot: hostTensor('i64', [ROWS], adapterOfRow.map((a) => a + 1)) },
  };
}

function single(a: number | undefined): { graph: ReturnType<GraphBuilder['build']>; weights: Record<string, HostTensor> } {
  const b = new GraphBuilder(a === undefined ? 'base' : `lora${String(a)}`);
  const xv = b.input('x', ['f32', ['rows', D]]);
  const weights: Record<string, HostTensor> = { w, bias };
  let lora;
  if (a !== undefined) {
    const f = factors[a]!;
    weights['A'] = f.A;
    weights['B'] = f.B;
    lora = { A: b.param('A', ['f32', [ranks[a]!, D]]), B: b.param('B', ['f32', [D, ranks[a]!]]), scale: f.scale };
  }
  b.output('y', loraLinear(b, xv, b.param('w', ['f32', [D, D]]), b.param('bias', ['f32', [D]]), lora));
  return { graph: b.build(), weights };
}

function takeRows(rows: readonly number[]): HostTensor {
  const out = new Float32Array(rows.length * D);
  rows.forEach((r, i) => {
    out.set(x.data.subarray(r * D, (r + 1) * D), i * D);
  });
  return hostTensor('f32', [rows.length, D], out);
}

async function pickExecutor(): Promise<{ executor: Executor; note: string }> {
  try {
    const executor = await createTfjsExecutor({ backend: 'wasm' });
    const g0 = grouped();
    const probe = await executor.prepare(g0.graph, g0.weights);
    probe.dispose();
    return { executor, note: 'tfjs-wasm' };
  } catch (e) {
    return { executor: interpreterExecutor, note: `interpreter (tfjs wasm unavailable: ${e instanceof Error ? e.message : String(e)})` };
  }
}

const { executor, note } = await pickExecutor();
const g = grouped();
const bank = await executor.prepare(g.graph, g.weights);
const loop: { rows: readonly number[]; prepared: PreparedGraph; x: HostTensor }[] = [];
for (const a of [undefined, ...active]) {
  const rows = a === undefined ? baseRows : rowsOf[a]!;
  if (rows.length === 0) continue;
  const s = single(a);
  loop.push({ rows, prepared: await executor.prepare(s.graph, s.weights), x: takeRows(rows) });
}

const gg = gathered();
const bgmv = await executor.prepare(gg.graph, gg.weights);
const baseAll = single(undefined);
const basePrepared = await executor.prepare(baseAll.graph, baseAll.weights);

async function runBase(): Promise<HostTensor> {
  return (await basePrepared.run({ x }))['y']!;
}

async function runGathered(): Promise<HostTensor> {
  return (await bgmv.run(gg.inputs))['y']!;
}

async function runBank(): Promise<HostTensor> {
  return (await bank.run(g.inputs))['y']!;
}

async function runLoop(): Promise<HostTensor> {
  const y = new Float32Array(ROWS * D);
  for (const l of loop) {
    // NOTE: the gather is part of the loop's cost (a server slices each adapter's rows out of the batch).
    const xs = takeRows(l.rows);
    const ys = (await l.prepared.run({ x: xs }))['y']!;
    l.rows.forEach((r, i) => {
      y.set(ys.data.subarray(i * D, (i + 1) * D), r * D);
    });
  }
  return hostTensor('f32', [ROWS, D], y);
}

// Both forms must agree before either is timed.
const yl = await runLoop();
let maxErr = 0;
for (const y of [await runBank(), await runGathered()]) {
  for (let i = 0; i < y.data.length; i++) maxErr = Math.max(maxErr, Math.abs(y.data[i]! - yl.data[i]!) / (1 + Math.abs(yl.data[i]!)));
}
if (!(maxErr < 1e-3)) throw new RangeError(`bank and per-adapter outputs differ (max scaled error ${String(maxErr)})`);
const load0 = loadavg()[0]!;

/** Medians (ms) of interleaved timed runs of each async function, after warm-up runs. */
async function medians(fns: readonly (() => Promise<unknown>)[], runs: number, warmup: number): Promise<number[]> {
  const times = fns.map(() => [] as number[]);
  for (let i = 0; i < warmup + runs; i++) {
    for (const [k, fn] of fns.entries()) {
      const t0 = performance.now();
      await fn();
      if (i >= warmup) times[k]!.push(performance.now() - t0);
    }
  }
  return times.map((ts) => {
    ts.sort((p, q) => p - q);
    const mid = ts.length >> 1;
    return ts.length % 2 === 1 ? ts[mid]! : (ts[mid - 1]! + ts[mid]!) / 2;
  });
}

const [bankMs, loopMs, baseMs, gatheredMs] = (await medians([runBank, runLoop, runBase, runGathered], RUNS, WARMUP)) as [number, number, number, number];
const load1 = loadavg()[0]!;
bank.dispose();
bgmv.dispose();
basePrepared.dispose();
for (const l of loop) l.prepared.dispose();

const shape = { adapters: active.length, ranks: `${String(Math.min(...ranks))}–${String(Math.max(...ranks))}`, rows: ROWS, baseRows: baseRows.length, d: D, executor: note };
const cases: BenchCase[] = [
  { name: 'grouped bank (SGMV), one graph', medianMs: bankMs, runs: RUNS, baseline: 'per-adapter loop', ratio: bankMs / loopMs, extra: { rowsPerSecond: Math.round((ROWS / bankMs) * 1000), speedupVsLoop: Number((loopMs / bankMs).toFixed(2)), ...shape } },
  { name: 'per-adapter loop (baseline)', medianMs: loopMs, runs: RUNS, extra: { rowsPerSecond: Math.round((ROWS / loopMs) * 1000), graphRuns: loop.length, ...shape } },
  {
    name: 'gathered bank (BGMV), ranks padded to the largest',
    medianMs: gatheredMs,
    runs: RUNS,
    baseline: 'per-adapter loop',
    ratio: gatheredMs / loopMs,
    extra: { rowsPerSecond: Math.round((ROWS / gatheredMs) * 1000), chooseBankForm: chooseBankForm({ rows: ROWS, groups: active.length, ranks: active.map((a) => ranks[a]!), inDim: D, outDim: D }) },
  },
  { name: 'base linear alone, no adapters (floor)', medianMs: baseMs, runs: RUNS, baseline: 'per-adapter loop', ratio: baseMs / loopMs, extra: { rowsPerSecond: Math.round((ROWS / baseMs) * 1000), bankOverheadMs: Number((bankMs - baseMs).toFixed(3)), loopOverheadMs: Number((loopMs - baseMs).toFixed(3)) } },
];
writeResults(
  'peft-bank',
  `One ${String(D)}×${String(D)} linear over a mixed batch of ${String(ROWS)} rows: ${String(active.length)} LoRA adapters (ranks ${shape.ranks}, seeded) plus ${String(baseRows.length)} base-only rows. Executor: ${note}.`,
  cases,
  [
    `Executor: ${note}. Both forms run on it, prepared once; each timed run uploads the inputs and downloads y.`,
    `Grouped: one graph, base GEMM for all rows + per adapter indexSelect → (x·Aᵀ)·Bᵀ·s → scatterAdd. Loop: ${String(loop.length)} graph runs (one per adapter with rows, plus the base rows), each a full base GEMM on its rows plus its delta, with host gather/scatter of rows.`,
    `Load average (1 min) of the machine during timing: ${load0.toFixed(2)} → ${load1.toFixed(2)} on ${String(cpus().length)} cores; other work on the machine makes absolute times noisy, the interleaved ratios less so.`,
    `Gathered (BGMV): one graph of a few ops, every row padded to rank ${String(Math.max(...ranks))}; \`chooseBankForm\` picks '${chooseBankForm({ rows: ROWS, groups: active.length, ranks: active.map((a) => ranks[a]!), inDim: D, outDim: D })}' for this batch.`,
    `LoRA cost over the base linear alone (${baseMs.toFixed(1)} ms): grouped +${(bankMs - baseMs).toFixed(1)} ms, gathered +${(gatheredMs - baseMs).toFixed(1)} ms, loop +${(loopMs - baseMs).toFixed(1)} ms.`,
    `Outputs agree before timing (max |Δ|/(1+|y|) = ${maxErr.toExponential(2)}). Ratio < 1: the bank is faster. Medians of ${String(RUNS)} interleaved runs after ${String(WARMUP)} warm-up runs.`,
  ],
);
