import { describe, expect, it } from 'vitest';
import { CPU_SCHEDULING, GPU_SCHEDULING, executorCapabilities, registerExecutorCapabilities, schedulingHints } from './index.js';

describe('schedulingHints', () => {
  it('gives a CUDA worker a budget of thousands of tokens and the host-CPU executors the small one', () => {
    expect(schedulingHints('torch-cuda')).toEqual({ tokenBudget: 8192, maxBatch: 256 });
    expect(executorCapabilities('torch-cuda')?.scheduling).toBe(GPU_SCHEDULING);
    for (const name of ['torch-cpu', 'interpreter', 'cpu-native', 'onnxruntime', 'no-such-executor']) expect(schedulingHints(name)).toBe(CPU_SCHEDULING);
    expect(CPU_SCHEDULING).toEqual({ tokenBudget: 64, maxBatch: 32 });
  });

  it("takes a registered executor's own hints", () => {
    registerExecutorCapabilities((name) => (name === 'test-accelerator' ? { name, supportsOp: () => true, lateBinding: true, scheduling: { tokenBudget: 2048, maxBatch: 48 } } : undefined));
    expect(schedulingHints('test-accelerator')).toEqual({ tokenBudget: 2048, maxBatch: 48 });
  });
});
