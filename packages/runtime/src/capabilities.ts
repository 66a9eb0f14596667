import { type DType, OP_KEYS, type OpKey } from '@stageml/ir';
import { ONNX_RULES } from '@stageml/onnx-lower';
import { TFJS_RULES, isTfjsBackend } from './tfjs/index.js';
import { CPU_NATIVE_OPS } from './native/executor.js';

/** What an executor can run, as far as planning is concerned. */
export interface ExecutorCapabilities {
  /** Executor name (`interpreter`, `onnxruntime`, `tfjs-wasm`, …). */
  readonly name: string;
  /** Whether the executor runs op `op`. */
  readonly supportsOp: (op: OpKey) => boolean;
  /** Whether factors may be bound at request time (inputs supplied per run). */
  readonly lateBinding: boolean;
  /**
   * Float dtypes its programs may compute in (what `Engine.load`'s `dtype` checks); undefined:
   * f32 only.
   */
  readonly dtypes?: readonly DType[];
  /**
   * Whether its runs make `RunOptions.sample` picks where the results are, and that is worth it:
   * the torch worker on CUDA (a sort and a few scans of the logits on the GPU against the whole
   * vocabulary's logits crossing to the host). Undefined: the caller picks from the values (on the
   * CPU torch worker the host's picks are faster: bench/results/torch-sample.md).
   */
  readonly devicePicks?: boolean;
  /**
   * What a scheduler over this executor should default to (`SchedulingHints`); undefined: the
   * host-CPU defaults `CPU_SCHEDULING`. Explicit options (`--max-num-batched-tokens`,
   * `--max-num-seqs`) override them.
   */
  readonly scheduling?: SchedulingHints;
}

/**
 * Defaults a scheduler takes from the executor it drives, as vLLM sizes `--max-num-batched-tokens`
 * and `--max-num-seqs` for the device: on a GPU a step of thousands of tokens costs little more
 * than one of a few (the weights are read once either way), on two CPU cores every token counts.
 */
export interface SchedulingHints {
  /** Most prompt tokens one step prefills over all its sequences (vLLM's max-num-batched-tokens). */
  readonly tokenBudget: number;
  /** Most sequences running together (vLLM's max-num-seqs). */
  readonly maxBatch: number;
}

/** The scheduling defaults of an executor that computes on the host CPU (and of unknown ones). */
export const CPU_SCHEDULING: SchedulingHints = { tokenBudget: 64, maxBatch: 32 };

/** The scheduling defaults of an executor on a CUDA GPU (`torch-cuda`). */
export const GPU_SCHEDULING: SchedulingHints = { tokenBudget: 8192, maxBatch: 256 };

/** The scheduling defaults for executor `name`: its capabilities' hints, else `CPU_SCHEDULING`. */
export function schedulingHints(name: string): SchedulingHints {
  return executorCapabilities(name)?.scheduling ?? CPU_SCHEDULING;
}

/** A backend's exhaustive rule table, as far as capabilities go: each op lowers or is unsupported. */
export type RuleKinds = Readonly<Record<OpKey, { readonly kind: string }>>;

/** Capabilities of an executor whose ops are the `lower` entries of an exhaustive rule table. */
export function capabilitiesFromRules(name: string, rules: RuleKinds, lateBinding = true): ExecutorCapabilities {
  const supported = new Set(OP_KEYS.filter((op) => rules[op].kind !== 'unsupported'));
  return { name, supportsOp: (op) => supported.has(op), lateBinding };
}

type Provider = (name: string) => ExecutorCapabilities | undefined;
const providers: Provider[] = [
  (name) => (name === 'interpreter' ? { name, supportsOp: () => true, lateBinding: true, dtypes: ['f64', 'f32', 'bf16', 'f16'] } : undefined),
  // The torch worker (`torch-cpu`, `torch-cuda`) maps every op (conformance-tested) in every float dtype.
  (name) => (name === 'torch-cpu' || name === 'torch-cuda' ? { name, supportsOp: () => true, lateBinding: true, dtypes: ['f64', 'f32', 'bf16', 'f16'], ...(name === 'torch-cuda' ? { devicePicks: true, scheduling: GPU_SCHEDULING } : {}) } : undefined),
  (name) => (name === 'onnxruntime' ? capabilitiesFromRules(name, ONNX_RULES) : undefined),
  (name) => (name === 'cpu-native' ? { name, supportsOp: (op) => CPU_NATIVE_OPS.includes(op), lateBinding: true } : undefined),
  (name) => (name.startsWith('tfjs-') && isTfjsBackend(name.slice('tfjs-'.length)) ? capabilitiesFromRules(name, TFJS_RULES) : undefined),
];

/**
 * Adds the capabilities of further executors (a provider answers for the names it knows, undefined
 * for others); later providers are asked first.
 */
export function registerExecutorCapabilities(provider: Provider): void {
  providers.unshift(provider);
}

/**
 * Capabilities of a known executor by name: `interpreter` and `torch-cpu`/`torch-cuda` run every
 * op in f32, bf16 and f16; `onnxruntime` and `tfjs-<backend>` run the ops their rule tables lower,
 * in f32; all bind late inputs. Undefined for a
 * name no provider knows.
 */
export function executorCapabilities(name: string): ExecutorCapabilities | undefined {
  for (const p of providers) {
    const caps = p(name);
    if (caps !== undefined) return caps;
  }
  return undefined;
}
