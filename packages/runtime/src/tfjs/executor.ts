import type { Graph } from '@stageml/ir';

import { RuntimeCode, RuntimeError } from '../errors.js';
import { type Executor, type PreparedGraph, PreparedGraphs, capabilitiesOfTable, expandFor } from '../executor.js';
import type { ValueSource } from '../values.js';
import { TFJS_BACKENDS, type TfjsBackend, isTfjsBackend, loadBackend } from './backend.js';
import { prepareOnTfjs } from './prepare.js';
import type { TfRuleTable } from './rule.js';
import { TFJS_RULES } from './rules.js';

/** Options of `createTfjsExecutor`. */
export interface TfjsExecutorOptions {
  /**
   * The backend to run on. Default: the `STAGEML_BACKEND` environment variable (`wasm` or
   * `tfjs-wasm`, …), else the first that loads of `node-gpu`, `node`, `wasm`, `cpu`. A backend
   * asked for by either means that does not load is an error, never a silent fallback.
   */
  readonly backend?: TfjsBackend;
  /**
   * Threads for the backend's kernels: the wasm thread pool (before its first initialization, and
   * only where tfjs uses threaded wasm, which it does not under Node) or TensorFlow's intra-op pool
   * for the node backends (through `TF_NUM_INTRAOP_THREADS` when unset).
   */
  readonly threads?: number;
  /** The lowering table (default `TFJS_RULES`); override entries to experiment or test. */
  readonly rules?: TfRuleTable;
}

const ENV_VAR = 'STAGEML_BACKEND';

function unavailable(message: string, cause?: unknown): RuntimeError {
  return new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, message, {
    cause,
    hint: `known tfjs backends: ${TFJS_BACKENDS.join(', ')}; install @tensorflow/tfjs-node or @tensorflow/tfjs-node-gpu for the native ones`,
  });
}

/** The backend asked for by option or environment, checked by name; undefined: choose automatically. */
function requestedBackend(opts: TfjsExecutorOptions): TfjsBackend | undefined {
  const fromEnv = process.env[ENV_VAR];
  const raw: string | undefined = opts.backend ?? (fromEnv === undefined || fromEnv === '' ? undefined : fromEnv);
  if (raw === undefined) return undefined;
  const name = raw.startsWith('tfjs-') ? raw.slice('tfjs-'.length) : raw;
  if (!isTfjsBackend(name)) {
    throw unavailable(`unknown tfjs backend '${raw}'${opts.backend === undefined ? ` (from ${ENV_VAR})` : ''}`);
  }
  return name;
}

/**
 * Creates the TensorFlow.js executor (`tfjs-<backend>`): graphs are lowered op by op to tfjs
 * kernels through `TFJS_RULES`, parameters stay resident on the device, and each run executes in
 * one `tf.tidy` scope and downloads its outputs, so device memory does not grow across runs.
 *
 * Numerics: f32/f16/bf16/f64 compute in float32 (f64 therefore in f32 precision; f16/bf16 results
 * are rounded to their type on the device after every op, ties to even), integers in int32 (i64
 * values must fit in int32; i8/u8 wrap after every op), bool as bool.
 *
 * Errors: an unknown backend name, or a requested backend that does not load, is
 * `RT_BACKEND_UNAVAILABLE` naming it and the cause; preparing a graph with an op the rules mark
 * unsupported is `RT_UNSUPPORTED_OP`; runs check inputs (`RT_MISSING_INPUT`, `RT_UNKNOWN_INPUT`,
 * `RT_BAD_VALUE`), fail with `RT_EVAL_FAILED` naming the node when a kernel throws, and with
 * `RT_DISPOSED` after `dispose()`.
 */
export async function createTfjsExecutor(opts: TfjsExecutorOptions = {}): Promise<Executor> {
  if (opts.threads !== undefined && (!Number.isSafeInteger(opts.threads) || opts.threads < 1)) {
    throw new RuntimeError(RuntimeCode.BAD_VALUE, `threads must be a positive integer, got ${String(opts.threads)}`);
  }
  const requested = requestedBackend(opts);
  let backend: TfjsBackend | undefined;
  if (requested !== undefined) {
    const load = await loadBackend(requested, opts.threads);
    if (!load.ok) throw unavailable(`tfjs backend '${requested}' is not available: ${load.reason}`, load.cause);
    backend = requested;
  } else {
    const reasons: string[] = [];
    for (const b of TFJS_BACKENDS) {
      const load = await loadBackend(b, opts.threads);
      if (load.ok) {
        backend = b;
        break;
      }
      reasons.push(`${b}: ${load.reason}`);
    }
    if (backend === undefined) throw unavailable(`no tfjs backend loads here (${reasons.join('; ')})`);
  }
  const chosen = backend;
  const rules = opts.rules ?? TFJS_RULES;
  const capabilities = capabilitiesOfTable(`tfjs-${chosen}`, rules);
  const live = new PreparedGraphs(`tfjs-${chosen}`);
  return {
    name: `tfjs-${chosen}`,
    capabilities,
    async prepare(graph: Graph, weights?: ValueSource): Promise<PreparedGraph> {
      live.check();
      return live.track(await prepareOnTfjs(expandFor(graph, capabilities), weights, chosen, rules));
    },
    dispose(): Promise<void> {
      live.disposeAll();
      return Promise.resolve();
    },
  };
}
