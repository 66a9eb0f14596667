// f64 graphs compute in double on onnxruntime; the shared conformance table covers f64 for
// element-wise ops only, so these cases cover the composite lowerings, where onnxruntime lacks
// double kernels (Erf) or fuses into float-precision ones (SimplifiedLayerNormalization).
import { GraphBuilder, type Value, hostTensor, interpret } from '@stageml/ir';
import { beforeAll, describe, expect, test } from 'vitest';

import type { Executor } from '../executor.js';
import { createOrtExecutor } from './index.js';

const CASES: Readonly<Record<string, (b: GraphBuilder, x: Value, y: Value) => Value>> = {
  'gelu (exact, erf)': (b, x) => b.gelu(x, 'none'),
  'gelu (tanh)': (b, x) => b.gelu(x, 'tanh'),
  silu: (b, x) => b.silu(x),
  rmsNorm: (b, x, y) => b.rmsNorm(x, b.reshape(b.slice(y, 0, 0, 1), [4]), 1e-6),
  layerNorm: (b, x) => b.layerNorm(x),
  softmax: (b, x) => b.softmax(x),
  mean: (b, x) => b.mean(x, [1]),
  max: (b, x) => b.max(x, [1]),
  topk: (b, x) => b.topk(x, 2)[0],
  rotary: (b, x, y) => b.rotary(x, y, y),
  attention: (b, x, y) => b.attention(b.reshape(x, [1, 3, 4]), b.reshape(y, [1, 3, 4]), b.reshape(y, [1, 3, 4]), { causal: true }),
  'matmul transposeB': (b, x, y) => b.matmul(x, y, { transposeB: true }),
  groupedMatmul: (b, x, y) => b.op('groupedMatmul', [x, b.reshape(b.concat([y, y], 0), [2, 3, 4]), b.constant([0, 1, 0], 'i64', [3])], { transposeW: true }),
  scatterAdd: (b, x, y) => b.scatterAdd(x, b.constant([0, 0], 'i64', [2]), b.slice(y, 0, 0, 2)),
  'cast through f16': (b, x) => b.cast(b.cast(x, 'f16'), 'f64'),
  iota: (b, x) => b.add(x, b.iota([3, 4], 1, 'f64')),
};

describe('f64 on onnxruntime equals the interpreter within f64 tolerance', () => {
  let executor: Executor;
  beforeAll(async () => {
    executor = await createOrtExecutor();
  });

  test.each(Object.keys(CASES))('%s', async (name) => {
    const b = new GraphBuilder('f64_case');
    const x = b.input('x', ['f64', [3, 4]]);
    const y = b.input('y', ['f64', [3, 4]]);
    b.output('out', CASES[name]!(b, x, y));
    const graph = b.build();
    const inputs = { x: hostTensor('f64', [3, 4], Array.from({ length: 12 }, (_, i) => Math.sin(i) * 2)), y: hostTensor('f64', [3, 4], Array.from({ length: 12 }, (_, i) => Math.cos(i))) };
    const p = await executor.prepare(graph, {});
    expect((await p.run(inputs))['out']).toBeAllclose(interpret(graph, { inputs })['out']!);
    p.dispose();
  });
});
