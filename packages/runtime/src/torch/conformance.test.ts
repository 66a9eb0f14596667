// Every op of the registry on the torch executor (CPU torch here and in CI) against the reference
// interpreter, on the shared conformance cases the tfjs and onnxruntime executors pass.
import { type HostTensor, OP_KEYS, interpret } from '@stageml/ir';
import { defaultTolerance } from '@stageml/testkit';
import { afterAll, beforeAll, expect, test } from 'vitest';

import { CONFORMANCE_CASES, type ConformanceCase } from '../tfjs/conformance/index.js';
import { type TorchExecutor, createTorchExecutor } from './index.js';
import { describeWithTorch } from './test-support.js';

function toleranceOf(c: ConformanceCase, expected: HostTensor): { rtol: number; atol: number } {
  return c.tol !== undefined ? { ...c.tol } : defaultTolerance(expected.dtype);
}

async function checkCase(executor: TorchExecutor, c: ConformanceCase): Promise<void> {
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

describeWithTorch('torch matches the interpreter', () => {
  let executor: TorchExecutor;
  beforeAll(async () => {
    executor = await createTorchExecutor({ device: 'cpu' });
  }, 120_000);
  afterAll(async () => {
    await executor.close();
  });

  test('runs on the CPU worker', () => {
    expect(executor.name).toBe('torch-cpu');
    expect(executor.info.protocol).toBe(1);
  });

  test.each([...OP_KEYS])('%s', async (key) => {
    for (const c of CONFORMANCE_CASES[key]) await checkCase(executor, c);
  });
});
