import type { Command } from 'commander';
import { type Graph, GraphBuilder, type HostTensor, seededRandom } from '@stageml/ir';
import { foldServingOps } from '@stageml/kernel-patterns';
import { loraLinear } from '@stageml/peft';
import type { Executor } from '@stageml/runtime';
import { parseNonNegativeInt, parseNumber, parsePositiveInt } from '../args.js';
import { CliCode, CliError } from '../errors.js';
import { resolveExecutor } from '../executors.js';
import type { CliIo } from '../io.js';

/** Shape and effort of the `lora-layer` benchmark. */
export interface LoraLayerBenchOptions {
  /** Model width d (W is [d, d]). */
  readonly dim: number;
  /** LoRA rank r (A is [r, d], B is [d, r]). */
  readonly rank: number;
  /** Rows of x. */
  readonly batch: number;
  /** Timed runs of each graph (default 11). */
  readonly runs?: number;
  /** Untimed runs of each graph first (default 2). */
  readonly warmup?: number;
  /** Seed of the random weights and input (default 0). */
  readonly seed?: number;
  /** LoRA scale s (default 2, as lora_alpha = 2r). */
  readonly scale?: number;
}

/** What the `lora-layer` benchmark measured. */
export interface LoraLayerBenchResult {
  readonly bench: 'lora-layer';
  readonly executor: string;
  readonly dim: number;
  readonly rank: number;
  readonly batch: number;
  readonly runs: number;
  /** Median ms of the residual LoRA layer y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ. */
  readonly loraMs: number;
  /** Median ms of the bare base product y = x·Wᵀ. */
  readonly baseMs: number;
  /** loraMs / baseMs. */
  readonly ratio: number;
}

function randomTensor(shape: readonly number[], bound: number, rnd: () => number): HostTensor {
  const data = new Float32Array(shape.reduce((a, d) => a * d, 1));
  for (let i = 0; i < data.length; i++) data[i] = (2 * rnd() - 1) * bound;
  return { dtype: 'f32', shape: [...shape], data };
}

/**
 * The residual LoRA layer (as `@stageml/peft`'s `loraLinear` builds it, folded into the `loraLinear`
 * op as `stageml stage` writes it) and the bare base product.
 */
export function loraLayerGraphs(dim: number, rank: number, batch: number, scale: number): { lora: Graph; base: Graph } {
  const lora = new GraphBuilder('lora_layer');
  const x = lora.input('x', ['f32', [batch, dim]]);
  const w = lora.param('w', ['f32', [dim, dim]]);
  lora.output('y', loraLinear(lora, x, w, undefined, { A: lora.param('lora_A', ['f32', [rank, dim]]), B: lora.param('lora_B', ['f32', [dim, rank]]), scale }));
  const base = new GraphBuilder('base_matmul');
  base.output('y', base.linear(base.input('x', ['f32', [batch, dim]]), base.param('w', ['f32', [dim, dim]])));
  return { lora: foldServingOps(lora.build()).graph, base: base.build() };
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 === 1 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
}

/**
 * Times the residual LoRA layer against the bare base product on one executor, in one process:
 * both graphs are prepared once (weights resident), warmed up, then run alternately in ABBA order
 * so drift hits both equally; reports the medians and their ratio. Weights are seeded uniform random.
 */
