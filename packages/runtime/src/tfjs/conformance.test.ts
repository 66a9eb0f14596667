import { type HostTensor, OP_KEYS, interpret } from '@stageml/ir';
import { defaultTolerance } from '@stageml/testkit';
import { beforeAll, describe, expect, test } from 'vitest';

import type { Executor } from '../executor.js';
import { CONFORMANCE_CASES, type ConformanceCase } from './conformance/index.js';
import { TFJS_RULES, type TfRuleTable, createTfjsExecutor } from './index.js';

/**
 * Tolerance of a case's output: the case's override, else the dtype's default (f32: rtol 1e-5,
 * atol 1e-6; f16/bf16 a few of their ulps, since the device computes in f32 and rounds each result
 * while the interpreter computes in f64; integers and bool exact). f64 runs in f32 on tfjs, so its
 * outputs get the f32 tolerance.
 */
function toleranceOf(c: ConformanceCase, expected: HostTensor): { rtol: number; atol: number } {
  if (c.tol !== undefined) return { ...c.tol };
  return defaultTolerance(expected.dtype === 'f64' ? 'f32' : expected.dtype);
}

async function checkCase(executor: Executor, c: ConformanceCase): Promise<void> {
  const expected = interpret(c.graph, { inputs: c.inputs, weights: c.weights });
  const prepared = await executor.prepare(c.graph, c.weights);
  try {
    // Two runs: the second reuses resident parameters, constants and compiled kernels.
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
          expect(got, `${c.name}: ${name} (run ${String(run + 1)})`).toBeAllclose(want, toleranceOf(c, want));
        }
      }
    }
  } finally {
    prepared.dispose();
  }
}

describe('conformance cases', () => {
  test('cover every op of the registry', () => {
    expect(Object.keys(CONFORMANCE_CASES).sort()).toEqual([...OP_KEYS].sort());
    for (const k of OP_KEYS) expect(CONFORMANCE_CASES[k].length, k).toBeGreaterThan(0);
  });

  test('every op has a tfjs lowering (no unsupported entries)', () => {
    const rules: TfRuleTable = TFJS_RULES;
    expect(OP_KEYS.filter((k) => rules[k].kind === 'unsupported')).toEqual([]);
  });
});

describe.each(['cpu', 'wasm'] as const)('tfjs-%s matches the interpreter', (backend) => {
  let executor: Executor;
  beforeAll(async () => {
    executor = await createTfjsExecutor({ backend });
  });

  test.each([...OP_KEYS])('%s', async (key) => {
    for (const c of CONFORMANCE_CASES[key]) await checkCase(executor, c);
  });
});
