import { availableParallelism } from 'node:os';
import type { Graph } from '@stageml/ir';
import { ONNX_RULES, type OnnxRuleTable } from '@stageml/onnx-lower';

import { RuntimeCode, RuntimeError } from '../errors.js';
import { type Executor, type ExecutorCapabilities, type PreparedGraph, PreparedGraphs, capabilitiesOfTable, expandFor } from '../executor.js';
import type { ValueSource } from '../values.js';
import { type OrtSessionOptions, loadOrt } from './binding.js';
import { prepareOnOrt } from './prepare.js';

/**
 * What the onnxruntime executor with lowering table `rules` runs: the ops the table lowers (itself
 * or by decomposition), fusing the composites it has rules of its own for, in f32.
 */
export function ortCapabilities(rules: OnnxRuleTable = ONNX_RULES): ExecutorCapabilities {
  return capabilitiesOfTable('onnxruntime', rules);
}

/** Options of `createOrtExecutor`. */
export interface OrtExecutorOptions {
  /** Threads of onnxruntime's intra-op pool (default: the machine's cores, `os.availableParallelism()`). */
  readonly intraOpNumThreads?: number;
  /** Threads running independent nodes concurrently (default 1: sequential execution). */
  readonly interOpNumThreads?: number;
  /** onnxruntime graph optimizations (default `all`: constant folding, fusions, layout). */
  readonly graphOptimizationLevel?: 'disabled' | 'basic' | 'extended' | 'all';
  /**
   * onnxruntime log severity: 0 verbose … 4 fatal (default 4: failures reach the caller as coded
   * errors carrying the runtime's message, so the library prints nothing itself).
   */
  readonly logSeverityLevel?: 0 | 1 | 2 | 3 | 4;
  /**
   * Preallocate each run's outputs at their exact shapes (computed from the run's dims) for
   * onnxruntime to write into (default false: onnxruntime-node 1.30 still returns copies of
   * preallocated outputs, so the extra zero-filled allocations made decode steps slower in
   * `bench/onnx.ts`; docs/onnx.md has the numbers).
   */
  readonly preallocateOutputs?: boolean;
  /**
   * onnxruntime's CPU memory arena (default false): with it each session keeps the high-water mark
   * of its intermediates for its lifetime (four programs, one long prefill: hundreds of MB held);
   * without it intermediates are freed after each run. Measured no slower here (batch-1 and 32-row
   * decode within noise on the SmolLM2-135M shape).
   */
  readonly memArena?: boolean;
  /** The ONNX lowering table (default `ONNX_RULES`); override entries to experiment or test. */
  readonly rules?: OnnxRuleTable;
}

function positiveInt(name: string, v: number | undefined): void {
  if (v !== undefined && (!Number.isSafeInteger(v) || v < 1)) {
    throw new RuntimeError(RuntimeCode.BAD_VALUE, `${name} must be a positive integer, got ${String(v)}`);
  }
}

/** Whether onnxruntime-node loads in this process (imports it once). */
export async function isOrtAvailable(): Promise<boolean> {
  return (await loadOrt()).ok;
}

/**
 * Creates the onnxruntime executor (`onnxruntime`, CPU execution provider): each graph is lowered
 * to ONNX by `@stageml/onnx-lower` with its parameters as initializers (large ones handed over as
 * in-memory external data, so model size is not capped by protobuf's 2 GiB), so weights stay
 * resident in one inference session per prepared graph and each run only moves inputs and outputs.
 *
 * Numerics: f32 and f64 compute natively; f16/bf16 compute in float32 and are rounded to their
 * type after every op; i8/u8 compute in int32 and wrap after every op; i64 must be exact in a
 * double on the host side (|x| ≤ 2^53), as `HostTensor` stores it.
 *
 * Errors: `onnxruntime-node` missing or failing to load is `RT_BACKEND_UNAVAILABLE` naming the
 * cause; bad options `RT_BAD_VALUE`; an op without an ONNX lowering `RT_UNSUPPORTED_OP`; a session
 * onnxruntime rejects, or a failing run, `RT_EVAL_FAILED` with the runtime's message (node names
 * are the IR values'); runs check inputs (`RT_MISSING_INPUT`, `RT_UNKNOWN_INPUT`, `RT_BAD_VALUE`)
 * and fail with `RT_DISPOSED` after `dispose()`.
 */
export async function createOrtExecutor(opts: OrtExecutorOptions = {}): Promise<Executor> {
  positiveInt('intraOpNumThreads', opts.intraOpNumThreads);
  positiveInt('interOpNumThreads', opts.interOpNumThreads);
  const load = await loadOrt();
  if (!load.ok) {
    throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `the onnxruntime executor is not available: ${load.reason}`, {
      cause: load.cause,
      hint: 'install onnxruntime-node@1.30.0 beside @stageml/runtime (an optional peer; its CPU binaries ship in the npm package); in the StageML repository, `npx -y pnpm@12.4.2 install --frozen-lockfile` (the full install of README command 2) brings it',
    });
  }
  const session: OrtSessionOptions = {
    executionProviders: ['cpu'],
    intraOpNumThreads: opts.intraOpNumThreads ?? availableParallelism(),
    interOpNumThreads: opts.interOpNumThreads ?? 1,
    graphOptimizationLevel: opts.graphOptimizationLevel ?? 'all',
    executionMode: (opts.interOpNumThreads ?? 1) > 1 ? 'parallel' : 'sequential',
    enableCpuMemArena: opts.memArena ?? false,
    enableMemPattern: true,
    logSeverityLevel: opts.logSeverityLevel ?? 4,
  };
  const cfg = { ort: load.ort, session, rules: opts.rules, preallocateOutputs: opts.preallocateOutputs ?? false };
  const capabilities = ortCapabilities(opts.rules ?? ONNX_RULES);
  const live = new PreparedGraphs('onnxruntime');
  return {
    name: 'onnxruntime',
    capabilities,
    async prepare(graph: Graph, weights?: ValueSource): Promise<PreparedGraph> {
      live.check();
      return live.track(await prepareOnOrt(expandFor(graph, capabilities), weights, cfg));
    },
    dispose(): Promise<void> {
      live.disposeAll();
      return Promise.resolve();
    },
  };
}
