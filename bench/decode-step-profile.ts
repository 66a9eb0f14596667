// Suite `decode-step-profile`: where a decode step goes on cpu-native, instruction by
// instruction. By default the serving bench's model and step (SmolLM2-135M shape: 30 layers,
// hidden 576, MLP 1536, 9/3 heads of 64, vocab 49152 tied; 32 streams, each on its own adapter of
// ranks 8–64, or all on one); `SHAPE=qwen3` takes bench/llamacpp's Qwen3 shape instead (8 layers,
// hidden 1024, MLP 3072, 16/8 heads of 128, vocab 151936 tied; 8 adapters of rank 16 on all 7
// projections, bench/lib/llama-weights). The engine runs in-process (no HTTP): ROWS sequences of
// 12-token prompts are prefilled, then DECODE_STEPS greedy decode steps are timed with the addon's
// instruction profiler on. Each GEMM-like entry gets its multiply-adds per second and the GB/s at
// which it streamed its weights, beside the read bandwidth of a STREAM-like probe of the same run
// (bench/lib/roofline.ts, as bench/llamacpp): at batch 1 a step is memory-bound, and a GEMV below
// the probe's rate is where a step loses to the roofline. The notes give the machine's f32 FMA
// peak (`measureFmaPeak`) so the compute floor of the step can be told from its bytes.
//
// Usage: pnpm bench decode-step-profile (SHAPE=smol|qwen3, ROWS=32, SLOT_FORM=auto|gathered|grouped, ADAPTERS=32|1|0 (0: base rows
// only; the Qwen3 shape has 8 adapters), ADAPTER_DTYPE=f32|int8, QUANTIZE=int8|int4 (base weights;
// default f32), DECODE_STEPS=8, BENCH_THREADS=2). The results file is decode-step-profile-<adapters>-
// <dtype> for the default shape and rows, else decode-step-profile-<shape>-b<rows>-<adapters>-<dtype>
// (with -<quantize> for quantized weights).
import { existsSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { Engine, writeRandomAdapter, writeRandomLlama } from '@stageml/engine';
import type { LlamaShape } from '@stageml/models';
import { createCpuNativeExecutor, loadCpuAddon, measureFmaPeak, parseWeightQuantSpec } from '@stageml/runtime';
import { type BenchCase, writeResults } from './lib/harness.js';
import { ADAPTER_NAMES, RANK, makeCheckpoint, mkdir } from './lib/llama-weights.js';
import { bandwidthNote, bestBandwidth, probeBandwidth, rooflineMs, stepBytes, stepFlops } from './lib/roofline.js';

const SHAPE_KEY = process.env['SHAPE'] ?? 'smol';
if (SHAPE_KEY !== 'smol' && SHAPE_KEY !== 'qwen3') throw new Error(`SHAPE must be smol or qwen3, got ${SHAPE_KEY}`);
const QWEN3 = SHAPE_KEY === 'qwen3';
const SMOL: LlamaShape & { maxPositions: number } = { vocabSize: 49152, hiddenSize: 576, intermediateSize: 1536, numLayers: 30, numHeads: 9, numKvHeads: 3, headDim: 64, tieWordEmbeddings: true, rmsNormEps: 1e-5, maxPositions: 2048 };
/** The shape's widths as the byte and FLOP counts take them. */
const ROOF = QWEN3 ? { layers: 8, hidden: 1024, intermediate: 3072, heads: 16, kvHeads: 8, headDim: 128, vocab: 151936 } : { layers: 30, hidden: 576, intermediate: 1536, heads: 9, kvHeads: 3, headDim: 64, vocab: 49152 };
const SMOL_RANKS = Array.from({ length: 32 }, (_, i) => 8 + Math.round((56 * i) / 31));
const RANKS = QWEN3 ? ADAPTER_NAMES.map(() => RANK) : SMOL_RANKS;
const NAMES = QWEN3 ? ADAPTER_NAMES : SMOL_RANKS.map((r, i) => `a${String(i).padStart(2, '0')}-r${String(r)}`);
const ADAPTERS = Number(process.env['ADAPTERS'] ?? NAMES.length);
if (!Number.isSafeInteger(ADAPTERS) || ADAPTERS < 0 || ADAPTERS > NAMES.length) throw new Error(`ADAPTERS must be an integer in [0, ${String(NAMES.length)}], got ${String(ADAPTERS)}`);
const DTYPE = (process.env['ADAPTER_DTYPE'] ?? 'f32') as 'f32' | 'int8';
const QUANTIZE = process.env['QUANTIZE'];
if (QUANTIZE !== undefined && QUANTIZE !== 'int8' && QUANTIZE !== 'int4') throw new Error(`QUANTIZE must be int8 or int4, got ${QUANTIZE}`);
/** Bytes a base weight takes in the step's format (block-32 codes + an f32 scale when quantized). */
const WEIGHT_BYTES = QUANTIZE === 'int8' ? 36 / 32 : QUANTIZE === 'int4' ? 20 / 32 : 4;
const STEPS = Number(process.env['DECODE_STEPS'] ?? 8);
const ROWS = Number(process.env['ROWS'] ?? 32);
if (!Number.isSafeInteger(ROWS) || ROWS < 1) throw new Error(`ROWS must be a positive integer, got ${String(ROWS)}`);
const THREADS = Number(process.env['BENCH_THREADS'] ?? 2);
/** The engine's `slotForm` (default auto: the single form for a batch of one adapter). */
const SLOT_FORM = (process.env['SLOT_FORM'] ?? 'auto') as 'auto' | 'gathered' | 'grouped';
const PROMPT = 12;

const DIR = QWEN3 ? 'bench/tmp/decode-step-profile/qwen3' : 'bench/tmp/serving';
const MODEL = QWEN3 ? DIR : join(DIR, 'smol');
const adapterDir = (name: string): string => join(DIR, 'adapters', name);
if (QWEN3) {
  if (!existsSync(join(MODEL, 'config.json')) || !existsSync(adapterDir(NAMES.at(-1)!))) await makeCheckpoint({ key: 'qwen3', name: 'Qwen3-0.6B shape, 8 layers', family: 'qwen3', layers: 8, hidden: 1024, inter: 3072, heads: 16, kv: 8, headDim: 128, vocab: 151936, tied: true }, mkdir(DIR));
} else {
  if (!existsSync(join(MODEL, 'config.json'))) await writeRandomLlama(MODEL, SMOL, 135);
  for (const [i, name] of NAMES.entries()) {
    if (!existsSync(join(adapterDir(name), 'adapter_config.json'))) await writeRandomAdapter(adapterDir(name), SMOL, { rank: RANKS[i]!, seed: 1000 + i });
  }
}
const addon = loadCpuAddon();
if (addon.profile === undefined) throw new Error('the loaded cpu-native addon has no profile() (an older build)');
const load0 = loadavg()[0]!;
// recycleOutputs: each run writes into the previous run's output buffer, as `stageml serve` runs.
const engine = await Engine.load(MODEL, { executor: createCpuNativeExecutor({ threads: THREADS }), recycleOutputs: true, slotForm: SLOT_FORM, maxLoras: NAMES.length + 1, maxLoraRank: Math.max(...RANKS), adapterDtype: DTYPE, ...(QUANTIZE === undefined ? {} : { quantize: parseWeightQuantSpec(QUANTIZE) }) });
for (const name of NAMES.slice(0, ADAPTERS)) await engine.loadAdapter(adapterDir(name), name);
// The probe runs on the engine's pool (created above), before and after the timed steps.
const bwStart = probeBandwidth();
const seqs = Array.from({ length: ROWS }, (_, i) => engine.open(ADAPTERS === 0 ? undefined : NAMES[i % ADAPTERS], Array.from({ length: PROMPT }, (_, k) => 3 + ((i * 7919 + k * 104729) % 49000))));
for (const s of seqs) {
  await engine.attach(s);
  while (!s.ready) await engine.prefill(s);
}
let last = seqs.map(() => 1);
last = await engine.decodeGreedy(seqs, last);
addon.profile(true);
const times: number[] = [];
const cpu0 = process.cpuUsage();
for (let k = 0; k < STEPS; k++) {
  const t = performance.now();
  last = await engine.decodeGreedy(seqs, last);
  times.push(performance.now() - t);
}
const cpu = process.cpuUsage(cpu0);
// CPU time of the process a step (user + system, all threads): on a machine shared with other
// work it moves less than the wall time (with 1 thread, not at all for descheduling).
const cpuMs = (cpu.user + cpu.system) / 1000 / STEPS;
const stats = JSON.parse(addon.profile(false)) as Record<string, [number, number]>;
const bw = bestBandwidth(bwStart, probeBandwidth());
engine.dispose();
const mean = times.reduce((a, b) => a + b, 0) / times.length;
times.sort((a, b) => a - b);
const median = times[times.length >> 1]!;
const total = Object.values(stats).reduce((s, [, ns]) => s + ns, 0);

/**
 * A GEMM entry's key → its multiply-adds and the bytes of its weights (read once a run), or
 * undefined for other instructions. `linear_multi [rows, in] -> [rows, a] + [rows, b] …` counts
 * every sibling; a `matmul`'s right operand (a LoRA factor) counts as its weights, at 4 bytes.
 */
function gemmOf(key: string): { macs: number; weightBytes: number } | undefined {
  const m = /^(q?linear(?:_multi)?|lora_linear|matmul) \[([\d, ]+)\] ->((?: \+? ?\[[\d, ]+\])+)(?: int(\d))?$/.exec(key);
  if (m === null) return undefined;
  const a = m[2]!.split(',').map(Number);
  const outs = [...m[3]!.matchAll(/\[([\d, ]+)\]/g)].map((o) => Number(o[1]!.split(',').at(-1)));
  const rows = a.slice(0, -1).reduce((p, d) => p * d, 1);
  const k = a.at(-1)!;
  const n = outs.reduce((p, d) => p + d, 0);
  const bytes = m[1]!.startsWith('q') ? (m[4] === '4' ? 20 / 32 : 36 / 32) : 4;
  return { macs: rows * k * n, weightBytes: k * n * bytes };
}
// An addon older than ABI 6 (STAGEML_CPU_ADDON naming one, for a before/after run) has no probe.
const peak = addon.fmaPeak === undefined ? undefined : measureFmaPeak({ reps: 5 });
const rowRanks = seqs.map((_, i) => (ADAPTERS === 0 ? 0 : RANKS[i % ADAPTERS]!));
const contexts = seqs.map(() => PROMPT + STEPS);
const stepGflop = stepFlops(ROOF, { rowRanks, contexts }) / 1e9;
const distinct = ADAPTERS === 0 ? [] : RANKS.slice(0, Math.min(ADAPTERS, ROWS));
const roofMs = rooflineMs(stepBytes(ROOF, { bytesPerWeight: WEIGHT_BYTES, adapterRanks: distinct, contexts, ...(DTYPE === 'int8' ? { factorBytesPerElement: 1 } : {}) }), bw);
const instrMs = total / 1e6 / STEPS;
const what = `${String(ROWS)} row(s) · ${ADAPTERS === 0 ? 'base' : `${String(ADAPTERS)} adapter(s), ${DTYPE} factors`}${QUANTIZE === undefined ? '' : `, ${QUANTIZE} weights`}`;
const notes = [
  `Shape: ${QWEN3 ? 'bench/llamacpp\'s Qwen3-0.6B shape at 8 layers (hidden 1024, MLP 3072, 16/8 heads of 128, vocab 151936 tied)' : 'bench/serving\'s SmolLM2-135M shape (30 layers, hidden 576, MLP 1536, 9/3 heads of 64, vocab 49152 tied)'}; ${what}; ${String(STEPS)} steps. Load average at start ${load0.toFixed(2)}, at end ${loadavg()[0]!.toFixed(2)} (shared 2-core machine).`,
  peak === undefined ? `This step: ${stepGflop.toFixed(2)} GFLOP (the addon has no FMA probe).` : `f32 FMA peak (measureFmaPeak: ${String(peak.threads)} threads of register-only FMAs, now): ${peak.gflops.toFixed(1)} GFLOP/s; this step's ${stepGflop.toFixed(2)} GFLOP take ${((stepGflop / peak.gflops) * 1000).toFixed(1)} ms at that rate (its compute floor).`,
  '',
  bandwidthNote(bw),
  '',
  `Step median ${median.toFixed(1)} ms (CPU ${cpuMs.toFixed(1)} ms a step over ${String(THREADS)} thread(s)); mean ${mean.toFixed(1)} ms, of which the instructions take ${instrMs.toFixed(1)} ms and ${(mean - instrMs).toFixed(1)} ms is outside them (the host's work between runs, the run's dispatch); roofline ${roofMs.toFixed(1)} ms (median ÷ roofline ${(median / roofMs).toFixed(2)}). GB/s: the weights' bytes an instruction streams ÷ its time (the probe reads ${bw.readGBs.toFixed(1)} GB/s).`,
  '',
  '| instruction | runs / step | ms / step | share | GFLOP/s | weights GB/s | ÷ probe |',
  '| --- | ---: | ---: | ---: | ---: | ---: | ---: |',
];
for (const [k, [runs, ns]] of Object.entries(stats).sort((a, b) => b[1][1] - a[1][1])) {
  if (ns / total < 0.002) continue;
  const g = gemmOf(k);
  const gbs = g === undefined ? undefined : (g.weightBytes * runs) / ns;
  notes.push(`| ${k} | ${String(runs / STEPS)} | ${(ns / 1e6 / STEPS).toFixed(2)} | ${((100 * ns) / total).toFixed(1)} % | ${g === undefined ? '—' : ((2 * g.macs * runs) / ns).toFixed(1)} | ${gbs === undefined ? '—' : gbs.toFixed(1)} | ${gbs === undefined ? '—' : (gbs / bw.readGBs).toFixed(2)} |`);
}
const name = `${String(ROWS)} rows · ${ADAPTERS === 0 ? 'base' : `${String(ADAPTERS)} adapter(s), ${DTYPE}`}${QUANTIZE === undefined ? '' : `, ${QUANTIZE}`}: decode step ms`;
const cases: BenchCase[] = [{ name, medianMs: median, runs: STEPS, rooflineMs: roofMs, extra: { cpuMsPerStep: cpuMs, threads: THREADS, meanMs: mean, instructionMsPerStep: instrMs, readGBs: bw.readGBs } }];
const suite = !QWEN3 && ROWS === 32 && QUANTIZE === undefined ? `decode-step-profile-${String(ADAPTERS)}-${DTYPE}` : `decode-step-profile-${SHAPE_KEY}-b${String(ROWS)}-${String(ADAPTERS)}-${DTYPE}${QUANTIZE === undefined ? '' : `-${QUANTIZE}`}`;
writeResults(suite, `cpu-native instruction profile of a decode step (in-process engine, BENCH_THREADS threads, default 2): ${what}.`, cases, notes);
