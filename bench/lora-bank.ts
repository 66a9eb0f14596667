// Suite `lora-bank`: the cpu-native adapter-bank kernel alone (the gathered `loraBank` of the
// engine's slot programs) against its roofline, at bench/serving's many-adapter step: 32 rows, each
// on its own adapter (ranks 8–64) in 34 slots of rank 64, the 7 projections of SmolLM2-135M's shape
// for LAYERS layers (BENCH_BANK_LAYERS, default 8). Three programs in one process, runs interleaved:
// without and with the `zeroTail` promise the engine's programs carry, and with the factors as int8
// codes with a scale per rank row (`quantizedLoraBank`, `--adapter-dtype int8`). The padding rows of the
// slots are written (as after a slot's earlier, larger adapter was freed): never-written padding
// would map the kernel's reads to the shared zero page and hide their cost.
import { loadavg } from 'node:os';
import { GraphBuilder, type HostTensor, seededRandom } from '@stageml/ir';
import { quantizeFactorRows } from '@stageml/planner';
import { createCpuNativeExecutor } from '@stageml/runtime';
import { type BenchCase, writeResults } from './lib/harness.js';
import { bandwidthNote, bestBandwidth, probeBandwidth, rooflineMs } from './lib/roofline.js';

const threads = Number(process.env['BENCH_THREADS'] ?? 2);
const LAYERS = Number(process.env['BENCH_BANK_LAYERS'] ?? 8);
const SLOTS = 34;
const R = 64;
const ROWS = 32;
const RANKS = Array.from({ length: 32 }, (_, i) => 8 + Math.round((56 * i) / 31));
const HIDDEN = 576;
const INTER = 1536;
// q, k, v, o, gate, up, down as [in, out].
const PROJ: readonly [number, number][] = [[HIDDEN, HIDDEN], [HIDDEN, 192], [HIDDEN, 192], [HIDDEN, HIDDEN], [HIDDEN, INTER], [HIDDEN, INTER], [INTER, HIDDEN]];
const load0 = loadavg()[0]!;
const executor = createCpuNativeExecutor({ threads });
const bwStart = probeBandwidth();

function bankGraph(zeroTail: boolean, int8 = false) {
  const b = new GraphBuilder('bank');
  const xs = new Map([HIDDEN, INTER].map((k) => [k, b.input(`x${String(k)}`, ['f32', [ROWS, 1, k]])] as const));
  const idx = b.input('row_slot', ['i64', [ROWS]]);
  for (let l = 0; l < LAYERS; l++) {
    for (const [p, [K, N]] of PROJ.entries()) {
      const name = `${String(l)}.${String(p)}`;
      const base = b.input(`base.${name}`, ['f32', [ROWS, 1, N]]);
      const y = int8
        ? b.quantizedLoraBank('gathered', xs.get(K)!, base, b.input(`A8.${name}`, ['i8', [SLOTS, R, K]]), b.input(`As.${name}`, ['f32', [SLOTS, R]]), b.input(`B8.${name}`, ['i8', [SLOTS, R, N]]), b.input(`Bs.${name}`, ['f32', [SLOTS, R]]), idx, undefined, { zeroTail })
        : b.loraBank('gathered', xs.get(K)!, base, b.input(`A.${name}`, ['f32', [SLOTS, R, K]]), b.input(`B.${name}`, ['f32', [SLOTS, R, N]]), idx, undefined, { zeroTail });
      b.output(`y.${name}`, y);
    }
  }
  return b.build();
}

