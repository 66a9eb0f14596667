import { type Graph, type HostTensor, interpret } from '@stageml/ir';
import { RuntimeCode, RuntimeError } from './errors.js';
import { type Executor, type PreparedGraph, checkInputs, resolveWeights } from './executor.js';
import type { ValueSource } from './values.js';

function attempt<T>(f: () => T): Promise<T> {
  try {
    return Promise.resolve(f());
  } catch (e) {
    return Promise.reject(e instanceof Error ? e : new RuntimeError(RuntimeCode.EVAL_FAILED, String(e)));
  }
}

/** The reference interpreter as an executor: exact (f64 accumulation) and slow; the oracle. */
export const interpreterExecutor: Executor = {
  name: 'interpreter',
  prepare(graph: Graph, weights?: ValueSource): Promise<PreparedGraph> {
    return attempt(() => {
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
};
