import { type Graph, type HostTensor, type OpKey, interpret } from '@stageml/ir';
import { RuntimeCode, RuntimeError } from './errors.js';
import { type Executor, type ExecutorCapabilities, type PreparedGraph, checkInputs, expandFor, resolveWeights } from './executor.js';
import type { ValueSource } from './values.js';

function attempt<T>(f: () => T): Promise<T> {
  try {
    return Promise.resolve(f());
  } catch (e) {
    return Promise.reject(e instanceof Error ? e : new RuntimeError(RuntimeCode.EVAL_FAILED, String(e)));
  }
}

/**
 * What the interpreter runs: every op, in f64, f32, bf16 and f16. It evaluates the model composites
 * (`rmsNorm`, `rotary`, `attention`) by their reference semantics and runs the serving composites
 * (`loraBank`, `cachedAttention`) as their primitive graphs, the computation the engine's programs
 * performed before those ops existed, so results stay what they were.
 */
export const INTERPRETER_CAPABILITIES: ExecutorCapabilities = {
  name: 'interpreter',
  fuses: new Set<OpKey>(['rmsNorm', 'rotary', 'attention']),
  supportsOp: () => true,
  lateBinding: true,
  dtypes: ['f64', 'f32', 'bf16', 'f16'],
};

/**
 * The reference interpreter as an executor: exact (f64 accumulation) and slow; the oracle. It holds
 * no memory or process of its own (a prepared graph references its caller's weights until that
 * graph's own `dispose`), so its `dispose` has nothing to release and this shared instance stays
 * usable.
 */
export const interpreterExecutor: Executor = {
  name: 'interpreter',
  capabilities: INTERPRETER_CAPABILITIES,
  prepare(source: Graph, weights?: ValueSource): Promise<PreparedGraph> {
    return attempt(() => {
      const graph = expandFor(source, INTERPRETER_CAPABILITIES);
      const { values, bindings } = resolveWeights(graph, weights);
      const params = Object.fromEntries(values);
      let disposed = false;
      return {
        executor: 'interpreter',
        run(inputs: Readonly<Record<string, HostTensor>>): Promise<Record<string, HostTensor>> {
          return attempt(() => {
            if (disposed) throw new RuntimeError(RuntimeCode.DISPOSED, 'this prepared graph was disposed');
            checkInputs(graph, inputs, bindings);
            return interpret(graph, { inputs, weights: params });
          });
        },
        dispose(): void {
          disposed = true;
        },
      };
    });
  },
  dispose(): Promise<void> {
    return Promise.resolve();
  },
};
