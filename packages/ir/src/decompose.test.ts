import { fc, test } from '@fast-check/vitest';
import { describe, expect, it } from 'vitest';
import { type OpSample, opSamples } from '../../testkit/src/index.js';
import { GraphBuilder } from './builder.js';
import { COMPOSITE_OPS, expandComposites } from './decompose.js';
import { graphOps } from './graph.js';
import { interpret } from './interpret.js';
import type { OpKey } from './ops/index.js';
import type { HostTensor } from './tensor.js';
import { shapeToString } from './types.js';
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
  it('expand the composites a decomposition emits too, where the predicate wants them (loraBankLinear → linear + loraBank → primitives)', () => {
    const b = new GraphBuilder('bank');
    const x = b.input('x', ['f32', [2, 1, 4]]);
    const w = b.param('w', ['f32', [3, 4]]);
    const A = b.input('A', ['f32', [2, 1, 4]]);
    const B = b.input('B', ['f32', [2, 1, 3]]);
    const index = b.input('index', ['i64', [2]]);
    const [sum, y] = b.skipRmsNorm(b.loraBankLinear('gathered', x, w, A, B, index), b.input('r', ['f32', [2, 1, 3]]), undefined, 1e-6);
    b.output('sum', sum);
    b.output('y', y);
    const g = b.build();
    const ops = (e: ReturnType<typeof expandComposites>): string[] => graphOps(e).map((n) => n.op);
    // A backend fusing loraBank and rmsNorm (cpu-native): one level down, no further.
    const kept = expandComposites(g, (op) => op !== 'loraBank' && op !== 'rmsNorm');
    expect(ops(kept)).toEqual(['linear', 'loraBank', 'add', 'rmsNorm']);
    // A backend fusing none: primitives only.
    const all = expandComposites(g);
    expect(ops(all).filter((op) => COMPOSITE_OPS.includes(op as OpKey))).toEqual([]);
    verifyGraph(all);
    const inputs = { x: tensor([2, 1, 4], 1), A: tensor([2, 1, 4], 2), B: tensor([2, 1, 3], 3), r: tensor([2, 1, 3], 4), index: { dtype: 'i64', shape: [2], data: Float64Array.from([1, 0]) } as unknown as HostTensor };
    const weights = { w: tensor([3, 4], 5) };
    const want = interpret(g, { inputs, weights });
    for (const e of [kept, all]) {
      const got = interpret(e, { inputs, weights });
      for (const k of ['sum', 'y']) expectClose(got[k]!, want[k]!);
    }
  });

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

/** Whether two results agree: same shape, NaN where the other is NaN, else within `tol` relative. */
function agree(a: HostTensor, b: HostTensor, tol: number): boolean {
  if (a.shape.join(',') !== b.shape.join(',')) return false;
  for (let i = 0; i < a.data.length; i++) {
    const x = Number(a.data[i]);
    const y = Number(b.data[i]);
    if (Number.isNaN(x) || Number.isNaN(y)) {
      if (Number.isNaN(x) !== Number.isNaN(y)) return false;
      continue;
    }
    if (Math.abs(x - y) > tol * (1 + Math.abs(y))) return false;
  }
  return true;
}

