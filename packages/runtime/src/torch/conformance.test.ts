// Every op of the registry on the torch executor (CPU torch here and in CI) against the reference
// interpreter, on the shared conformance cases the tfjs and onnxruntime executors pass.
import { OP_KEYS } from '@stageml/ir';
import { expectMatchesInterpreter } from '@stageml/testkit';
import { expect, test } from 'vitest';

import { CONFORMANCE_CASES } from '../tfjs/conformance/index.js';
import { describeWithTorch, useCpuTorchExecutor } from './test-support.js';

describeWithTorch('torch matches the interpreter', () => {
  const torch = useCpuTorchExecutor();

  test('runs on the CPU worker', () => {
    expect(torch().name).toBe('torch-cpu');
    expect(torch().info.protocol).toBe(6);
  });

  test.each([...OP_KEYS])('%s', async (key) => {
    for (const c of CONFORMANCE_CASES[key]) await expectMatchesInterpreter(torch(), c);
  });
});
