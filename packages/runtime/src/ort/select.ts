import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { readFile, rename, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { arch, cpus, platform, tmpdir } from 'node:os';
import { join } from 'node:path';
import { type Graph, GraphBuilder, type HostTensor, interpret, seededRandom, errorMessage } from '@stageml/ir';

import { RuntimeCode, RuntimeError } from '../errors.js';
import type { Executor } from '../executor.js';
import { interpreterExecutor } from '../interpreter-executor.js';
import { cpuAddonBuildId } from '../native/addon.js';
import { type WeightQuantSpec, formatWeightQuantSpec, quantizeLinears } from '../quantize.js';
import { loadOrt } from './binding.js';
import { createOrtExecutor } from './executor.js';

const requireFrom = createRequire(import.meta.url);

/** Executors that can be asked for by name, fastest kinds first. */
export const EXECUTOR_NAMES = ['onnxruntime', 'cpu-native', 'tfjs-wasm', 'tfjs-cpu', 'interpreter', 'torch'] as const;

/** An executor name (`--executor`, `STAGEML_EXECUTOR`). */
export type ExecutorName = (typeof EXECUTOR_NAMES)[number];

/** Whether `name` is an executor name. */
export function isExecutorName(name: string): name is ExecutorName {
  return (EXECUTOR_NAMES as readonly string[]).includes(name);
}

/** Options of `createExecutorByName` that only some executors read. */
export interface CreateExecutorOptions {
  /** The torch executor's tensor-parallel size (`TorchExecutorOptions.tensorParallelSize`); others refuse one above 1. */
  readonly tensorParallelSize?: number;
  /** Lines the executor reports (the torch worker's messages, what it gave each prepared graph). */
  readonly log?: (line: string) => void;
}

/**
 * Creates the executor called `name`. Errors: an executor whose runtime does not load here is
 * `RT_BACKEND_UNAVAILABLE` naming the cause (never a silent fallback); a tensor-parallel size above
 * 1 for another executor than torch is `RT_TENSOR_PARALLEL`.
 */
export async function createExecutorByName(name: ExecutorName, opts: CreateExecutorOptions = {}): Promise<Executor> {
  if (opts.tensorParallelSize !== undefined && opts.tensorParallelSize !== 1 && name !== 'torch') {
    throw new RuntimeError(RuntimeCode.TENSOR_PARALLEL, `a tensor-parallel size of ${String(opts.tensorParallelSize)} needs the torch executor, not ${name}`);
  }
  switch (name) {
    case 'onnxruntime':
      return createOrtExecutor();
    case 'tfjs-wasm':
    case 'tfjs-cpu': {
      // NOTE: imported on demand, so choosing onnxruntime never loads TensorFlow.js.
      const { createTfjsExecutor } = await import('../tfjs/index.js');
      return createTfjsExecutor({ backend: name === 'tfjs-wasm' ? 'wasm' : 'cpu' });
    }
    case 'interpreter':
      return interpreterExecutor;
    case 'cpu-native': {
      // NOTE: imported on demand; builds the kernels once per machine (a C++ compiler is needed).
      const { createCpuNativeExecutor } = await import('../native/index.js');
      return createCpuNativeExecutor();
    }
    case 'torch': {
      // NOTE: imported on demand; spawns the Python worker (CUDA when torch sees a GPU).
      const { createTorchExecutor } = await import('../torch/index.js');
      return createTorchExecutor({ ...(opts.tensorParallelSize === undefined ? {} : { tensorParallelSize: opts.tensorParallelSize }), ...(opts.log === undefined ? {} : { log: opts.log }) });
    }
  }
}

/**
 * The model step `auto` measures the executors on: a stack of Llama decoder layers' decode step
 * (each: RMSNorm, q/k/v projections, attention of one new token over its own cached context, o
 * projection, residual, RMSNorm, gated MLP or routed experts, residual) at the model's widths, run
 * at each serving batch. An executor that cannot run the step (an MoE op it lacks) is not chosen.
 */
export interface ExecutorProbeShape {
  /** Model width (`hidden_size`). */
  readonly hidden: number;
  /** MLP width (`intermediate_size`). */
  readonly intermediate: number;
  /** Query heads (`num_attention_heads`; default `hidden / headDim`). */
  readonly heads?: number;
  /** Key/value heads (`num_key_value_heads`; default `heads`); divides `heads`. */
  readonly kvHeads?: number;
  /** Width of one head (default 64 when it divides `hidden`, else `hidden`). */
  readonly headDim?: number;
  /** Decoder layers stacked, each with its own weights and KV (default 4; the model's count when fewer). */
  readonly layers?: number;
  /** Rows per step measured (default `[1, 8]`: one decoding stream and a small batch). */
  readonly batches?: readonly number[];
  /** Weight-only quantization the engine applies to the linears (`--quantize`); none: f32. */
  readonly quantize?: WeightQuantSpec;
  /** Routed experts in place of the gated MLP (Mixtral, Qwen3-MoE), so the MoE kernels are measured and checked too. */
  readonly moe?: ExecutorProbeMoe;
}

/** The MoE MLP of a probe layer: router, top-k routing, grouped expert GEMMs, weighted scatter back. */
export interface ExecutorProbeMoe {
  /** Experts per layer (`num_local_experts` / `num_experts`). */
  readonly experts: number;
  /** Experts per token (`num_experts_per_tok`). */
  readonly topK: number;
  /** One expert's MLP width (`moe_intermediate_size`, else `intermediate_size`). */
  readonly intermediate: number;
}

/** The probe shape without a model: 4 of SmolLM2-135M's decoder layers (576 / 1536, 9 heads, 3 kv heads of 64) at batches 1 and 8. */
export const DEFAULT_PROBE_SHAPE: ExecutorProbeShape = { hidden: 576, intermediate: 1536, heads: 9, kvHeads: 3, headDim: 64, layers: 4, batches: [1, 8] };

/** Cached tokens each probe row attends over. */
const PROBE_CONTEXT = 128;

/** Most f32 weight bytes the probe allocates; wider layers are measured with proportionally fewer heads and MLP rows. */
const PROBE_WEIGHT_BYTES = 128 * 2 ** 20;

/** Options of `selectExecutor`. */
export interface SelectExecutorOptions {
  /** An executor to use without measuring, or `auto` (default: `STAGEML_EXECUTOR`, else `auto`). */
  readonly force?: ExecutorName | 'auto';
  /** Receives one line saying which executor was chosen and why. */
  readonly log?: (line: string) => void;
  /** Executors measured by the probe (default `DEFAULT_CANDIDATES`: cpu-native, onnxruntime). */
  readonly candidates?: readonly ExecutorName[];
  /**
   * Executors measured only when no candidate runs here (default `DEFAULT_FALLBACKS`: tfjs-wasm,
   * tfjs-cpu, which measured 10–1000× slower than both candidates on every probe shape, see
   * `bench/results/executor-auto.md`); the interpreter is the last resort.
   */
  readonly fallbacks?: readonly ExecutorName[];
  /** The model step to measure on (default `DEFAULT_PROBE_SHAPE`). */
  readonly shape?: ExecutorProbeShape;
  /** JSON file remembering the choice per machine, executor builds and step shape (default under `os.tmpdir()`; `false`: none). */
  readonly cacheFile?: string | false;
  /** Measure again, ignoring the in-memory and file caches. */
  readonly refresh?: boolean;
  /** Options for the executor a `force` (or `STAGEML_EXECUTOR`) names (`createExecutorByName`); `auto` refuses a tensor-parallel size above 1. */
  readonly create?: CreateExecutorOptions;
}

/** Which executor `selectExecutor` chose, how, and the probe's medians. */
export interface ExecutorSelection {
  readonly executor: Executor;
  readonly name: ExecutorName;
  /** `forced` (option or env), `probe` (measured now), `cache` (an earlier probe's choice), `fallback` (nothing else ran). */
  readonly source: 'forced' | 'probe' | 'cache' | 'fallback';
  /** One line for logs. */
  readonly reason: string;
  /** Probe time (ms) of each executor that ran: its median step at each of the probe's batches, in order. */
  readonly probeMs: Readonly<Partial<Record<ExecutorName, readonly number[]>>>;
}

/** Environment variable that forces an executor (`auto` measures). */
export const EXECUTOR_ENV = 'STAGEML_EXECUTOR';

/** Executors `auto` measures when `candidates` is not given, in order of trial (ties go to the first). */
export const DEFAULT_CANDIDATES: readonly ExecutorName[] = ['cpu-native', 'onnxruntime'];
/** Executors `auto` measures only when none of the candidates runs here. */
export const DEFAULT_FALLBACKS: readonly ExecutorName[] = ['tfjs-wasm', 'tfjs-cpu'];
const memo = new Map<string, Promise<ExecutorSelection>>();

interface Probe {
  readonly graph: Graph;
  readonly weights: Record<string, HostTensor>;
  readonly batches: readonly number[];
  readonly hidden: number;
  readonly layers: number;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly context: number;
}

interface Heads {
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
}

function headsOf(shape: ExecutorProbeShape): Heads {
  const headDim = shape.headDim ?? (shape.heads !== undefined ? shape.hidden / shape.heads : shape.hidden % 64 === 0 ? 64 : shape.hidden);
  const heads = shape.heads ?? shape.hidden / headDim;
  return { heads, kvHeads: shape.kvHeads ?? heads, headDim };
}

function checkShape(shape: ExecutorProbeShape): void {
  const { heads, kvHeads, headDim } = headsOf(shape);
  const moe = shape.moe === undefined ? {} : { experts: shape.moe.experts, topK: shape.moe.topK, expertIntermediate: shape.moe.intermediate };
  const widths = { hidden: shape.hidden, intermediate: shape.intermediate, heads, kvHeads, headDim, layers: shape.layers ?? 1, ...moe };
  for (const [k, v] of Object.entries(widths)) {
    if (!Number.isSafeInteger(v) || v < 1) throw new RuntimeError(RuntimeCode.BAD_VALUE, `executor probe: ${k} must be a positive integer, got ${String(v)}`);
  }
  if (heads % kvHeads !== 0) throw new RuntimeError(RuntimeCode.BAD_VALUE, `executor probe: kvHeads (${String(kvHeads)}) must divide heads (${String(heads)})`);
  if (shape.moe !== undefined && shape.moe.topK > shape.moe.experts) throw new RuntimeError(RuntimeCode.BAD_VALUE, `executor probe: topK (${String(shape.moe.topK)}) exceeds the experts (${String(shape.moe.experts)})`);
  for (const b of shape.batches ?? []) {
    if (!Number.isSafeInteger(b) || b < 1) throw new RuntimeError(RuntimeCode.BAD_VALUE, `executor probe: batches must be positive integers, got ${String(b)}`);
  }
  if (shape.batches?.length === 0) throw new RuntimeError(RuntimeCode.BAD_VALUE, 'executor probe: batches must not be empty');
}

/**
 * `shape.layers` Llama decoder layers' decode step at `shape`'s widths over a symbolic batch, each
 * layer's new k and v an output beside the last layer's (none of it is dead code to an executor).
 * When the f32 weights exceed `maxBytes`, heads and MLP width are scaled down alike (the
 * projections keep the model's input width); `quantize` applies the engine's weight-only pass.
 */
function probeGraph(shape: ExecutorProbeShape, maxBytes: number, seed: number, context: number): Probe {
  const h = shape.hidden;
  const full = headsOf(shape);
  const d = full.headDim;
  const layers = shape.layers ?? 4;
  const moe = shape.moe;
  // An MoE layer's experts: as many as fit a quarter of the budget once the rows of one step can
  // reach (topK per row at the largest batch) are kept; the rest of the scaling is by width.
  const maxBatch = Math.max(...(shape.batches ?? [1, 8]));
  const experts = moe === undefined ? 0 : Math.min(moe.experts, Math.max(Math.min(moe.experts, moe.topK * maxBatch), Math.floor(maxBytes / 4 / layers / (3 * h * moe.intermediate * 4))));
  const mlpBytes = moe === undefined ? 3 * h * shape.intermediate : experts * (3 * h * moe.intermediate + h);
  const layerBytes = (2 * full.heads * d * h + 2 * full.kvHeads * d * h + mlpBytes) * 4;
  const f = Math.min(1, maxBytes / (layers * layerBytes));
  const kvHeads = Math.max(1, Math.round(full.kvHeads * f));
  const heads = kvHeads * (full.heads / full.kvHeads);
  const inter = Math.max(1, Math.round((moe?.intermediate ?? shape.intermediate) * f));
  const b = new GraphBuilder('executor_probe');
  type V = ReturnType<typeof b.param>;
  const p = (name: string, out: number, inn: number): V => b.param(name, ['f32', [out, inn]]);
  const headsFirst = (v: V, n: number): V => b.transpose(b.reshape(v, ['batch', 1, n, d]), [0, 2, 1, 3]);
  let x = b.input('x', ['f32', ['batch', h]]);
  for (let l = 0; l < layers; l++) {
    const kCache = b.input(`k_cache.${String(l)}`, ['f32', ['batch', kvHeads, context, d]]);
    const vCache = b.input(`v_cache.${String(l)}`, ['f32', ['batch', kvHeads, context, d]]);
    const xn = b.rmsNorm(x, b.param(`l${String(l)}.input_norm`, ['f32', [h]]), 1e-5);
    const q = headsFirst(b.linear(xn, p(`l${String(l)}.q_proj`, heads * d, h)), heads);
    const k = headsFirst(b.linear(xn, p(`l${String(l)}.k_proj`, kvHeads * d, h)), kvHeads);
    const v = headsFirst(b.linear(xn, p(`l${String(l)}.v_proj`, kvHeads * d, h)), kvHeads);
    const att = b.attention(q, b.concat([kCache, k], 2), b.concat([vCache, v], 2), { causal: false });
    const h1 = b.add(x, b.linear(b.reshape(b.transpose(att, [0, 2, 1, 3]), ['batch', heads * d]), p(`l${String(l)}.o_proj`, h, heads * d)));
    const hn = b.rmsNorm(h1, b.param(`l${String(l)}.post_norm`, ['f32', [h]]), 1e-5);
    let mlp: V;
    if (moe === undefined) {
      const act = b.mul(b.silu(b.linear(hn, p(`l${String(l)}.gate_proj`, inter, h))), b.linear(hn, p(`l${String(l)}.up_proj`, inter, h)));
      mlp = b.linear(act, p(`l${String(l)}.down_proj`, h, inter));
    } else {
      // As @stageml/moe's moeBlock: softmax router, top-k renormalized, rows grouped by expert.
      const [topW, topE] = b.topk(b.softmax(b.linear(hn, p(`l${String(l)}.router`, experts, h)), -1), moe.topK, -1);
      const weights = b.div(topW, b.sum(topW, [-1], true));
      const groups = b.reshape(topE, [-1]);
      const token = b.reshape(b.iota(['batch', moe.topK], 0), [-1]);
      const gateUp = b.op('groupedMatmul', [b.gather(hn, token, 0), b.param(`l${String(l)}.experts.gate_up`, ['f32', [experts, 2 * inter, h]]), groups], { transposeW: true });
      const act = b.mul(b.silu(b.slice(gateUp, 1, 0, inter)), b.slice(gateUp, 1, inter));
      const down = b.op('groupedMatmul', [act, b.param(`l${String(l)}.experts.down`, ['f32', [experts, h, inter]]), groups], { transposeW: true });
      mlp = b.scatterAdd(b.broadcastTo(b.scalar(0, 'f32'), ['batch', h]), token, b.mul(down, b.reshape(weights, [-1, 1])), 0);
    }
    x = b.add(h1, mlp);
    b.output(`k.${String(l)}`, k);
    b.output(`v.${String(l)}`, v);
  }
  b.output('y', x);
  const rnd = seededRandom(seed);
  const t = (shape_: number[], s: number, c = 0): HostTensor => {
    const data = new Float32Array(shape_.reduce((m, n) => m * n, 1));
    for (let i = 0; i < data.length; i++) data[i] = c + (rnd() - 0.5) * s;
    return { dtype: 'f32', shape: shape_, data };
  };
  const w = (out: number, inn: number): HostTensor => t([out, inn], 2 / Math.sqrt(inn));
  let graph = b.build();
  let weights: Record<string, HostTensor> = {};
  for (let l = 0; l < layers; l++) {
    const n = `l${String(l)}.`;
    Object.assign(weights, {
      [`${n}input_norm`]: t([h], 0.2, 1), [`${n}post_norm`]: t([h], 0.2, 1),
      [`${n}q_proj`]: w(heads * d, h), [`${n}k_proj`]: w(kvHeads * d, h), [`${n}v_proj`]: w(kvHeads * d, h), [`${n}o_proj`]: w(h, heads * d),
    });
    if (moe === undefined) Object.assign(weights, { [`${n}gate_proj`]: w(inter, h), [`${n}up_proj`]: w(inter, h), [`${n}down_proj`]: w(h, inter) });
    else {
      Object.assign(weights, { [`${n}router`]: w(experts, h), [`${n}experts.gate_up`]: t([experts, 2 * inter, h], 2 / Math.sqrt(h)), [`${n}experts.down`]: t([experts, h, inter], 2 / Math.sqrt(inter)) });
    }
  }
  if (shape.quantize !== undefined) {
    const qz = quantizeLinears(graph, weights, { spec: shape.quantize });
    graph = qz.graph;
    weights = { ...qz.constants };
  }
  return { graph, weights, batches: shape.batches ?? [1, 8], hidden: h, layers, kvHeads, headDim: d, context };
}

function inputFor(probe: Probe, batch: number, seed: number): Record<string, HostTensor> {
  const rnd = seededRandom(seed + batch);
  const t = (shape: number[]): HostTensor => ({ dtype: 'f32', shape, data: Float32Array.from({ length: shape.reduce((m, n) => m * n, 1) }, () => (rnd() - 0.5) * 2) });
  const cache = [batch, probe.kvHeads, probe.context, probe.headDim];
  const inputs: Record<string, HostTensor> = { x: t([batch, probe.hidden]) };
  for (let l = 0; l < probe.layers; l++) {
    inputs[`k_cache.${String(l)}`] = t(cache);
    inputs[`v_cache.${String(l)}`] = t(cache);
  }
  return inputs;
}

/** Runs the probe's miniature (same ops; two layers of width 32, two heads of 16 over one kv head, MLP 48 or 4 experts of 24) and compares every output with the interpreter's. */
async function checkAgainstInterpreter(executor: Executor, shape: ExecutorProbeShape): Promise<void> {
  const moe = shape.moe === undefined ? {} : { moe: { experts: 4, topK: Math.min(2, shape.moe.topK), intermediate: 24 } };
  const small = probeGraph({ hidden: 32, intermediate: 48, heads: 2, kvHeads: 1, headDim: 16, layers: 2, batches: [3], ...moe, ...(shape.quantize === undefined ? {} : { quantize: shape.quantize }) }, Infinity, 11, 4);
  const inputs = inputFor(small, 3, 11);
  const expected = interpret(small.graph, { inputs, weights: small.weights });
  const prepared = await executor.prepare(small.graph, small.weights);
  try {
    const got = await prepared.run(inputs);
    // Quantized linears may quantize activations too (int8 dot products): a looser bound.
    const tol = shape.quantize === undefined ? 1e-3 : 5e-2;
    for (const [name, want] of Object.entries(expected)) {
      const y = got[name];
      if (y?.data.length !== want.data.length) throw new RuntimeError(RuntimeCode.EVAL_FAILED, `probe output ${name} is missing or has the wrong size`);
      let worst = 0;
      for (let i = 0; i < y.data.length; i++) worst = Math.max(worst, Math.abs(Number(y.data[i]) - Number(want.data[i])) / (1 + Math.abs(Number(want.data[i]))));
      if (!(worst <= tol)) throw new RuntimeError(RuntimeCode.EVAL_FAILED, `probe output ${name} differs from the interpreter's by ${String(worst)}`);
    }
  } finally {
    prepared.dispose();
  }
}

/**
 * Median step time (ms) per batch of `probe` on `executor`. Once a first run takes more than 4×
 * `best[batch]` (the best median so far) the executor cannot win: that run's time stands for its
 * batch and the later batches are not run (`Infinity`).
 */
async function measure(executor: Executor, probe: Probe, best: ReadonlyMap<number, number>): Promise<Map<number, number>> {
  const prepared = await executor.prepare(probe.graph, probe.weights);
  const out = new Map<number, number>();
  try {
    let lost = false;
    for (const batch of probe.batches) {
      if (lost) {
        out.set(batch, Infinity);
        continue;
      }
      const inputs = inputFor(probe, batch, 5);
      // Untimed: lazy initialization (sessions, arenas, thread pools) is no step time.
      await prepared.run(inputs);
      let t0 = performance.now();
      await prepared.run(inputs);
      const first = performance.now() - t0;
      const limit = best.get(batch);
      if (limit !== undefined && first > 4 * limit) {
        out.set(batch, first);
        lost = true;
        continue;
      }
      // Runs: enough for ~150 ms of measuring, at least 5 and at most 21 (odd: a true median).
      const runs = Math.min(21, Math.max(5, 2 * Math.floor(75 / Math.max(first, 1e-3)) + 1));
      const times: number[] = [];
      for (let i = 0; i < runs; i++) {
        t0 = performance.now();
        await prepared.run(inputs);
        times.push(performance.now() - t0);
      }
      out.set(batch, times.sort((a, b) => a - b)[runs >> 1]!);
    }
    return out;
  } finally {
    prepared.dispose();
  }
}

function cpuFlags(): string {
  try {
    const info = readFileSync('/proc/cpuinfo', 'utf8');
    const line = /^(?:flags|Features)\s*:\s*(.*)$/m.exec(info)?.[1] ?? '';
    return createHash('sha256').update(line.trim()).digest('hex').slice(0, 12);
  } catch {
    return 'unknown';
  }
}

function packageVersion(name: string): string {
  try {
    return (requireFrom(`${name}/package.json`) as { version?: string }).version ?? 'unknown';
  } catch {
    return 'none';
  }
}

/**
 * Everything the choice depends on: the CPU (model, cores, feature flags), platform, Node, each
 * candidate's build (onnxruntime and tfjs versions, the cpu-native addon's source and variant), the
 * step shape (widths, batches, quantization) and the candidate list.
 */
async function choiceKey(candidates: readonly ExecutorName[], shape: ExecutorProbeShape): Promise<string> {
  const ort = candidates.includes('onnxruntime') ? await loadOrt() : undefined;
  const builds = candidates.map((c) => {
    switch (c) {
      case 'onnxruntime':
        return `onnxruntime ${ort?.ok === true ? ort.version : 'none'}`;
      case 'cpu-native':
        return `cpu-native ${cpuAddonBuildId()}`;
      case 'tfjs-wasm':
        return `tfjs-wasm ${packageVersion('@tensorflow/tfjs-backend-wasm')}`;
      case 'tfjs-cpu':
        return `tfjs-cpu ${packageVersion('@tensorflow/tfjs-backend-cpu')}`;
      case 'interpreter':
      case 'torch':
        return c;
    }
  });
  return [
    `${cpus()[0]?.model ?? 'cpu'} ×${String(cpus().length)} flags ${cpuFlags()}`,
    `${platform()}-${arch()} node ${process.version}`,
    builds.join(', '),
    `step ${describeShape(shape)} ctx ${String(PROBE_CONTEXT)} v${String(PROBE_VERSION)}`,
  ].join(' | ');
}

interface CacheEntry {
  readonly name: ExecutorName;
  readonly probeMs: Partial<Record<ExecutorName, readonly number[]>>;
  readonly date: string;
}

async function readCache(file: string): Promise<Record<string, CacheEntry>> {
  try {
    const doc = JSON.parse(await readFile(file, 'utf8')) as { version?: number; entries?: Record<string, CacheEntry> };
    // Version 1 files keyed the toy probe's choice by CPU only: not reused.
    return doc.version === CACHE_VERSION && typeof doc.entries === 'object' ? doc.entries : {};
  } catch {
    return {};
  }
}

const CACHE_VERSION = 2;

async function writeCache(file: string, key: string, entry: CacheEntry): Promise<void> {
  const entries = { ...(await readCache(file)), [key]: entry };
  const tmp = `${file}.${String(process.pid)}.tmp`;
  try {
    await writeFile(tmp, `${JSON.stringify({ format: 'stageml-executor-choice', version: CACHE_VERSION, entries }, null, 2)}\n`);
    await rename(tmp, file);
  } catch {
    // NOTE: the file only saves a later process the probe; failing to write it changes nothing else.
  }
}

/** ` (prebuilt avx512-vnni)` for an executor that says where its build came from (cpu-native), else nothing. */
function buildOf(executor: Executor): string {
  const build = (executor as { build?: unknown }).build;
  return typeof build === 'string' ? ` (${build})` : '';
}

function formatMs(probeMs: Partial<Record<ExecutorName, readonly number[]>>): string {
  return Object.entries(probeMs).map(([n, ms]) => `${n} ${ms.map((t) => (Number.isFinite(t) ? t.toFixed(2) : '–')).join(' + ')} ms`).join(', ');
}

function describeShape(shape: ExecutorProbeShape): string {
  const q = shape.quantize === undefined ? 'f32' : formatWeightQuantSpec(shape.quantize);
  const { heads, kvHeads, headDim } = headsOf(shape);
  const mlp = shape.moe === undefined ? `intermediate ${String(shape.intermediate)}` : `${String(shape.moe.experts)} experts (top ${String(shape.moe.topK)}) of intermediate ${String(shape.moe.intermediate)}`;
  return `${String(shape.layers ?? 4)} layers of hidden ${String(shape.hidden)}, ${mlp}, heads ${String(heads)}/${String(kvHeads)}×${String(headDim)}, ${q}, batch ${(shape.batches ?? [1, 8]).join(' + ')}`;
}

/** Bumped whenever the probe's graph changes, so choices measured on an older probe are not reused. */
const PROBE_VERSION = 2;

function requested(opts: SelectExecutorOptions): { name: ExecutorName | 'auto'; from: string } {
  if (opts.force !== undefined) return { name: opts.force, from: 'request' };
  const env = process.env[EXECUTOR_ENV];
  if (env === undefined || env === '' || env === 'auto') return { name: 'auto', from: 'auto' };
  if (!isExecutorName(env)) {
    throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `unknown executor '${env}' in ${EXECUTOR_ENV} (known: auto, ${EXECUTOR_NAMES.join(', ')})`);
  }
  return { name: env, from: `${EXECUTOR_ENV}=${env}` };
}

