import { TFJS_RULES, isTfjsBackend } from './tfjs/index.js';
import { CPU_SCHEDULING, type ExecutorCapabilities, type SchedulingHints, capabilitiesOfTable } from './executor.js';
import { INTERPRETER_CAPABILITIES } from './interpreter-executor.js';
import { CPU_NATIVE_CAPABILITIES } from './native/executor.js';
import { ortCapabilities } from './ort/executor.js';
import { torchCapabilities } from './torch/executor.js';

export type { ExecutorCapabilities, SchedulingHints } from './executor.js';
export { CPU_SCHEDULING, GPU_SCHEDULING } from './executor.js';

/** A backend's exhaustive rule table, as far as capabilities go: each op lowers, decomposes or is unsupported. */
export type RuleKinds = Parameters<typeof capabilitiesOfTable>[1];

/** Capabilities of an executor whose ops are the entries of an exhaustive rule table (`capabilitiesOfTable`). */
export function capabilitiesFromRules(name: string, rules: RuleKinds, lateBinding = true): ExecutorCapabilities {
  return { ...capabilitiesOfTable(name, rules), lateBinding };
}

type Provider = (name: string) => ExecutorCapabilities | undefined;
// Each executor module owns its capabilities (`Executor.capabilities`); this table only answers for
// executors named before one is created (planning by name).
const providers: Provider[] = [
  (name) => (name === 'interpreter' ? INTERPRETER_CAPABILITIES : undefined),
  (name) => (name === 'torch-cpu' || name === 'torch-cuda' ? torchCapabilities(name === 'torch-cuda') : undefined),
  (name) => (name === 'onnxruntime' ? ortCapabilities() : undefined),
  (name) => (name === 'cpu-native' ? CPU_NATIVE_CAPABILITIES : undefined),
  (name) => (name.startsWith('tfjs-') && isTfjsBackend(name.slice('tfjs-'.length)) ? capabilitiesOfTable(name, TFJS_RULES) : undefined),
];

/**
 * Adds the capabilities of further executors (a provider answers for the names it knows, undefined
 * for others); later providers are asked first.
 */
export function registerExecutorCapabilities(provider: Provider): void {
  providers.unshift(provider);
}

/**
 * Capabilities of a known executor by name, before one is created (an executor object carries its
 * own, `Executor.capabilities`): `interpreter` and `torch-cpu`/`torch-cuda` run every op in f32,
 * bf16 and f16; `onnxruntime`, `cpu-native` and `tfjs-<backend>` run the ops their rule tables
 * lower, in f32; all bind late inputs. Undefined for a name no provider knows.
 */
export function executorCapabilities(name: string): ExecutorCapabilities | undefined {
  for (const p of providers) {
    const caps = p(name);
    if (caps !== undefined) return caps;
  }
  return undefined;
}

/** The scheduling defaults for executor `name`: its capabilities' hints, else `CPU_SCHEDULING`. */
export function schedulingHints(name: string): SchedulingHints {
  return executorCapabilities(name)?.scheduling ?? CPU_SCHEDULING;
}
