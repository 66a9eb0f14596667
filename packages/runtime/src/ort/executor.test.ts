import { GraphBuilder, type HostTensor, hostTensor, interpret, zeros } from '@stageml/ir';
import { ONNX_RULES, unsupported } from '@stageml/onnx-lower';
import { beforeAll, describe, expect, it, vi } from 'vitest';

import type { Executor } from '../executor.js';
import { createOrtExecutor } from './index.js';

const ramp = (shape: number[], scale = 0.1): HostTensor => hostTensor('f32', shape, Array.from({ length: shape.reduce((a, d) => a * d, 1) }, (_, i) => ((i % 7) - 3) * scale));

function linearGraph() {
  const b = new GraphBuilder('lin');
  const x = b.input('x', ['f32', ['n', 4]]);
  b.output('y', b.linear(x, b.param('w', ['f32', [3, 4]]), b.param('bias', ['f32', [3]])));
  return { graph: b.build(), weights: { w: ramp([3, 4]), bias: ramp([3]) } };
}

/** A one-layer KV-cache step: present = concat(past, x·w) along the sequence, then attention. */
function cacheGraph() {
  const b = new GraphBuilder('cache');
  const x = b.input('x', ['f32', [1, 2, 'seq', 4]]);
  const past = b.input('past', ['f32', [1, 2, 'past', 4]]);
  const k = b.concat([past, b.matmul(x, b.param('w', ['f32', [4, 4]]))], 2);
  b.output('present', k);
  b.output('out', b.attention(x, k, k, { causal: true }));
  return { graph: b.build(), weights: { w: ramp([4, 4]) } };
}

let executor: Executor;
beforeAll(async () => {
  executor = await createOrtExecutor();
});

describe('createOrtExecutor', () => {
  it('is named onnxruntime and runs a prepared graph many times', async () => {
    const { graph, weights } = linearGraph();
    const p = await executor.prepare(graph, weights);
    expect([executor.name, p.executor]).toEqual(['onnxruntime', 'onnxruntime']);
    for (const n of [1, 5, 2]) {
      const inputs = { x: ramp([n, 4], 0.3) };
      expect((await p.run(inputs))['y']).toBeAllclose(interpret(graph, { inputs, weights })['y']!);
    }
    p.dispose();
  });

  it('hands large weights over as in-memory external data with the same results', async () => {
    const b = new GraphBuilder('wide');
    b.output('y', b.linear(b.input('x', ['f32', ['n', 64]]), b.param('w', ['f32', [48, 64]])));
    const weights = { w: ramp([48, 64], 0.01) };
    const p = await executor.prepare(b.build(), weights);
    const inputs = { x: ramp([3, 64]) };
    expect((await p.run(inputs))['y']).toBeAllclose(interpret(b.build(), { inputs, weights })['y']!);
    p.dispose();
  });

  it.each([true, false])('grows a KV cache from empty across steps as the interpreter does (preallocated outputs: %s)', async (preallocateOutputs) => {
    const { graph, weights } = cacheGraph();
    const p = await (await createOrtExecutor({ preallocateOutputs })).prepare(graph, weights);
    let past = zeros('f32', [1, 2, 0, 4]);
    for (const seq of [3, 1, 1]) {
      const inputs = { x: ramp([1, 2, seq, 4], 0.2), past };
      const want = interpret(graph, { inputs, weights });
      const got = await p.run(inputs);
      expect(got['present']).toBeAllclose(want['present']!);
      expect(got['out']).toBeAllclose(want['out']!);
      past = got['present']!;
    }
    expect(past.shape).toEqual([1, 2, 5, 4]);
    p.dispose();
  });

  it.each([true, false])('returns inputs and parameters given as outputs (preallocated outputs: %s)', async (preallocateOutputs) => {
    const b = new GraphBuilder('passthrough');
    const x = b.input('x', ['i64', [2]]);
    b.output('x', x);
    b.output('w', b.param('w', ['f32', [2]]));
    b.output('copy', x);
    const p = await (await createOrtExecutor({ preallocateOutputs })).prepare(b.build(), { w: ramp([2]) });
    const out = await p.run({ x: hostTensor('i64', [2], [7, -9]) });
    expect(Array.from(out['x']!.data)).toEqual([7, -9]);
    expect(Array.from(out['copy']!.data)).toEqual([7, -9]);
    expect(out['w']).toBeAllclose(ramp([2]));
    p.dispose();
  });
});

describe('coded errors', () => {
  it('checks run inputs (RT_MISSING_INPUT, RT_UNKNOWN_INPUT, RT_BAD_VALUE)', async () => {
    const { graph, weights } = linearGraph();
    const p = await executor.prepare(graph, weights);
    await expect(p.run({})).rejects.toMatchObject({ code: 'RT_MISSING_INPUT' });
    await expect(p.run({ x: ramp([1, 4]), z: ramp([1]) })).rejects.toMatchObject({ code: 'RT_UNKNOWN_INPUT' });
    await expect(p.run({ x: ramp([1, 5]) })).rejects.toMatchObject({ code: 'RT_BAD_VALUE' });
    await expect(p.run({ x: hostTensor('f64', [1, 4], [1, 2, 3, 4]) })).rejects.toMatchObject({ code: 'RT_BAD_VALUE' });
    p.dispose();
    await expect(p.run({ x: ramp([1, 4]) })).rejects.toMatchObject({ code: 'RT_DISPOSED' });
  });

  it('rejects missing weights (RT_MISSING_WEIGHT) and bad options (RT_BAD_VALUE)', async () => {
    const { graph, weights } = linearGraph();
    await expect(executor.prepare(graph, { w: weights.w })).rejects.toMatchObject({ code: 'RT_MISSING_WEIGHT' });
    await expect(createOrtExecutor({ intraOpNumThreads: 0 })).rejects.toMatchObject({ code: 'RT_BAD_VALUE' });
    await expect(createOrtExecutor({ interOpNumThreads: 1.5 })).rejects.toMatchObject({ code: 'RT_BAD_VALUE' });
  });

  it('names an op without a lowering (RT_UNSUPPORTED_OP)', async () => {
    const { graph, weights } = linearGraph();
    const ex = await createOrtExecutor({ rules: { ...ONNX_RULES, linear: unsupported('switched off for the test') } });
    await expect(ex.prepare(graph, weights)).rejects.toMatchObject({ code: 'RT_UNSUPPORTED_OP', message: expect.stringContaining('sml.linear') });
  });

  it('reports a failing run with the runtime message (RT_EVAL_FAILED)', async () => {
    const b = new GraphBuilder('oob');
    b.output('y', b.gather(b.param('table', ['f32', [3, 2]]), b.input('ids', ['i64', ['n']])));
    const p = await executor.prepare(b.build(), { table: ramp([3, 2]) });
    await expect(p.run({ ids: hostTensor('i64', [2], [0, 7]) })).rejects.toMatchObject({ code: 'RT_EVAL_FAILED' });
    p.dispose();
  });

  it('is RT_BACKEND_UNAVAILABLE when onnxruntime-node does not load', async () => {
    vi.resetModules();
    vi.doMock('onnxruntime-node', () => {
      throw new Error('no binary for this platform');
    });
    try {
      const fresh = await import('./executor.js');
      await expect(fresh.createOrtExecutor()).rejects.toMatchObject({ code: 'RT_BACKEND_UNAVAILABLE', message: expect.stringContaining('cannot import onnxruntime-node') });
      expect(await fresh.isOrtAvailable()).toBe(false);
    } finally {
      vi.doUnmock('onnxruntime-node');
      vi.resetModules();
    }
  });
});