async function choose(candidates: readonly ExecutorName[], fallbacks: readonly ExecutorName[], shape: ExecutorProbeShape, cacheFile: string | false, refresh: boolean): Promise<ExecutorSelection> {
  const key = await choiceKey([...candidates, ...fallbacks], shape);
  if (cacheFile !== false && !refresh) {
    const hit = (await readCache(cacheFile))[key];
    if (hit !== undefined && (candidates.includes(hit.name) || fallbacks.includes(hit.name))) {
      try {
        const executor = await createExecutorByName(hit.name);
        return { executor, name: hit.name, source: 'cache', probeMs: hit.probeMs, reason: `'${hit.name}'${buildOf(executor)} from the probe of this model's step (${describeShape(shape)}) cached in ${cacheFile} on ${hit.date}: ${formatMs(hit.probeMs)}` };
      } catch {
        // The cached executor no longer loads (e.g. onnxruntime-node was removed): measure again.
      }
    }
  }
  const probe = probeGraph(shape, PROBE_WEIGHT_BYTES, 7, PROBE_CONTEXT);
  const perBatch = new Map<ExecutorName, Map<number, number>>();
  const failures: string[] = [];
  const executors = new Map<ExecutorName, Executor>();
  const best = new Map<number, number>();
  for (const name of [...candidates, ...fallbacks]) {
    if (!candidates.includes(name) && executors.size > 0) break;
    try {
      const executor = await createExecutorByName(name);
      await checkAgainstInterpreter(executor, shape);
      const times = await measure(executor, probe, best);
      for (const [b, ms] of times) best.set(b, Math.min(best.get(b) ?? Infinity, ms));
      perBatch.set(name, times);
      executors.set(name, executor);
    } catch (e) {
      failures.push(`${name}: ${errorMessage(e)}`);
    }
  }
  // Score: the sum over batches of the step time relative to the fastest at that batch (each
  // batch counts alike, however long its step); ties go to the earlier candidate.
  const score = (n: ExecutorName): number => [...perBatch.get(n)!].reduce((s, [b, ms]) => s + ms / best.get(b)!, 0);
  const ranked = [...executors.keys()].sort((a, b) => score(a) - score(b));
  const probeMs: Partial<Record<ExecutorName, readonly number[]>> = {};
  for (const n of ranked) probeMs[n] = [...perBatch.get(n)!.values()];
  const winner = ranked[0];
  const skipped = failures.length > 0 ? `; unavailable: ${failures.join('; ')}` : '';
  if (winner === undefined) {
    return { executor: interpreterExecutor, name: 'interpreter', source: 'fallback', probeMs, reason: `the interpreter, as no faster executor runs here${skipped}` };
  }
  if (cacheFile !== false) await writeCache(cacheFile, key, { name: winner, probeMs, date: new Date().toISOString() });
  const saved = cacheFile === false ? '' : `; remembered in ${cacheFile}`;
  return {
    executor: executors.get(winner)!,
    name: winner,
    source: 'probe',
    probeMs,
    reason: `'${winner}'${buildOf(executors.get(winner)!)} is fastest on this model's step (${describeShape(shape)}): ${formatMs(probeMs)}${skipped}${saved}`,
  };
}