describe('every composite op', () => {
  it('includes attention and the serving ops', () => {
    expect(COMPOSITE_OPS).toEqual(expect.arrayContaining(['attention', 'loraBank', 'cachedAttention']));
  });

  // The decomposition computes what `evaluate` computes, on every sampler case in f32 and f64
  // (attention with at least one key: with none, evaluate's rows are NaN, the primitive softmax's empty).
  describe.each(COMPOSITE_OPS.map((k) => [k] as const))('%s', (key) => {
    test.prop([opSamples[key] as fc.Arbitrary<OpSample<OpKey>>], { numRuns: 60 })('its decomposition equals evaluate', (s) => {
      // i8: the int8 factor tables of `quantizedLoraBank` (exact in every float dtype).
      fc.pre(s.operands.every((t) => t.dtype === 'f32' || t.dtype === 'f64' || t.dtype === 'i64' || t.dtype === 'bool' || t.dtype === 'i8'));
      if (key === 'attention') fc.pre(s.operands[1]!.shape[s.operands[1]!.shape.length - 2] !== 0);
      const b = new GraphBuilder(`decomposed.${key}`);
      const inputs: Record<string, HostTensor> = {};
      const vals = s.operands.map((t, i) => {
        inputs[`a${String(i)}`] = t;
        return b.input(`a${String(i)}`, { dtype: t.dtype, shape: t.shape });
      });
      b.apply(key, vals, s.attrs).forEach((v, i) => {
        b.output(`r${String(i)}`, v);
      });
      const g = b.build();
      const expanded = expandComposites(g);
      verifyGraph(expanded);
      expect(graphOps(expanded).some((o) => o.op === key)).toBe(false);
      const want = interpret(g, { inputs });
      const got = interpret(expanded, { inputs });
      const tol = s.operands[0]!.dtype === 'f64' ? 1e-9 : 1e-4;
      for (const k of Object.keys(want)) expect(agree(got[k]!, want[k]!, tol), k).toBe(true);
    });
  });

  it('loraBank expands to the primitive graph of its form (gathered: two gathered matmuls added to the base)', () => {
    const b = new GraphBuilder('bank');
    const x = b.input('x', ['f32', ['batch', 'seq', 4]]);
    const w = b.param('w', ['f32', [3, 4]]);
    const A = b.input('A', ['f32', [2, 2, 4]]);
    const B = b.input('B', ['f32', [2, 2, 3]]);
    const rows = b.input('rows', ['i64', ['batch']]);
    b.output('y', b.loraBank('gathered', x, b.linear(x, w), A, B, rows));
    expect(graphOps(expandComposites(b.build())).map((o) => o.op)).toEqual(['linear', 'gather', 'matmul', 'gather', 'matmul', 'add']);
  });

  it('cachedAttention expands to transpose + concat of the cache and attention', () => {
    const b = new GraphBuilder('cached');
    const q = b.input('q', ['f32', ['batch', 4, 'seq', 2]]);
    const pk = b.input('pk', ['f32', ['batch', 'past', 2, 2]]);
    const pv = b.input('pv', ['f32', ['batch', 'past', 2, 2]]);
    const k = b.input('k', ['f32', ['batch', 2, 'seq', 2]]);
    const v = b.input('v', ['f32', ['batch', 2, 'seq', 2]]);
    b.output('y', b.cachedAttention(q, pk, pv, k, v, { causal: true }));
    const g = expandComposites(b.build(), (op) => op !== 'attention');
    expect(graphOps(g).map((o) => o.op)).toEqual(['transpose', 'concat', 'transpose', 'concat', 'attention']);
    expect(shapeToString(g.values[graphOps(g)[4]!.results[0]!]!.type.shape)).toBe('[batch, 4, seq, 2]');
  });

  it('refuses a loraBank whose select does not fit its form, naming it', () => {
    const b = new GraphBuilder('bad');
    const x = b.input('x', ['f32', [2, 1, 4]]);
    const w = b.param('w', ['f32', [3, 4]]);
    const A = b.input('A', ['f32', [2, 2, 4]]);
    const B = b.input('B', ['f32', [2, 2, 3]]);
    const one = b.input('one', ['i64', []]);
    const base = b.linear(x, w);
    expect(() => b.loraBank('single', x, base, A, B, one, b.input('mask', ['f32', [2, 3]]))).toThrow(/single: select must be \[2, 1, 1\]/);
    expect(() => b.loraBank('gathered', x, base, A, B, one)).toThrow(/gathered: index must be \[2\]/);
    expect(() => b.loraBank('gathered', x, w, A, B, b.input('rows', ['i64', [2]]))).toThrow(/base must be \[2, 1, out\]/);
  });
});
