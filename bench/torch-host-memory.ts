// Suite `torch-host-memory`: what the Node process holds when the weights and slot tables live on
// the torch worker's device (issue 41: no host copy of the weights or factors; the host side of a
// slot write O(one adapter), not O(slots)). The reference server on `--executor torch` (CPU torch
// here; the same code path as CUDA) with a random Llama checkpoint (8 layers, hidden 1024, MLP
// 2816, vocab 32000; f32) and 8 or 64 LoRA adapters of rank 16 on all seven projections, each
// count in a process of its own: Node's RSS before the server, at ready and its peak while the
// adapters load, against the factors the worker holds.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { writeRandomAdapter, writeRandomLlama } from '@stageml/engine';
import { createTorchExecutor } from '@stageml/runtime';
import { createServer } from '@stageml/server';
import { type BenchCase, writeResults } from './lib/harness.js';

const DIR = 'bench/tmp/torch-host-memory';
const SHAPE = { vocabSize: 32000, hiddenSize: 1024, intermediateSize: 2816, numLayers: 8, numHeads: 16, numKvHeads: 4, headDim: 64, tieWordEmbeddings: false, rmsNormEps: 1e-5, maxPositions: 2048 };
const COUNTS = [8, 64];
const adapterDir = (i: number): string => join(DIR, 'adapters', `a${String(i).padStart(2, '0')}`);

interface Measured {
  readonly adapters: number;
  readonly readyMs: number;
  readonly beforeMB: number;
  readonly readyMB: number;
  readonly peakMB: number;
  readonly externalMB: number;
  readonly hostAdaptersMB: number;
  readonly slotFactorsMB: number;
  readonly onDeviceMB: number;
}

/** One count, in this process: the server on the CPU torch executor with `n` adapters. */
async function measure(n: number): Promise<Measured> {
  let peak = process.memoryUsage().rss;
  const sampler = setInterval(() => {
    peak = Math.max(peak, process.memoryUsage().rss);
  }, 5);
  const executor = await createTorchExecutor({ device: 'cpu' });
  const before = process.memoryUsage().rss;
  const loras = Object.fromEntries(Array.from({ length: n }, (_, i) => [`a${String(i)}`, adapterDir(i)]));
  const t0 = performance.now();
  const server = await createServer({ modelDir: join(DIR, 'base'), modelName: 'm', loraModules: loras, executor, maxLoras: 64, maxLoraRank: 16, maxBatch: 8 });
  const readyMs = performance.now() - t0;
  const ready = process.memoryUsage();
  clearInterval(sampler);
  const m = server.lm.memory();
  await server.shutdown();
  await executor.close();
  return { adapters: n, readyMs, beforeMB: before / 1e6, readyMB: ready.rss / 1e6, peakMB: Math.max(peak, ready.rss) / 1e6, externalMB: ready.external / 1e6, hostAdaptersMB: m.hostAdapters / 1e6, slotFactorsMB: m.slotFactors / 1e6, onDeviceMB: m.onDevice / 1e6 };
}

if (process.argv[2] === '--child') {
  process.stdout.write(`${JSON.stringify(await measure(Number(process.argv[3])))}\n`);
} else {
  const load0 = loadavg()[0]!;
  if (!existsSync(join(DIR, 'base', 'config.json'))) await writeRandomLlama(join(DIR, 'base'), SHAPE, 5);
  for (let i = 0; i < Math.max(...COUNTS); i++) if (!existsSync(join(adapterDir(i), 'adapter_config.json'))) await writeRandomAdapter(adapterDir(i), SHAPE, { rank: 16, seed: 500 + i });
  const runs: Measured[] = [];
  for (const n of COUNTS) {
    const r = spawnSync(process.execPath, ['--conditions=@stageml/source', '--import', 'tsx', 'bench/torch-host-memory.ts', '--child', String(n)], { encoding: 'utf8', maxBuffer: 1 << 26 });
    const line = r.stdout.trim().split('\n').filter((l) => l.startsWith('{"adapters"')).at(-1);
    if (r.status !== 0 || line === undefined) throw new Error(`count ${String(n)}: exit ${String(r.status)}: ${r.stderr.slice(-2000)}`);
    runs.push(JSON.parse(line) as Measured);
  }
  const [few, many] = [runs[0]!, runs[1]!];
  const cases: BenchCase[] = runs.map((r) => ({ name: `Node RSS at ready, ${String(r.adapters)} adapters (MB)`, medianMs: r.readyMB, runs: 1, ...(r === few ? {} : { baseline: `Node RSS at ready, ${String(few.adapters)} adapters (MB)`, ratio: r.readyMB / few.readyMB }), extra: { ...r } }));
  cases.push({ name: `Node RSS peak while loading, ${String(many.adapters)} adapters (MB)`, medianMs: many.peakMB, runs: 1, baseline: `Node RSS peak while loading, ${String(few.adapters)} adapters (MB)`, ratio: many.peakMB / few.peakMB });
  const notes = [
    `Load average at start ${load0.toFixed(2)}, at end ${loadavg()[0]!.toFixed(2)} (shared machine; memory is not load-sensitive, ready times are). CPU torch worker; each count in its own Node process.`,
    '',
    `**Host side of device-resident tables:** with ${String(few.adapters)} adapters Node held ${few.readyMB.toFixed(0)} MB at ready (peak ${few.peakMB.toFixed(0)} MB), with ${String(many.adapters)} adapters ${many.readyMB.toFixed(0)} MB (peak ${many.peakMB.toFixed(0)} MB), while the worker holds ${few.slotFactorsMB.toFixed(0)} vs ${many.slotFactorsMB.toFixed(0)} MB of factors and ${many.onDeviceMB.toFixed(0)} MB on its device in all. The host keeps ${many.hostAdaptersMB.toFixed(0)} MB of parsed adapters (one, the default --max-cpu-loras on device tables), and a slot write waits for the last one to land, so a burst of loads holds one adapter's rows in flight. Before that change (the engine's adapter-slots.ts of main at 06e04de, the same measurement run once by hand in a scratch script) it gave 237 MB at ready with 8 adapters and 492 MB with 64 (315 MB of ArrayBuffers: every load's rows queued on the worker's pipe). Ready after ${(few.readyMs / 1000).toFixed(1)} s and ${(many.readyMs / 1000).toFixed(1)} s.`,
  ];
  writeResults('torch-host-memory', 'Node RSS with the weights and slot tables on the torch worker (CPU torch, random 8-layer Llama, 8 vs 64 LoRA adapters r16): the host must not grow with the number of slots.', cases, notes);
}
