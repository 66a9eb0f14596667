import { readLlamaConfig } from '@stageml/models';
import {
  type Executor,
  type ExecutorProbeShape,
  type QuantizeLinearsOptions,
  EXECUTOR_ENV,
  EXECUTOR_NAMES as RUNTIME_EXECUTORS,
  RuntimeCode,
  RuntimeError,
  isExecutorName,
  selectExecutor,
} from '@stageml/runtime';

/** Executor names `--executor` accepts: `auto` (the fastest available here, measured once) and each runtime executor. */
export const EXECUTOR_NAMES = ['auto', ...RUNTIME_EXECUTORS] as const;

/** One of `EXECUTOR_NAMES`. */
export type CliExecutorName = (typeof EXECUTOR_NAMES)[number];

/**
 * The executor used when `--executor` is absent and `STAGEML_EXECUTOR` is unset: the reference
 * interpreter (exact), which the `run`/`generate` help texts document.
 */
export const DEFAULT_EXECUTOR: CliExecutorName = 'interpreter';

/** Options of `resolveExecutor`. */
export interface ResolveExecutorOptions {
  /** Receives the line saying which executor `auto` chose and why. */
  readonly log?: ((line: string) => void) | undefined;
  /** The step `auto` measures on (`probeShapeOf` a model; default: the runtime's `DEFAULT_PROBE_SHAPE`). */
  readonly shape?: ExecutorProbeShape | undefined;
  /** The torch executor's tensor-parallel size (`--tensor-parallel-size`). */
  readonly tensorParallelSize?: number | undefined;
}

/** Largest decode batch the `auto` probe measures besides batch 1. */
const PROBE_MAX_BATCH = 8;
/** Most decoder layers the `auto` probe stacks. */
const PROBE_MAX_LAYERS = 4;

/**
 * The step `--executor auto` measures for the model in `dir`: up to 4 of its decoder layers at
 * its widths and heads from `config.json` (with its routed experts for an MoE model),
 * `quantize` as the engine applies it (`--quantize auto` measured as int8, its usual pick), at
 * batch 1 and min(`maxBatch`, 8). Undefined when `dir` has no readable Llama-family config (the
 * runtime's default shape is measured then).
 */
export async function probeShapeOf(dir: string, opts: { quantize?: QuantizeLinearsOptions | undefined; maxBatch?: number | undefined } = {}): Promise<ExecutorProbeShape | undefined> {
  let config;
  try {
    config = await readLlamaConfig(dir);
  } catch {
    return undefined;
  }
  const headDim = config.headDim;
  const batch = Math.min(opts.maxBatch ?? PROBE_MAX_BATCH, PROBE_MAX_BATCH);
  const q = opts.quantize;
  const quantize = q === undefined ? undefined : (q.spec ?? { bits: 8, blockSize: 32, symmetric: true });
  return {
    hidden: config.hiddenSize,
    intermediate: config.intermediateSize,
    layers: Math.min(config.numLayers, PROBE_MAX_LAYERS),
    heads: config.numHeads,
    kvHeads: config.numKvHeads,
    headDim,
    batches: batch === 1 ? [1] : [1, batch],
    ...(quantize === undefined ? {} : { quantize }),
    ...(config.moe === undefined ? {} : { moe: { experts: config.moe.numExperts, topK: config.moe.topK, intermediate: config.moe.intermediateSize ?? config.intermediateSize } }),
  };
}

/**
 * Resolves an `--executor` name: `auto` measures the available executors once on `shape`
 * (`selectExecutor`, remembered in memory and in a file under the temp directory), a concrete name creates that
 * executor, and no name means `STAGEML_EXECUTOR` if set, else `DEFAULT_EXECUTOR`. Unknown names,
 * and executors that do not load here, are `RT_BACKEND_UNAVAILABLE`.
 */
export async function resolveExecutor(name: string | undefined, opts: ResolveExecutorOptions = {}): Promise<Executor> {
  const env = process.env[EXECUTOR_ENV];
  const wanted = name ?? (env === undefined || env === '' ? DEFAULT_EXECUTOR : env);
  if (wanted !== 'auto' && !isExecutorName(wanted)) {
    throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `unknown executor '${wanted}' (available: ${EXECUTOR_NAMES.join(', ')})`);
  }
  const selection = await selectExecutor({ force: wanted, ...(opts.log === undefined ? {} : { log: opts.log }), ...(opts.shape === undefined ? {} : { shape: opts.shape }), ...(opts.tensorParallelSize === undefined ? {} : { create: { tensorParallelSize: opts.tensorParallelSize } }) });
  return selection.executor;
}
