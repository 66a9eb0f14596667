// The server side of `pnpm bench host-step`: the reference server (createServer, its engine and
// scheduler) on the torch executor whose worker is the stub of bench/lib/torch-stub (the real
// protocol, no compute), in its own process so the HTTP clients do not share its event loop.
// Options come as JSON in STAGEML_BENCH_HOST_STEP; the address is printed as `listening <url>`.
// GET /bench/host-step answers the step loop's clock (`Scheduler.stepStats`), the engine's own
// split (inputs built, program runs, readback; timed here by wrapping the executor and the
// engine's `step`) and the worker's counters. Stops on SIGTERM or when stdin closes.
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { HostTensor } from '@stageml/ir';
import { type RunOptions, createTorchExecutor } from '@stageml/runtime';
import { createServer } from '@stageml/server';

interface Options {
  readonly modelDir: string;
  readonly adaptersDir?: string;
  readonly maxLoras: number;
  readonly maxLoraRank: number;
  readonly kernelMs: number;
  readonly vocab: number;
}
const o = JSON.parse(process.env['STAGEML_BENCH_HOST_STEP'] ?? '{}') as Options;
const here = dirname(fileURLToPath(import.meta.url));
const executor = await createTorchExecutor({
  packageDir: join(here, 'torch-stub'),
  device: 'cuda',
  log: (line) => process.stderr.write(`[stub] ${line}\n`),
  env: { STAGEML_STUB_REAL_PATH: resolve(here, '../../native/stageml_torch'), STAGEML_STUB_KERNEL_MS: String(o.kernelMs), STAGEML_STUB_VOCAB: String(o.vocab) },
});

/** Host time inside `Engine.step`, split at the program runs it makes. */
const clock = { steps: 0, runs: 0, inputsMs: 0, runMs: 0, readbackMs: 0 };
let stepAt = 0;
let lastRunEnd = 0;
let firstRun = true;
const prepare = executor.prepare.bind(executor);
executor.prepare = async (graph, weights) => {
  const p = await prepare(graph, weights);
  const run = p.run.bind(p);
  p.run = async (inputs: Readonly<Record<string, HostTensor>>, opts?: RunOptions) => {
    const t0 = performance.now();
    clock.inputsMs += t0 - (firstRun ? stepAt : lastRunEnd);
    firstRun = false;
    try {
      return await run(inputs, opts);
    } finally {
      lastRunEnd = performance.now();
      clock.runMs += lastRunEnd - t0;
      clock.runs++;
    }
  };
  return p;
};

const server = await createServer({
  modelDir: o.modelDir,
  modelName: 'llama',
  ...(o.adaptersDir === undefined ? {} : { adaptersDir: o.adaptersDir }),
  executor,
  dtype: 'bf16',
  maxBatch: 256,
  maxQueue: 4096,
  maxLoras: o.maxLoras,
  maxLoraRank: o.maxLoraRank,
});
const engine = server.lm;
const step = engine.step.bind(engine);
engine.step = async (record) => {
  stepAt = performance.now();
  firstRun = true;
  try {
    return await step(record);
  } finally {
    const end = performance.now();
    // NOTE: the run wrapper above clears `firstRun` while `step` is awaited.
    clock.readbackMs += end - ((firstRun as boolean) ? stepAt : lastRunEnd);
    clock.steps++;
  }
};
server.app.get('/bench/host-step', () => ({ cpuMs: (process.cpuUsage().user + process.cpuUsage().system) / 1000, scheduler: server.scheduler.stepStats(), engine: { ...clock }, worker: engine.stats().executor, traffic: executor.traffic() }));
const address = await server.listen('127.0.0.1', 0);
process.stdout.write(`listening ${address}\n`);
const stop = (): void => {
  void server.shutdown().then(() => process.exit(0));
};
process.once('SIGTERM', stop);
process.stdin.on('end', stop);
process.stdin.resume();