export async function benchLoraLayer(executor: Executor, opts: LoraLayerBenchOptions): Promise<LoraLayerBenchResult> {
  const { dim, rank, batch } = opts;
  const runs = opts.runs ?? 11;
  const rnd = seededRandom(opts.seed ?? 0);
  const weights = { w: randomTensor([dim, dim], 1 / Math.sqrt(dim), rnd), lora_A: randomTensor([rank, dim], 1 / Math.sqrt(dim), rnd), lora_B: randomTensor([dim, rank], 1 / Math.sqrt(rank), rnd) };
  const inputs = { x: randomTensor([batch, dim], 1, rnd) };
  const graphs = loraLayerGraphs(dim, rank, batch, opts.scale ?? 2);
  const lora = await executor.prepare(graphs.lora, weights);
  const base = await executor.prepare(graphs.base, { w: weights.w });
  try {
    for (let i = 0; i < (opts.warmup ?? 2); i++) {
      await lora.run(inputs);
      await base.run(inputs);
    }
    const loraTimes: number[] = [];
    const baseTimes: number[] = [];
    const time = async (p: typeof lora, into: number[]): Promise<void> => {
      const t0 = performance.now();
      await p.run(inputs);
      into.push(performance.now() - t0);
    };
    // ABBA order: a drift in machine speed (other load, clocks) hits both graphs alike.
    for (let i = 0; i < runs; i++) {
      if (i % 2 === 0) {
        await time(lora, loraTimes);
        await time(base, baseTimes);
      } else {
        await time(base, baseTimes);
        await time(lora, loraTimes);
      }
    }
    const loraMs = median(loraTimes);
    const baseMs = median(baseTimes);
    return { bench: 'lora-layer', executor: executor.name, dim, rank, batch, runs, loraMs, baseMs, ratio: loraMs / baseMs };
  } finally {
    lora.dispose();
    base.dispose();
  }
}

interface BenchOptions {
  dim: number;
  rank: number;
  batch: number;
  executor?: string;
  runs?: number;
  seed?: number;
  scale?: number;
  json?: boolean;
}

/** `stageml bench lora-layer`: the residual LoRA layer's cost over the bare base GEMM on one executor. */
export function registerBench(program: Command, io: CliIo): void {
  program
    .command('bench')
    .description('micro-benchmarks; lora-layer: median time of the residual LoRA layer vs the bare base matmul, and their ratio')
    .argument('<suite>', 'benchmark to run: lora-layer')
    .requiredOption('--dim <d>', 'model width d (W is d×d)', parsePositiveInt)
    .requiredOption('--rank <r>', 'LoRA rank r', parsePositiveInt)
    .requiredOption('--batch <b>', 'rows of x', parsePositiveInt)
    .option('--executor <name>', 'executor: auto (default: the fastest here on this layer\'s GEMM, measured once), cpu-native, onnxruntime, tfjs-wasm, tfjs-cpu, interpreter, torch')
    .option('--runs <n>', 'timed runs of each graph (default 11)', parsePositiveInt)
    .option('--seed <n>', 'seed of the random weights (default 0)', parseNonNegativeInt)
    .option('--scale <s>', 'LoRA scale s (default 2)', parseNumber)
    .option('--json', 'print the result as JSON')
    .action(async (suite: string, opts: BenchOptions) => {
      if (suite !== 'lora-layer') throw new CliError(CliCode.USAGE, `unknown benchmark '${suite}' (available: lora-layer)`);
      // auto measures a decoder layer of width d (MLP width d) at the benchmark's batch.
      const shape = { hidden: opts.dim, intermediate: opts.dim, batches: [opts.batch] };
      const executor = await resolveExecutor(opts.executor ?? 'auto', { log: opts.json === true ? undefined : io.err, shape });
      const r = await benchLoraLayer(executor, {
        dim: opts.dim,
        rank: opts.rank,
        batch: opts.batch,
        ...(opts.runs === undefined ? {} : { runs: opts.runs }),
        ...(opts.seed === undefined ? {} : { seed: opts.seed }),
        ...(opts.scale === undefined ? {} : { scale: opts.scale }),
      });
      if (opts.json === true) {
        io.out(JSON.stringify(r, null, 2));
        return;
      }
      io.out(`lora-layer d=${String(r.dim)} r=${String(r.rank)} batch=${String(r.batch)} on ${r.executor} (median of ${String(r.runs)} runs each)`);
      io.out(`  residual LoRA layer  ${r.loraMs.toFixed(3)} ms`);
      io.out(`  base matmul          ${r.baseMs.toFixed(3)} ms`);
      io.out(`  ratio                ${r.ratio.toFixed(3)}`);
    });
}
