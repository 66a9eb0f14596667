// An op registered at run time with only a decomposition (no rule in any backend table, no handler
// in the torch worker) runs on every executor, with the interpreter's results: each executor's
// `prepare` expands the composites it does not fuse (`Executor.capabilities.fuses`).
import { GraphBuilder, type HostTensor, type OpKey, type Value, defineOp, graphOps, interpret, registerOp } from '@stageml/ir';
import { describe, expect, it } from 'vitest';

import { type Executor, expandFor } from './executor.js';
import { interpreterExecutor } from './interpreter-executor.js';
import { createCpuNativeExecutor } from './native/index.js';
import { createOrtExecutor } from './ort/index.js';
import { createTfjsExecutor } from './tfjs/index.js';
import { describeWithTorch, useCpuTorchExecutor } from './torch/test-support.js';

/** y = x·sigmoid(x·w) + x: a gated residual no backend has heard of. */
const probe = defineOp({
  key: 'probeGatedResidual',
  summary: 'A gated residual used only to test that composites run everywhere through their decomposition.',
  semantics: 'y = x·σ(x·w) + x',
  operands: ['x', 'w'],
  infer: ([x]) => [x!],
  evaluate: ([x, w]) => {
    const data = Float32Array.from(x!.data, (v, i) => {
      const g = 1 / (1 + Math.exp(-v * Number(w!.data[i % w!.data.length])));
      return v * g + v;
    });
    return [{ dtype: x!.dtype, shape: [...x!.shape], data }];
  },
  decompose: (b, [x, w]) => [b.add(b.mul(x!, b.sigmoid(b.mul(x!, w!))), x!)],
});
registerOp(probe);
const PROBE = 'probeGatedResidual' as OpKey;

/** A graph reading the probe op twice around a linear (rows symbolic). */
function probeGraph(): { graph: ReturnType<GraphBuilder['build']>; inputs: Record<string, HostTensor>; weights: Record<string, HostTensor> } {
  const b = new GraphBuilder('probe');
  const x = b.input('x', ['f32', ['rows', 4]]);
  const w = b.param('w', ['f32', [4]]);
  const m = b.param('m', ['f32', [3, 4]]);
  const once: Value = b.op(PROBE, [x, w]);
  b.output('y', b.linear(once, m));
  b.output('z', b.op(PROBE, [once, w]));
  const rnd = (n: number, s: number): Float32Array => Float32Array.from({ length: n }, (_, i) => Math.sin(s + i * 0.7));
  return {
    graph: b.build(),
    inputs: { x: { dtype: 'f32', shape: [2, 4], data: rnd(8, 1) } },
    weights: { w: { dtype: 'f32', shape: [4], data: rnd(4, 2) }, m: { dtype: 'f32', shape: [3, 4], data: rnd(12, 3) } },
  };
}

async function expectRunsLikeTheInterpreter(executor: Executor): Promise<void> {
  const { graph, inputs, weights } = probeGraph();
  const want = interpret(graph, { inputs, weights });
  const prepared = await executor.prepare(graph, weights);
  try {
    const got = await prepared.run(inputs);
    for (const k of ['y', 'z']) {
      expect(got[k]!.shape, k).toEqual(want[k]!.shape);
      Array.from(got[k]!.data).forEach((v, i) => {
        expect(Math.abs(v - Number(want[k]!.data[i])), `${executor.name} ${k}[${String(i)}]`).toBeLessThan(1e-5);
      });
    }
  } finally {
    prepared.dispose();
  }
}

describe('an op with only a decomposition', () => {
  it('is expanded for every executor that does not fuse it, and by the reference evaluate equals its decomposition', () => {
    const { graph, inputs, weights } = probeGraph();
    const expanded = expandFor(graph, interpreterExecutor.capabilities);
    expect(graphOps(expanded).some((n) => n.op === PROBE)).toBe(false);
    const want = interpret(graph, { inputs, weights });
    const got = interpret(expanded, { inputs, weights });
    Array.from(got['z']!.data).forEach((v, i) => {
      expect(Math.abs(v - Number(want['z']!.data[i]))).toBeLessThan(1e-6);
    });
  });

  it('runs on the interpreter', async () => {
    await expectRunsLikeTheInterpreter(interpreterExecutor);
  });

  it('runs on cpu-native', async () => {
    const executor = createCpuNativeExecutor({ threads: 1 });
    await expectRunsLikeTheInterpreter(executor);
    await executor.dispose();
  });

  it('runs on onnxruntime', async () => {
    const executor = await createOrtExecutor({ intraOpNumThreads: 1 });
    await expectRunsLikeTheInterpreter(executor);
    await executor.dispose();
  });

  it('runs on tfjs-cpu', async () => {
    const executor = await createTfjsExecutor({ backend: 'cpu' });
    await expectRunsLikeTheInterpreter(executor);
    await executor.dispose();
  });
});

describeWithTorch('an op with only a decomposition on the torch worker', () => {
  const torch = useCpuTorchExecutor();
  it('runs on torch-cpu', async () => {
    await expectRunsLikeTheInterpreter(torch());
  });
});

describe('Executor.dispose', () => {
  const makers: [string, () => Promise<Executor>][] = [
    ['cpu-native', () => Promise.resolve(createCpuNativeExecutor({ threads: 1 }))],
    ['onnxruntime', () => createOrtExecutor({ intraOpNumThreads: 1 })],
    ['tfjs-cpu', () => createTfjsExecutor({ backend: 'cpu' })],
  ];
  it.each(makers)('%s: releases what it prepared; later runs and prepares are RT_DISPOSED; idempotent', async (_name, make) => {
    const executor = await make();
    const { graph, inputs, weights } = probeGraph();
    const prepared = await executor.prepare(graph, weights);
    await prepared.run(inputs);
    await executor.dispose();
    await executor.dispose();
    await expect(prepared.run(inputs)).rejects.toMatchObject({ code: 'RT_DISPOSED' });
    await expect(executor.prepare(graph, weights)).rejects.toMatchObject({ code: 'RT_DISPOSED' });
  });

  it('the interpreter holds nothing: dispose resolves and it stays usable', async () => {
    await interpreterExecutor.dispose();
    await expectRunsLikeTheInterpreter(interpreterExecutor);
  });
});
