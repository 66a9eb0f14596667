// Suite `decode-step-profile`: where a 32-row decode step of the serving bench's model goes on
// cpu-native (SmolLM2-135M shape: 30 layers, hidden 576, MLP 1536, 9/3 heads of 64, vocab 49152
// tied; 32 streams, each on its own adapter of ranks 8–64, or all on one). The engine runs
// in-process (no HTTP): 32 sequences of 12-token prompts are prefilled, then DECODE_STEPS greedy
// decode steps are timed with the addon's instruction profiler on. Besides the step time, each
// GEMM-like entry gets its multiply-adds per second, and the notes give the machine's f32 FMA peak
// (`measureFmaPeak`) so the compute floor of the step can be told from its bytes.
//
// Usage: pnpm bench decode-step-profile (ADAPTERS=32|1, ADAPTER_DTYPE=f32|int8, DECODE_STEPS=8,
// BENCH_THREADS=2).
import { existsSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { Engine, writeRandomAdapter, writeRandomLlama } from '@stageml/engine';
import type { LlamaShape } from '@stageml/models';
import { createCpuNativeExecutor, loadCpuAddon, measureFmaPeak } from '@stageml/runtime';
import { type BenchCase, writeResults } from './lib/harness.js';
import { stepFlops } from './lib/roofline.js';

const DIR = 'bench/tmp/serving';
const SHAPE: LlamaShape & { maxPositions: number } = { vocabSize: 49152, hiddenSize: 576, intermediateSize: 1536, numLayers: 30, numHeads: 9, numKvHeads: 3, headDim: 64, tieWordEmbeddings: true, rmsNormEps: 1e-5, maxPositions: 2048 };
const RANKS = Array.from({ length: 32 }, (_, i) => 8 + Math.round((56 * i) / 31));
const NAMES = RANKS.map((r, i) => `a${String(i).padStart(2, '0')}-r${String(r)}`);
const ADAPTERS = Number(process.env['ADAPTERS'] ?? 32);
const DTYPE = (process.env['ADAPTER_DTYPE'] ?? 'f32') as 'f32' | 'int8';
const STEPS = Number(process.env['DECODE_STEPS'] ?? 8);
const ROWS = 32;
const THREADS = Number(process.env['BENCH_THREADS'] ?? 2);

if (!existsSync(join(DIR, 'smol', 'config.json'))) await writeRandomLlama(join(DIR, 'smol'), SHAPE, 135);
for (const [i, name] of NAMES.entries()) {
  if (!existsSync(join(DIR, 'adapters', name, 'adapter_config.json'))) await writeRandomAdapter(join(DIR, 'adapters', name), SHAPE, { rank: RANKS[i]!, seed: 1000 + i });
}
const addon = loadCpuAddon();
if (addon.profile === undefined) throw new Error('the loaded cpu-native addon has no profile() (an older build)');
const load0 = loadavg()[0]!;
const engine = await Engine.load(join(DIR, 'smol'), { executor: createCpuNativeExecutor({ threads: THREADS }), maxLoras: 33, maxLoraRank: 64, adapterDtype: DTYPE });
for (const name of NAMES.slice(0, ADAPTERS)) await engine.loadAdapter(join(DIR, 'adapters', name), name);
const seqs = Array.from({ length: ROWS }, (_, i) => engine.open(NAMES[i % ADAPTERS], Array.from({ length: 12 }, (_, k) => 3 + ((i * 7919 + k * 104729) % 49000))));
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
engine.dispose();
times.sort((a, b) => a - b);
const median = times[times.length >> 1]!;
const total = Object.values(stats).reduce((s, [, ns]) => s + ns, 0);

/** `kind [rows, in] -> [rows, out]` → multiply-adds of one run, for the GEMM entries. */
function macs(key: string): number | undefined {
  const m = /^(?:q?linear|lora_linear|matmul) \[([\d, ]+)\] -> \[([\d, ]+)\]/.exec(key);
  if (m === null) return undefined;
  const a = m[1]!.split(',').map(Number);
  const y = m[2]!.split(',').map(Number);
  return a.reduce((p, d) => p * d, 1) * y.at(-1)!;
}
// An addon older than ABI 6 (STAGEML_CPU_ADDON naming one, for a before/after run) has no probe.
const peak = addon.fmaPeak === undefined ? undefined : measureFmaPeak({ reps: 5 });
const rowRanks = seqs.map((_, i) => RANKS[i % ADAPTERS]!);
const stepGflop = stepFlops({ layers: 30, hidden: 576, intermediate: 1536, heads: 9, kvHeads: 3, headDim: 64, vocab: 49152 }, { rowRanks, contexts: seqs.map(() => 12 + STEPS) }) / 1e9;
const notes = [
  `Load average at start ${load0.toFixed(2)}, at end ${loadavg()[0]!.toFixed(2)} (shared 2-core machine). ${String(ADAPTERS)} adapter(s), ${DTYPE} factors, ${String(ROWS)} rows, ${String(STEPS)} steps.`,
  peak === undefined ? `This step: ${stepGflop.toFixed(2)} GFLOP (the addon has no FMA probe).` : `f32 FMA peak (measureFmaPeak: ${String(peak.threads)} threads of register-only FMAs, now): ${peak.gflops.toFixed(1)} GFLOP/s; this step's ${stepGflop.toFixed(2)} GFLOP take ${((stepGflop / peak.gflops) * 1000).toFixed(1)} ms at that rate (its compute floor).`,
  '',
  `Step median ${median.toFixed(1)} ms (CPU ${cpuMs.toFixed(1)} ms a step over ${String(THREADS)} thread(s)); instructions ${(total / 1e6 / STEPS).toFixed(1)} ms a step.`,
  '',
  '| instruction | runs / step | ms / step | share | GFLOP/s |',
  '| --- | ---: | ---: | ---: | ---: |',
];
for (const [k, [runs, ns]] of Object.entries(stats).sort((a, b) => b[1][1] - a[1][1])) {
  if (ns / total < 0.002) continue;
  const mac = macs(k);
  notes.push(`| ${k} | ${String(runs / STEPS)} | ${(ns / 1e6 / STEPS).toFixed(2)} | ${((100 * ns) / total).toFixed(1)} % | ${mac === undefined ? '—' : ((2 * mac * runs) / ns).toFixed(1)} |`);
}
const cases: BenchCase[] = [{ name: `32 rows · ${String(ADAPTERS)} adapter(s), ${DTYPE}: decode step ms`, medianMs: median, runs: STEPS, extra: { cpuMsPerStep: cpuMs, threads: THREADS } }];
writeResults(`decode-step-profile-${String(ADAPTERS)}-${DTYPE}`, 'cpu-native instruction profile of the serving model\'s 32-row decode step (in-process engine, BENCH_THREADS threads, default 2).', cases, notes);
console.log(notes.join('\n'));
