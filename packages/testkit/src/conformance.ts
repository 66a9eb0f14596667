import { type DType, type Graph, type HostTensor, interpret } from '@stageml/ir';
import { expect } from 'vitest';

import { defaultTolerance } from './allclose.js';

/** One small graph exercising an op, with its data and how to compare an executor with the interpreter on it. */
export interface ExecutorCase {
  /** What the case covers (shown on failure). */
  readonly name: string;
  /** The graph; outputs are `out` or `out0`, `out1`, …. */
  readonly graph: Graph;
  /** Input values by name. */
  readonly inputs: Readonly<Record<string, HostTensor>>;
  /** Parameter values by name. */
  readonly weights: Readonly<Record<string, HostTensor>>;
  /** A tolerance override; where set, the case table says why. */
  readonly tol?: { readonly rtol: number; readonly atol: number };
  /** `values`: allclose to the interpreter; `range`: random, so dtype, shape and [0, 1) only. */
  readonly compare: 'values' | 'range';
}

/** What the conformance check needs of an executor: prepare a graph, run it, dispose it. */
export interface CaseExecutor {
  prepare(
    graph: Graph,
    weights: Readonly<Record<string, HostTensor>>,
  ): Promise<{ run(inputs: Readonly<Record<string, HostTensor>>): Promise<Readonly<Record<string, HostTensor>>>; dispose(): void }>;
}

/** Options of `expectMatchesInterpreter`. */
export interface ExecutorCaseOptions {
  /** The dtype whose default tolerance applies to an output of `dtype` (default: itself). */
  readonly toleranceDType?: (dtype: DType) => DType;
}

/**
 * Runs case `c` twice on `executor` (the second run reuses whatever the executor made resident)
 * and asserts each run's outputs match the reference interpreter's: allclose within the case's
 * tolerance (else the dtype's default), or, for `range` cases, the same dtype and shape with values
 * in [0, 1) that vary once there are 64 or more.
 */
export async function expectMatchesInterpreter(executor: CaseExecutor, c: ExecutorCase, opts: ExecutorCaseOptions = {}): Promise<void> {
  const expected = interpret(c.graph, { inputs: c.inputs, weights: c.weights });
  const prepared = await executor.prepare(c.graph, c.weights);
  try {
    for (let run = 0; run < 2; run++) {
      const actual = await prepared.run(c.inputs);
      expect(Object.keys(actual).sort(), c.name).toEqual(Object.keys(expected).sort());
      for (const [name, want] of Object.entries(expected)) {
        const got = actual[name]!;
        if (c.compare === 'range') {
          expect({ dtype: got.dtype, shape: got.shape }, `${c.name}: ${name}`).toEqual({ dtype: want.dtype, shape: want.shape });
          expect(Array.from(got.data).every((v) => v >= 0 && v < 1), `${c.name}: ${name} in [0, 1)`).toBe(true);
          // With ≥ 64 samples, a constant output would mean the generator is not running.
          if (got.data.length >= 64) expect(new Set(got.data).size, `${c.name}: ${name} varies`).toBeGreaterThan(1);
        } else {
          const tol = c.tol !== undefined ? { ...c.tol } : defaultTolerance(opts.toleranceDType?.(want.dtype) ?? want.dtype);
          expect(got, `${c.name}: ${name} (run ${String(run + 1)})`).toBeAllclose(want, tol);
        }
      }
    }
  } finally {
    prepared.dispose();
  }
}