/**
 * Picks the executor to run on. Forced by `force` or `STAGEML_EXECUTOR` (an unknown or unavailable
 * one is `RT_BACKEND_UNAVAILABLE`); otherwise the candidates that load here (cpu-native and
 * onnxruntime by default; the fallbacks tfjs-wasm and tfjs-cpu only when neither runs) are each checked against the interpreter on a
 * miniature of the probe and measured on the model's own step (`shape`: one decoder layer's
 * projections at its widths and quantization, at each serving batch), and the one with the least
 * time relative to the fastest at each batch wins. The choice is kept for the process and, by
 * default, in a JSON file under `os.tmpdir()` keyed by everything that changes it (CPU model, cores
 * and feature flags, platform, Node, each candidate's build, the step shape), so later processes
 * skip the probe. The interpreter is the last resort. `log` receives one line naming the choice and
 * why. Errors: a bad `shape` is `RT_BAD_VALUE`.
 */
export async function selectExecutor(opts: SelectExecutorOptions = {}): Promise<ExecutorSelection> {
  const want = requested(opts);
  let selection: ExecutorSelection;
  if (want.name !== 'auto') {
    if (!isExecutorName(want.name)) throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `unknown executor '${String(want.name)}' (known: auto, ${EXECUTOR_NAMES.join(', ')})`);
    selection = { executor: await createExecutorByName(want.name, { ...opts.create, ...(opts.log === undefined ? {} : { log: opts.log }) }), name: want.name, source: 'forced', probeMs: {}, reason: want.from === 'request' ? `'${want.name}' as requested` : `'${want.name}' forced by ${want.from}` };
  } else {
    const tp = opts.create?.tensorParallelSize;
    if (tp !== undefined && tp !== 1) throw new RuntimeError(RuntimeCode.TENSOR_PARALLEL, `a tensor-parallel size of ${String(tp)} needs the torch executor: pass it explicitly instead of auto`);
    const candidates = opts.candidates ?? DEFAULT_CANDIDATES;
    const fallbacks = (opts.fallbacks ?? DEFAULT_FALLBACKS).filter((n) => !candidates.includes(n));
    const shape = opts.shape ?? DEFAULT_PROBE_SHAPE;
    checkShape(shape);
    const cacheFile = opts.cacheFile ?? join(tmpdir(), 'stageml-executor-choice.json');
    const key = `${candidates.join(',')}|${fallbacks.join(',')}|${describeShape(shape)}|${String(cacheFile)}`;
    let p = opts.refresh === true ? undefined : memo.get(key);
    if (p === undefined) {
      p = choose(candidates, fallbacks, shape, cacheFile, opts.refresh === true);
      memo.set(key, p);
      p.catch(() => memo.delete(key));
    }
    selection = await p;
  }
  opts.log?.(`executor: ${selection.name} (${selection.reason})`);
  return selection;
}