const rand = seededRandom(7);
const inputs: Record<string, HostTensor> = {
  row_slot: { dtype: 'i64', shape: [ROWS], data: Float64Array.from({ length: ROWS }, (_, i) => i + 1) },
};
for (const k of [HIDDEN, INTER]) inputs[`x${String(k)}`] = { dtype: 'f32', shape: [ROWS, 1, k], data: Float32Array.from({ length: ROWS * k }, () => rand() - 0.5) };
let factorBytes = 0;
let int8Bytes = 0;
const int8Inputs: Record<string, HostTensor> = { row_slot: inputs['row_slot']!, [`x${String(HIDDEN)}`]: inputs[`x${String(HIDDEN)}`]!, [`x${String(INTER)}`]: inputs[`x${String(INTER)}`]! };
for (let l = 0; l < LAYERS; l++) {
  for (const [p, [K, N]] of PROJ.entries()) {
    const name = `${String(l)}.${String(p)}`;
    // fill(1).fill(0): every page written, as a reused slot's zeroed padding is.
    const A = new Float32Array(SLOTS * R * K).fill(1).fill(0);
    const B = new Float32Array(SLOTS * R * N).fill(1).fill(0);
    for (const [i, r] of RANKS.entries()) {
      const s = i + 1;
      for (let j = 0; j < r * K; j++) A[s * R * K + j] = rand() - 0.5;
      for (let j = 0; j < r * N; j++) B[s * R * N + j] = (rand() - 0.5) * 0.01;
      factorBytes += r * (K + N) * 4;
    }
    inputs[`A.${name}`] = { dtype: 'f32', shape: [SLOTS, R, K], data: A };
    inputs[`B.${name}`] = { dtype: 'f32', shape: [SLOTS, R, N], data: B };
    inputs[`base.${name}`] = { dtype: 'f32', shape: [ROWS, 1, N], data: new Float32Array(ROWS * N) };
    // The same factors as the engine's int8 tables hold them (B's rows are its [R, N] rows here).
    const A8 = new Int8Array(SLOTS * R * K).fill(1).fill(0);
    const B8 = new Int8Array(SLOTS * R * N).fill(1).fill(0);
    const As = new Float32Array(SLOTS * R);
    const Bs = new Float32Array(SLOTS * R);
    for (const [i, r] of RANKS.entries()) {
      const s = i + 1;
      quantizeFactorRows(A.subarray(s * R * K, (s * R + r) * K), r, K, A8, s * R * K, As, s * R);
      quantizeFactorRows(B.subarray(s * R * N, (s * R + r) * N), r, N, B8, s * R * N, Bs, s * R);
      int8Bytes += r * (K + N) + 2 * r * 4;
    }
    Object.assign(int8Inputs, {
      [`A8.${name}`]: { dtype: 'i8', shape: [SLOTS, R, K], data: A8 },
      [`B8.${name}`]: { dtype: 'i8', shape: [SLOTS, R, N], data: B8 },
      [`As.${name}`]: { dtype: 'f32', shape: [SLOTS, R], data: As },
      [`Bs.${name}`]: { dtype: 'f32', shape: [SLOTS, R], data: Bs },
      [`base.${name}`]: inputs[`base.${name}`]!,
    });
  }
}

const padded = await executor.prepare(bankGraph(false));
const promised = await executor.prepare(bankGraph(true));
const int8 = await executor.prepare(bankGraph(true, true));
const times = { padded: [] as number[], promised: [] as number[], int8: [] as number[] };
for (let i = 0; i < 2; i++) {
  await padded.run(inputs);
  await promised.run(inputs);
  await int8.run(int8Inputs);
}
for (let i = 0; i < 15; i++) {
  for (const [key, p, feed] of [['padded', padded, inputs], ['promised', promised, inputs], ['int8', int8, int8Inputs]] as const) {
    const t0 = performance.now();
    await p.run(feed);
    times[key].push(performance.now() - t0);
  }
}
const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[xs.length >> 1]!;
const bw = bestBandwidth(bwStart, probeBandwidth());
const roof = rooflineMs(factorBytes, bw);
const cases: BenchCase[] = [
  { name: `bank, 32 rows × 32 adapters (r8–64), ${String(LAYERS)} layers × 7 projections: A's padding read`, medianMs: median(times.padded), runs: 15, rooflineMs: roof },
  { name: `bank, 32 rows × 32 adapters (r8–64), ${String(LAYERS)} layers × 7 projections: zeroTail (no padding read)`, medianMs: median(times.promised), runs: 15, baseline: `bank, 32 rows × 32 adapters (r8–64), ${String(LAYERS)} layers × 7 projections: A's padding read`, ratio: median(times.promised) / median(times.padded), rooflineMs: roof },
  { name: `bank, 32 rows × 32 adapters (r8–64), ${String(LAYERS)} layers × 7 projections: int8 factors, zeroTail`, medianMs: median(times.int8), runs: 15, baseline: `bank, 32 rows × 32 adapters (r8–64), ${String(LAYERS)} layers × 7 projections: zeroTail (no padding read)`, ratio: median(times.int8) / median(times.promised), rooflineMs: rooflineMs(int8Bytes, bw), extra: { speedupOverF32: median(times.promised) / median(times.int8), int8MB: int8Bytes / 1e6, f32MB: factorBytes / 1e6 } },
];
writeResults('lora-bank', `cpu-native's gathered adapter-bank kernel alone at bench/serving's many-adapter step (32 rows on 32 adapters of ranks 8–64 in rank-64 slots, SmolLM2-135M's 7 projections × ${String(LAYERS)} layers), without and with the zeroTail promise, and with int8 factors (codes + a scale per rank row); roofline = the factors' unpadded bytes (${(factorBytes / 1e6).toFixed(0)} MB f32, ${(int8Bytes / 1e6).toFixed(0)} MB int8) ÷ the probed read bandwidth.`, cases, [
  `Load average at start ${load0.toFixed(2)}, at end ${loadavg()[0]!.toFixed(2)} (shared machine: ratios come from the same run, runs interleaved). ${String(threads)} kernel threads (${executor.isa}, ${executor.build}).`,
  '',
  bandwidthNote(bw),
  '',
  "The slots' padding pages are written (zeros), as they are after a slot's earlier adapter of a higher rank was freed; padding never written maps every read to the kernel's shared zero page, which costs little, so a fresh bank shows a smaller difference.",
]);
padded.dispose();
promised.dispose();
int8.dispose();
