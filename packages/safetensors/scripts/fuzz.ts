/**
 * Mutation fuzzer for the safetensors reader.
 *
 *   node --conditions=@stageml/source --import tsx packages/safetensors/scripts/fuzz.ts --iterations 100000 --seed 1
 *
 * Every case must end in a `SafetensorsError` with a code or in reads that match the reference
 * decoder (see src/fuzz.ts). Cases run in a worker thread; the main thread is a watchdog that
 * terminates the worker when one case makes no progress for `--case-timeout-ms` (default 5000) and
 * reports that case's index, which `fuzzInput(seed, index)` reproduces. Exits 1 on any failure.
 */
import { Worker, isMainThread, parentPort, workerData } from 'node:worker_threads';

import { type FuzzReport, runFuzz } from '../src/fuzz.js';

interface Job {
  readonly seed: number;
  readonly iterations: number;
  readonly progress: SharedArrayBuffer;
}

function flag(args: readonly string[], name: string, fallback: number): number {
  const at = args.indexOf(`--${name}`);
  const value = at >= 0 ? Number(args[at + 1]) : fallback;
  if (!Number.isSafeInteger(value) || value < 0) {
    process.stderr.write(`--${name} must be a non-negative integer\n`);
    process.exit(2);
  }
  return value;
}

function worker(job: Job): void {
  const progress = new Int32Array(job.progress);
  const report = runFuzz({
    seed: job.seed,
    iterations: job.iterations,
    onCase: (i) => {
      Atomics.store(progress, 0, i);
      Atomics.add(progress, 1, 1);
    },
  });
  parentPort?.postMessage(report);
}

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  const iterations = flag(args, 'iterations', 100_000);
  const seed = flag(args, 'seed', 1);
  const caseTimeoutMs = flag(args, 'case-timeout-ms', 5000);
  const progress = new SharedArrayBuffer(8);
  const view = new Int32Array(progress);
  const started = performance.now();
  // NOTE: Node 20 does not carry `--import tsx` module hooks into worker threads, so the worker
  // registers tsx itself before importing this file.
  const boot = `import(${JSON.stringify(import.meta.resolve('tsx/esm/api'))}).then(({ register }) => { register(); return import(${JSON.stringify(import.meta.url)}); })`;
  const w = new Worker(boot, { eval: true, execArgv: ['--conditions=@stageml/source'], workerData: { seed, iterations, progress } satisfies Job });
  let lastTick = -1;
  let lastChange = performance.now();
  const result = await new Promise<FuzzReport | { hang: number } | { crash: string }>((resolve) => {
    const timer = setInterval(() => {
      const tick = Atomics.load(view, 1);
      if (tick !== lastTick) {
        lastTick = tick;
        lastChange = performance.now();
      } else if (performance.now() - lastChange > caseTimeoutMs) {
        clearInterval(timer);
        const index = Atomics.load(view, 0);
        void w.terminate().then(() => resolve({ hang: index }));
      }
    }, 100);
    w.once('message', (r: FuzzReport) => {
      clearInterval(timer);
      resolve(r);
    });
    w.once('error', (e) => {
      clearInterval(timer);
      resolve({ crash: String(e) });
    });
  });
  const seconds = (performance.now() - started) / 1000;
  if ('hang' in result) {
    process.stdout.write(`HANG: case ${String(result.hang)} of seed ${String(seed)} made no progress for ${String(caseTimeoutMs)} ms\n`);
    process.exit(1);
  }
  if ('crash' in result) {
    process.stdout.write(`CRASH: worker died: ${result.crash}\n`);
    process.exit(1);
  }
  const summary = { seed, seconds: Number(seconds.toFixed(1)), ...result, failures: result.failures.slice(0, 20), failureCount: result.failures.length };
  process.stdout.write(`${JSON.stringify(summary, null, 2)}\n`);
  process.exit(result.failures.length === 0 ? 0 : 1);
}

if (isMainThread) await main();
else worker(workerData as Job);
