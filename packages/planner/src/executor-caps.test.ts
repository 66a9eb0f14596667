import { describe, expect, it } from 'vitest';
import { KIND_OPS, executableKinds, executorCapabilities, whyNotExecutable } from './executor-caps.js';

describe('executor capabilities', () => {
  it("traces each kind's ops from the forms peft builds", () => {
    expect(KIND_OPS.materialize).toEqual(['linear']);
    expect([...KIND_OPS.residual].sort()).toEqual(['add', 'constant', 'linear', 'mul']);
    expect([...KIND_OPS['grouped-bank']].sort()).toEqual(['add', 'constant', 'gather', 'indexSelect', 'linear', 'matmul', 'mul', 'reshape', 'scatterAdd']);
    expect(KIND_OPS.fallback).toEqual(KIND_OPS.residual);
  });

  it('describes interpreter, onnxruntime and tfjs executors, and explains a missing op', () => {
    for (const name of ['interpreter', 'onnxruntime', 'tfjs-cpu', 'tfjs-wasm']) expect(executableKinds(executorCapabilities(name)), name).toContain('residual');
    const noScatter = { name: 'no-scatter', supportsOp: (op: string) => op !== 'scatterAdd', lateBinding: true };
    expect(whyNotExecutable(noScatter, 'grouped-bank')).toBe("executor 'no-scatter' cannot run scatterAdd, which 'grouped-bank' needs");
    expect(whyNotExecutable(noScatter, 'residual')).toBeUndefined();
  });
});
