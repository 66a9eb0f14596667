// Every op of the registry on the torch executor (CPU torch here and in CI) against the reference
// interpreter, on the shared conformance cases the tfjs and onnxruntime executors pass.
import { OP_KEYS } from '@stageml/ir';
import { expectMatchesInterpreter } from '@stageml/testkit';
import { afterAll, beforeAll, expect, test } from 'vitest';

import { CONFORMANCE_CASES } from '../tfjs/conformance/index.js';
import { type TorchExecutor, createTorchExecutor } from './index.js';
import { describeWithTorch } from './test-support.js';

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
    for (const c of CONFORMANCE_CASES[key]) await expectMatchesInterpreter(executor, c);
  });
});
