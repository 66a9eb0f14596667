import { describe, expect, it } from 'vitest';
import { GraphBuilder } from './builder.js';
import { COMPOSITE_OPS, expandComposites } from './decompose.js';
import { graphOps } from './graph.js';
import { interpret } from './interpret.js';
import type { HostTensor } from './tensor.js';
import { verifyGraph } from './verify.js';

function tensor(shape: number[], seed: number): HostTensor {
  const n = shape.reduce((p, q) => p * q, 1);
  return { dtype: 'f32', shape, data: Float32Array.from({ length: n }, (_, i) => Math.sin(seed + i * 0.37) * 2) };
}

function expectClose(a: HostTensor, b: HostTensor): void {
  expect(a.shape).toEqual(b.shape);
  for (let i = 0; i < a.data.length; i++) expect(Math.abs(Number(a.data[i]) - Number(b.data[i]))).toBeLessThan(1e-5);
}

describe('decompositions of composite ops', () => {
  it('exist for rmsNorm and rotary', () => {
    expect(COMPOSITE_OPS).toEqual(expect.arrayContaining(['rmsNorm', 'rotary']));
  });

  for (const interleaved of [false, true]) {
    it(`compute what the op computes: rmsNorm, rotary (${interleaved ? 'interleaved' : 'halves'})`, () => {
      const b = new GraphBuilder('blk');
      const x = b.input('x', ['f32', ['t', 8]]);
      const w = b.param('w', ['f32', [8]]);
      const cos = b.input('cos', ['f32', ['t', 8]]);
      const sin = b.input('sin', ['f32', ['t', 8]]);
      const n = b.rmsNorm(x, w, 1e-5);
      b.output('y', b.op('rotary', [n, cos, sin], { interleaved }));
      b.output('plain', b.rmsNorm(x, undefined, 1e-6));
      const g = b.build();
      const expanded = expandComposites(g);
      verifyGraph(expanded);
      const ops = new Set(graphOps(expanded).map((o) => o.op));
      for (const c of COMPOSITE_OPS) expect(ops.has(c), c).toBe(false);
      const inputs = { x: tensor([3, 8], 1), cos: tensor([3, 8], 2), sin: tensor([3, 8], 3) };
      const weights = { w: tensor([8], 4) };
      const want = interpret(g, { inputs, weights });
      const got = interpret(expanded, { inputs, weights });
      expectClose(got['y']!, want['y']!);
      expectClose(got['plain']!, want['plain']!);
    });
  }

  it('leaves ops the predicate keeps, and the input graph, alone', () => {
    const b = new GraphBuilder('keep');
    const x = b.input('x', ['f32', [2, 4]]);
    b.output('y', b.rmsNorm(x, undefined, 1e-6));
    const g = b.build();
    expect(graphOps(expandComposites(g, (op) => op !== 'rmsNorm')).map((o) => o.op)).toEqual(['rmsNorm']);
    expect(graphOps(g).map((o) => o.op)).toEqual(['rmsNorm']);
  });
});
