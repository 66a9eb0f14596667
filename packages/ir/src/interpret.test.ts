import { describe, expect, test } from 'vitest';

import { expectCode } from '../../testkit/src/index.js';
import { type GraphBuilder, type Value, traceGraph } from './builder.js';
import { parseDim } from './dim.js';
import type { DType } from './dtype.js';
import { IrCode } from './errors.js';
import { bindDims, interpret, recordWeightStore, seededRandom } from './interpret.js';
import { type HostTensor, hostTensor, sizeOf, toArray } from './tensor.js';
import { tensorType } from './types.js';

/** A tensor from nested numbers (row-major), shape given. */
const T = (dtype: DType, shape: readonly number[], values: readonly number[]): HostTensor => hostTensor(dtype, shape, values);
const f32 = (shape: readonly number[], values: readonly number[]): HostTensor => T('f32', shape, values);
const f64 = (shape: readonly number[], values: readonly number[]): HostTensor => T('f64', shape, values);

/** Traces a graph whose inputs are named after `inputs` (types taken from the tensors) and runs it. */
function run(
  inputs: Readonly<Record<string, HostTensor>>,
  body: (b: GraphBuilder, x: Record<string, Value>) => Value | readonly Value[] | Readonly<Record<string, Value>>,
  weights: Readonly<Record<string, HostTensor>> = {},
): Record<string, HostTensor> {
  const g = traceGraph('t', (b) => {
    const xs: Record<string, Value> = {};
    for (const [name, t] of Object.entries(inputs)) xs[name] = b.input(name, { dtype: t.dtype, shape: t.shape });
    for (const [name, t] of Object.entries(weights)) xs[name] = b.param(name, { dtype: t.dtype, shape: t.shape });
    return body(b, xs);
  });
  return interpret(g, { inputs, weights });
}

/** Runs a single-output graph and returns its output. */
function run1(inputs: Readonly<Record<string, HostTensor>>, body: (b: GraphBuilder, x: Record<string, Value>) => Value): HostTensor {
  return run(inputs, body)['out']!;
}

/** A deterministic pseudo-random tensor with values in [−1, 1). */
function randomTensor(dtype: DType, shape: readonly number[], seed: number): HostTensor {
  const r = seededRandom(seed);
  return hostTensor(dtype, shape, Array.from({ length: sizeOf(shape) }, () => 2 * r() - 1));
}

describe('interpret', () => {
  describe('matmul', () => {
    const a = f32([2, 2], [1, 2, 3, 4]);
    const b = f32([2, 2], [5, 6, 7, 8]);
    test.each<[string, { transposeA?: boolean; transposeB?: boolean }, number[]]>([
      ['a·b', {}, [19, 22, 43, 50]],
      ['aᵀ·b', { transposeA: true }, [26, 30, 38, 44]],
      ['a·bᵀ', { transposeB: true }, [17, 23, 39, 53]],
      ['aᵀ·bᵀ', { transposeA: true, transposeB: true }, [23, 31, 34, 46]],
    ])('computes %s', (_what, attrs, want) => {
      const y = run1({ a, b }, (g, x) => g.matmul(x['a']!, x['b']!, attrs));
      expect(y).toBeAllclose(f32([2, 2], want));
    });

    test('transposes a non-square operand: [3, 2]ᵀ · [3, 1] = [2, 1]', () => {
      const y = run1({ a: f32([3, 2], [1, 2, 3, 4, 5, 6]), b: f32([3, 1], [1, 1, 1]) }, (g, x) => g.matmul(x['a']!, x['b']!, { transposeA: true }));
      expect(y).toBeAllclose(f32([2, 1], [9, 12]));
    });

    test('broadcasts batch dims: [2, 1, 1, 2] · [3, 2, 1] = [2, 3, 1, 1] with y[i, j] = a[i] · b[j]', () => {
      // a[i] = [i + 1, 1], b[j] = [j, 2]ᵀ, so y[i, j] = (i + 1)·j + 2.
      const a3 = f32([2, 1, 1, 2], [1, 1, 2, 1]);
      const b3 = f32([3, 2, 1], [0, 2, 1, 2, 2, 2]);
      const y = run1({ a: a3, b: b3 }, (g, x) => g.matmul(x['a']!, x['b']!));
      expect(y).toBeAllclose(f32([2, 3, 1, 1], [2, 3, 4, 2, 4, 6]));
    });

    test('rounds the f64 accumulation once to the result dtype (f16)', () => {
      // 1 + 2⁻¹¹ + 2⁻¹¹ = 1 + 2⁻¹⁰ is exact in f16, though 1 + 2⁻¹¹ alone is not.
      const y = run1({ a: T('f16', [1, 3], [1, 1, 1]), b: T('f32', [1], [0]) }, (g, x) =>
        g.matmul(x['a']!, g.constant([1, 2 ** -11, 2 ** -11], 'f16', [3, 1])),
      );
      expect(y).toBeAllclose(T('f16', [1, 1], [1 + 2 ** -10]), { rtol: 0, atol: 0 });
    });
  });

  describe('linear', () => {
    const x = f32([2, 3], [1, 2, 3, 4, 5, 6]);
    const w = f32([2, 3], [1, 0, -1, 0.5, 0.5, 0.5]);
    test('computes x·wᵀ', () => {
      expect(run({ x }, (g, v) => g.linear(v['x']!, v['w']!), { w })['out']!).toBeAllclose(f32([2, 2], [-2, 3, -2, 7.5]));
    });
    test('adds the bias to every row', () => {
      const bias = f32([2], [10, 20]);
      expect(run({ x }, (g, v) => g.linear(v['x']!, v['w']!, v['bias']), { w, bias })['out']!).toBeAllclose(f32([2, 2], [8, 23, 8, 27.5]));
    });
    test('maps a rank-1 x to a rank-1 y', () => {
      expect(run({ x: f32([3], [1, 2, 3]) }, (g, v) => g.linear(v['x']!, v['w']!), { w })['out']!).toBeAllclose(f32([2], [-2, 3]));
    });
  });

  describe('softmax', () => {
    test('is stable for large logits (softmax(x + c) = softmax(x))', () => {
      const want = [Math.exp(-2), Math.exp(-1), 1].map((e, _i, xs) => e / (xs[0]! + xs[1]! + xs[2]!));
      for (const c of [0, 1000, -1000]) {
        const y = run1({ x: f32([3], [c + 1, c + 2, c + 3]) }, (g, v) => g.softmax(v['x']!));
        expect(y).toBeAllclose(f32([3], want));
      }
    });
    test('normalizes along the requested axis', () => {
      const y = run1({ x: f64([2, 2], [0, 0, Math.log(3), 0]) }, (g, v) => g.softmax(v['x']!, 0));
      expect(y).toBeAllclose(f64([2, 2], [0.25, 0.5, 0.75, 0.5]));
    });
    test('gives −∞ logits zero weight', () => {
      const y = run1({ x: f32([3], [Number.NEGATIVE_INFINITY, 0, 0]) }, (g, v) => g.softmax(v['x']!));
      expect(y).toBeAllclose(f32([3], [0, 0.5, 0.5]));
    });
    test('gives NaN for a row that is entirely −∞ (as PyTorch)', () => {
      const y = run1({ x: f32([2], [Number.NEGATIVE_INFINITY, Number.NEGATIVE_INFINITY]) }, (g, v) => g.softmax(v['x']!));
      expect(y).toBeAllclose(f32([2], [Number.NaN, Number.NaN]));
    });
  });

  describe('rmsNorm', () => {
    test('divides by the root mean square of the last axis', () => {
      // mean(x²) = (9 + 16)/2 = 12.5
      const y = run1({ x: f64([2, 2], [3, 4, 0, 0]) }, (g, v) => g.rmsNorm(v['x']!, undefined, 0));
      expect(y).toBeAllclose(f64([2, 2], [3 / Math.sqrt(12.5), 4 / Math.sqrt(12.5), Number.NaN, Number.NaN]));
    });
    test('adds eps under the root and scales by the weight', () => {
      const y = run({ x: f64([2], [3, 4]) }, (g, v) => g.rmsNorm(v['x']!, v['w'], 1), { w: f64([2], [2, 0.5]) })['out']!;
      expect(y).toBeAllclose(f64([2], [6 / Math.sqrt(13.5), 2 / Math.sqrt(13.5)]));
    });
  });

  describe('layerNorm', () => {
    test('centers, scales by 1/√(var + ε), then applies weight and bias', () => {
      // mean 2.5, population variance 1.25
      const s = 1 / Math.sqrt(1.25 + 1e-5);
      const y = run({ x: f64([4], [1, 2, 3, 4]) }, (g, v) => g.layerNorm(v['x']!, v['w'], v['b']), {
        w: f64([4], [1, 1, 2, 2]),
        b: f64([4], [0, 0, 0, 1]),
      })['out']!;
      expect(y).toBeAllclose(f64([4], [-1.5 * s, -0.5 * s, 2 * 0.5 * s, 2 * 1.5 * s + 1]));
    });
    test('normalizes each row independently', () => {
      const y = run1({ x: f32([2, 2], [0, 2, 10, 30]) }, (g, v) => g.layerNorm(v['x']!, undefined, undefined, 0));
      expect(y).toBeAllclose(f32([2, 2], [-1, 1, -1, 1]));
    });
  });

  describe('gather', () => {
    const table = f32([3, 2], [0, 1, 10, 11, 20, 21]);
    test('takes rows at indices of any shape (embedding lookup)', () => {
      const y = run1({ table }, (g, v) => g.gather(v['table']!, g.constant([2, 0, 2, 1], 'i64', [2, 2])));
      expect(y).toBeAllclose(f32([2, 2, 2], [20, 21, 0, 1, 20, 21, 10, 11]));
    });
    test('takes columns along axis 1', () => {
      const y = run1({ table }, (g, v) => g.gather(v['table']!, g.constant([1, 1, 0], 'i32', [3]), 1));
      expect(y).toBeAllclose(f32([3, 3], [1, 1, 0, 11, 11, 10, 21, 21, 20]));
    });
    test.each([3, -1])('rejects index %d with IR_EVAL_ERROR pointing at the node', (bad) => {
      const e = expectCode(() => run1({ table }, (g, v) => g.gather(v['table']!, g.constant([0, bad], 'i64', [2]))), IrCode.EVAL_ERROR);
      expect(e.at).toMatchObject({ graph: 't', node: 2, value: 'gather' });
    });
  });

  describe('indexSelect', () => {
    test('selects and repeats entries along an axis', () => {
      const y = run1({ x: f32([2, 3], [1, 2, 3, 4, 5, 6]) }, (g, v) => g.indexSelect(v['x']!, g.constant([2, 2, 0], 'i64', [3]), 1));
      expect(y).toBeAllclose(f32([2, 3], [3, 3, 1, 6, 6, 4]));
    });
  });

  describe('scatterAdd', () => {
    test('accumulates repeated indices', () => {
      const y = run1({ x: f32([3, 2], [0, 0, 0, 0, 0, 0]), u: f32([3, 2], [1, 1, 2, 2, 3, 3]) }, (g, v) =>
        g.scatterAdd(v['x']!, g.constant([0, 2, 0], 'i64', [3]), v['u']!),
      );
      expect(y).toBeAllclose(f32([3, 2], [4, 4, 0, 0, 2, 2]));
    });
    test('adds along axis 1 onto the existing values', () => {
      const y = run1({ x: f32([2, 2], [1, 1, 1, 1]), u: f32([2, 3], [1, 2, 3, 4, 5, 6]) }, (g, v) =>
        g.scatterAdd(v['x']!, g.constant([1, 1, 0], 'i32', [3]), v['u']!, 1),
      );
      expect(y).toBeAllclose(f32([2, 2], [4, 4, 7, 10]));
    });
    test('rejects an out-of-range index with IR_EVAL_ERROR', () => {
      expectCode(
        () => run1({ x: f32([2], [0, 0]), u: f32([1], [1]) }, (g, v) => g.scatterAdd(v['x']!, g.constant([2], 'i64', [1]), v['u']!)),
        IrCode.EVAL_ERROR,
      );
    });
  });

  describe('topk', () => {
    const topk = (x: HostTensor, k: number, largest = true, axis = -1): [number[], number[]] => {
      const r = run({ x }, (g, v) => {
        const [values, indices] = g.topk(v['x']!, k, axis, largest);
        return { values, indices };
      });
      expect(r['indices']!.dtype).toBe('i64');
      return [toArray(r['values']!), toArray(r['indices']!)];
    };
    test('breaks ties by the lower index', () => {
      expect(topk(f32([5], [1, 3, 3, 2, 3]), 3)).toEqual([
        [3, 3, 3],
        [1, 2, 4],
      ]);
      expect(topk(f32([4], [2, 1, 1, 3]), 2, false)).toEqual([
        [1, 1],
        [1, 2],
      ]);
    });
    test('ranks NaN above every number, +∞ included (as torch.topk)', () => {
      expect(topk(f32([4], [1, Number.NaN, 5, Number.POSITIVE_INFINITY]), 2)).toEqual([
        [Number.NaN, Number.POSITIVE_INFINITY],
        [1, 3],
      ]);
      expect(topk(f32([3], [Number.NaN, Number.POSITIVE_INFINITY, 1]), 3, false)).toEqual([
        [1, Number.POSITIVE_INFINITY, Number.NaN],
        [2, 1, 0],
      ]);
    });
    test('works along a leading axis', () => {
      expect(topk(f32([3, 2], [1, 9, 5, 0, 3, 4]), 1, true, 0)).toEqual([
        [5, 9],
        [1, 0],
      ]);
    });
    test('gives empty results for k = 0', () => {
      expect(topk(f32([3], [1, 2, 3]), 0)).toEqual([[], []]);
    });
  });

  describe('attention', () => {
    /**
     * Naive reference: for each (batch, head h, query i), weights softmax_j(q·k_j·scale + mask)
     * over keys j visible under causal decode alignment (j ≤ i + tk − tq); head h reads kv head
     * ⌊h·hkv/hq⌋.
     */
    function naiveAttention(
      q: HostTensor,
      k: HostTensor,
      v: HostTensor,
      opts: { causal?: boolean; scale?: number; mask?: (h: number, i: number, j: number) => number } = {},
    ): HostTensor {
      const [nb, hq, tq, d] = q.shape as [number, number, number, number];
      const [, hkv, tk] = k.shape as [number, number, number, number];
      const dv = v.shape[3]!;
      const scale = opts.scale ?? 1 / Math.sqrt(d);
      const Q = (b: number, h: number, i: number, p: number): number => q.data[((b * hq + h) * tq + i) * d + p]!;
      const K = (b: number, h: number, j: number, p: number): number => k.data[((b * hkv + h) * tk + j) * d + p]!;
      const V = (b: number, h: number, j: number, p: number): number => v.data[((b * hkv + h) * tk + j) * dv + p]!;
      const out: number[] = [];
      for (let b = 0; b < nb; b++) {
        for (let h = 0; h < hq; h++) {
          const kh = Math.floor((h * hkv) / hq);
          for (let i = 0; i < tq; i++) {
            const logits: number[] = [];
            for (let j = 0; j < tk; j++) {
              if (opts.causal === true && j > i + tk - tq) {
                logits.push(Number.NEGATIVE_INFINITY);
                continue;
              }
              let s = 0;
              for (let p = 0; p < d; p++) s += Q(b, h, i, p) * K(b, kh, j, p);
              logits.push(s * scale + (opts.mask?.(h, i, j) ?? 0));
            }
            const m = Math.max(...logits);
            const e = logits.map((x) => Math.exp(x - m));
            const z = e.reduce((a, x) => a + x, 0);
            for (let p = 0; p < dv; p++) out.push(e.reduce((a, w, j) => a + (w / z) * V(b, kh, j, p), 0));
          }
        }
      }
      return hostTensor(q.dtype, [nb, hq, tq, dv], out);
    }

    test('aligns causal masking to the end when tq < tk (KV-cache decode)', () => {
      // q = 0 gives equal logits, so each query averages the rows of v it may see.
      const q = f64([1, 1, 2, 2], [0, 0, 0, 0]);
      const k = f64([1, 1, 3, 2], [1, 2, 3, 4, 5, 6]);
      const v = f64([1, 1, 3, 3], [1, 0, 0, 0, 1, 0, 0, 0, 1]);
      const y = run({ q }, (g, x) => g.attention(x['q']!, x['k']!, x['v']!, { causal: true }), { k, v })['out']!;
      // Query 0 sees keys 0..1, query 1 (the newest) sees keys 0..2.
      expect(y).toBeAllclose(f64([1, 1, 2, 3], [0.5, 0.5, 0, 1 / 3, 1 / 3, 1 / 3]));
    });

    test('lets a single decode query (tq = 1) see every key', () => {
      const q = f64([1, 1, 1, 1], [0]);
      const k = f64([1, 1, 4, 1], [1, 2, 3, 4]);
      const v = f64([1, 1, 4, 1], [1, 2, 3, 6]);
      expect(run({ q }, (g, x) => g.attention(x['q']!, x['k']!, x['v']!, { causal: true }), { k, v })['out']!).toBeAllclose(f64([1, 1, 1, 1], [3]));
    });

    test('maps query heads to kv heads in groups (GQA: heads 0,1 → kv 0; heads 2,3 → kv 1)', () => {
      const q = f64([1, 4, 1, 1], [0, 0, 0, 0]);
      const k = f64([1, 2, 2, 1], [0, 0, 0, 0]);
      const v = f64([1, 2, 2, 1], [1, 1, 2, 2]);
      expect(run({ q }, (g, x) => g.attention(x['q']!, x['k']!, x['v']!), { k, v })['out']!).toBeAllclose(f64([1, 4, 1, 1], [1, 1, 2, 2]));
    });

    test.each<[string, { causal: boolean; scale?: number }]>([
      ['non-causal', { causal: false }],
      ['causal', { causal: true }],
      ['causal with an explicit scale', { causal: true, scale: 0.3 }],
    ])('matches a naive GQA reference with tq < tk (%s)', (_what, attrs) => {
      const q = randomTensor('f64', [2, 4, 2, 3], 1);
      const k = randomTensor('f64', [2, 2, 5, 3], 2);
      const v = randomTensor('f64', [2, 2, 5, 2], 3);
      const y = run({ q }, (g, x) => g.attention(x['q']!, x['k']!, x['v']!, attrs), { k, v })['out']!;
      expect(y).toBeAllclose(naiveAttention(q, k, v, attrs));
    });

    test('applies an additive mask broadcast over heads, and a boolean mask as −∞', () => {
      const q = randomTensor('f64', [1, 2, 3, 2], 4);
      const k = randomTensor('f64', [1, 1, 3, 2], 5);
      const v = randomTensor('f64', [1, 1, 3, 2], 6);
      const additive = randomTensor('f64', [3, 3], 7);
      const y = run({ q }, (g, x) => g.attention(x['q']!, x['k']!, x['v']!, {}, x['m']), { k, v, m: additive })['out']!;
      expect(y).toBeAllclose(naiveAttention(q, k, v, { mask: (_h, i, j) => additive.data[i * 3 + j]! }));
      const keep = T('bool', [3, 3], [1, 0, 0, 1, 1, 0, 1, 1, 1]);
      const yb = run({ q }, (g, x) => g.attention(x['q']!, x['k']!, x['v']!, {}, x['m']), { k, v, m: keep })['out']!;
      expect(yb).toBeAllclose(naiveAttention(q, k, v, { causal: true }));
    });

    test('gives NaN for a query that may see no key (causal, tq > tk)', () => {
      const q = f64([1, 1, 2, 1], [1, 1]);
      const k = f64([1, 1, 1, 1], [1]);
      const v = f64([1, 1, 1, 1], [5]);
      expect(run({ q }, (g, x) => g.attention(x['q']!, x['k']!, x['v']!, { causal: true }), { k, v })['out']!).toBeAllclose(
        f64([1, 1, 2, 1], [Number.NaN, 5]),
      );
    });
  });

  describe('rotary', () => {
    const x = f32([4], [1, 2, 3, 4]);
    test.each<[string, boolean, number[]]>([
      ['rotates half-split pairs (x_i, x_{i+d/2})', false, [-3, -4, 1, 2]],
      ['rotates interleaved pairs (x_{2i}, x_{2i+1})', true, [-2, 1, -4, 3]],
    ])('%s by 90° when cos = 0, sin = 1', (_what, interleaved, want) => {
      const y = run1({ x, c: f32([4], [0, 0, 0, 0]), s: f32([4], [1, 1, 1, 1]) }, (g, v) => g.rotary(v['x']!, v['c']!, v['s']!, interleaved));
      expect(y).toBeAllclose(f32([4], want));
    });
    test('computes x·cos + rot(x)·sin with per-position tables broadcast over heads', () => {
      // x: [heads=2, seq=2, d=2]; cos/sin: [seq, d].
      const xs = f64([2, 2, 2], [1, 0, 0, 1, 2, 0, 0, 2]);
      const c = f64([2, 2], [0.6, 0.6, 0, 0]);
      const s = f64([2, 2], [0.8, 0.8, 1, 1]);
      const half = run1({ x: xs, c, s }, (g, v) => g.rotary(v['x']!, v['c']!, v['s']!));
      // position 0 rotates (a, b) → (0.6a − 0.8b, 0.6b + 0.8a); position 1 by 90°: (a, b) → (−b, a).
      expect(half).toBeAllclose(f64([2, 2, 2], [0.6, 0.8, -1, 0, 1.2, 1.6, -2, 0]));
    });
  });

  describe('slice', () => {
    const x = f32([10], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    test.each<[string, number, number | undefined, number, number[]]>([
      ['x[-3:]', -3, undefined, 1, [7, 8, 9]],
      ['x[1:-1:3]', 1, -1, 3, [1, 4, 7]],
      ['x[-100:100]', -100, 100, 1, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]],
      ['x[8:2] (empty)', 8, 2, 1, []],
      ['x[::4]', 0, undefined, 4, [0, 4, 8]],
      ['x[-4:-1:2]', -4, -1, 2, [6, 8]],
      ['x[10:]', 10, undefined, 1, []],
    ])('takes %s with Python semantics', (_what, start, end, step, want) => {
      const y = run1({ x }, (g, v) => g.slice(v['x']!, 0, start, end, step));
      expect(y).toBeAllclose(f32([want.length], want));
    });
    test('slices an inner axis', () => {
      const y = run1({ x: f32([2, 3], [1, 2, 3, 4, 5, 6]) }, (g, v) => g.slice(v['x']!, -1, -2));
      expect(y).toBeAllclose(f32([2, 2], [2, 3, 5, 6]));
    });
    test('evaluates symbolic bounds at the bound sizes', () => {
      const g = traceGraph('sym', (b) => b.slice(b.input('s', ['f32', ['seq']]), 0, 1, parseDim('seq - 1')));
      expect(interpret(g, { inputs: { s: f32([5], [0, 1, 2, 3, 4]) } })['out']).toBeAllclose(f32([3], [1, 2, 3]));
    });
  });

  describe('cast', () => {
    const cast = (from: DType, to: DType, values: readonly number[]): number[] =>
      toArray(run1({ x: T(from, [values.length], values) }, (g, v) => g.cast(v['x']!, to)));

    test('rounds to the nearest f16, ties to even, overflowing to ∞ and underflowing to 0', () => {
      expect(cast('f64', 'f16', [1 / 3, 65504, 65519, 65520, -70000, 2049, 2051, 1e-8, 3e-8, 2 ** -24])).toEqual([
        0.333251953125,
        65504,
        65504,
        Number.POSITIVE_INFINITY,
        Number.NEGATIVE_INFINITY,
        2048,
        2052,
        0,
        2 ** -24,
        2 ** -24,
      ]);
    });
    test('rounds to the nearest bf16, ties to even', () => {
      expect(cast('f32', 'bf16', [1 + 2 ** -8, 1 + 3 * 2 ** -8, 3.14159, -0.1])).toEqual([1, 1 + 2 ** -6, 3.140625, -0.10009765625]);
    });
    test('truncates toward zero into integers and wraps out-of-range values', () => {
      expect(cast('f64', 'i32', [2.7, -2.7, 2 ** 31, -(2 ** 31) - 1])).toEqual([2, -2, -(2 ** 31), 2 ** 31 - 1]);
      expect(cast('f64', 'i8', [127, 128, 130, -129, -128.9])).toEqual([127, -128, -126, 127, -128]);
      expect(cast('i32', 'u8', [255, 256, 300, -1])).toEqual([255, 0, 44, 255]);
      expect(cast('f64', 'i64', [2 ** 40 + 0.5, -3.9])).toEqual([2 ** 40, -3]);
    });
    test('maps non-zero to true and zero to false for bool, and back to 0/1', () => {
      expect(cast('f32', 'bool', [0, -0, 0.5, -2, Number.NaN])).toEqual([0, 0, 1, 1, 1]);
      expect(cast('bool', 'f32', [1, 0])).toEqual([1, 0]);
    });
  });

  describe('elementwise arithmetic', () => {
    test('wraps integer overflow in the result dtype (i8: 100 + 100 = −56)', () => {
      expect(run1({ a: T('i8', [1], [100]) }, (g, v) => g.add(v['a']!, v['a']!))).toBeAllclose(T('i8', [1], [-56]));
    });
    test('broadcasts [2, 1] against [3]', () => {
      const y = run1({ a: f32([2, 1], [1, 2]), b: f32([3], [10, 20, 30]) }, (g, v) => g.mul(v['a']!, v['b']!));
      expect(y).toBeAllclose(f32([2, 3], [10, 20, 30, 20, 40, 60]));
    });
    test('propagates NaN through maximum and minimum', () => {
      const y = run({ a: f32([2], [Number.NaN, 1]), b: f32([2], [0, Number.NaN]) }, (g, v) => [g.maximum(v['a']!, v['b']!), g.minimum(v['a']!, v['b']!)]);
      expect(y['out0']).toBeAllclose(f32([2], [Number.NaN, Number.NaN]));
      expect(y['out1']).toBeAllclose(f32([2], [Number.NaN, Number.NaN]));
    });
    test('computes exact and tanh-approximated GELU', () => {
      const x = f64([3], [-1, 0, 1]);
      expect(run1({ x }, (g, v) => g.gelu(v['x']!))).toBeAllclose(f64([3], [-0.15865525393145707, 0, 0.8413447460685429]), { rtol: 1e-6, atol: 1e-7 });
      expect(run1({ x }, (g, v) => g.gelu(v['x']!, 'tanh'))).toBeAllclose(f64([3], [-0.15880800939172324, 0, 0.8411919906082768]));
    });
    test('computes a sigmoid that does not overflow for large |x|', () => {
      expect(run1({ x: f64([3], [-800, 0, 800]) }, (g, v) => g.sigmoid(v['x']!))).toBeAllclose(f64([3], [0, 0.5, 1]));
    });
    test('selects with where, broadcasting the condition', () => {
      const y = run1({ c: T('bool', [2, 1], [1, 0]), a: f32([3], [1, 2, 3]) }, (g, v) => g.where(v['c']!, v['a']!, g.scalar(-1)));
      expect(y).toBeAllclose(f32([2, 3], [1, 2, 3, -1, -1, -1]));
    });
    test('compares into bool', () => {
      const y = run1({ a: f32([3], [1, 2, Number.NaN]) }, (g, v) => g.op('greaterEqual', [v['a']!, g.scalar(2)]));
      expect(y).toBeAllclose(T('bool', [3], [0, 1, 0]));
    });
  });

  describe('reductions', () => {
    const x = f32([2, 3], [1, 2, 3, 4, 5, 6]);
    test('sums over chosen axes, keeping dims on request', () => {
      expect(run1({ x }, (g, v) => g.sum(v['x']!, [1]))).toBeAllclose(f32([2], [6, 15]));
      expect(run1({ x }, (g, v) => g.sum(v['x']!, [0], true))).toBeAllclose(f32([1, 3], [5, 7, 9]));
      expect(run1({ x }, (g, v) => g.sum(v['x']!))).toBeAllclose(f32([], [21]));
    });
    test('takes means and maxima, with NaN propagating through max', () => {
      expect(run1({ x }, (g, v) => g.mean(v['x']!, [-1]))).toBeAllclose(f32([2], [2, 5]));
      expect(run1({ x: f32([3], [1, Number.NaN, 3]) }, (g, v) => g.max(v['x']!))).toBeAllclose(f32([], [Number.NaN]));
    });
    test('returns the first index of the maximum from argmax, NaN counting as the maximum', () => {
      expect(run1({ x: f32([2, 3], [1, 5, 5, 2, Number.NaN, 9]) }, (g, v) => g.argmax(v['x']!))).toBeAllclose(T('i64', [2], [1, 1]));
    });
  });

  describe('shape ops', () => {
    const x = f32([2, 3], [1, 2, 3, 4, 5, 6]);
    test('transposes', () => {
      expect(run1({ x }, (g, v) => g.transpose(v['x']!, [1, 0]))).toBeAllclose(f32([3, 2], [1, 4, 2, 5, 3, 6]));
    });
    test('reshapes row-major, inferring −1', () => {
      expect(run1({ x }, (g, v) => g.reshape(v['x']!, [3, -1]))).toBeAllclose(f32([3, 2], [1, 2, 3, 4, 5, 6]));
    });
    test('concatenates along an axis', () => {
      expect(run1({ x }, (g, v) => g.concat([v['x']!, g.constant(0, 'f32', [2, 1])], 1))).toBeAllclose(f32([2, 4], [1, 2, 3, 0, 4, 5, 6, 0]));
    });
    test('broadcasts to a larger shape', () => {
      expect(run1({ x: f32([2, 1], [1, 2]) }, (g, v) => g.broadcastTo(v['x']!, [2, 2, 2]))).toBeAllclose(f32([2, 2, 2], [1, 1, 2, 2, 1, 1, 2, 2]));
    });
    test('makes iotas along an axis of a symbolic shape', () => {
      const g = traceGraph('i', (b) => {
        b.input('x', ['f32', ['seq']]);
        return b.iota(['seq', 2], 0, 'i32');
      });
      expect(interpret(g, { inputs: { x: f32([3], [0, 0, 0]) } })['out']).toBeAllclose(T('i32', [3, 2], [0, 0, 1, 1, 2, 2]));
    });
  });

  describe('inputs and weights', () => {
    const g = traceGraph('io', (b) => b.add(b.input('x', ['f32', ['seq']]), b.param('w', ['f32', ['seq']])));
    const x = f32([2], [1, 2]);
    const w = f32([2], [10, 20]);

    test('reads parameters from a weight store or a plain record', () => {
      expect(interpret(g, { inputs: { x }, weights: { w } })['out']).toBeAllclose(f32([2], [11, 22]));
      expect(interpret(g, { inputs: { x }, weights: recordWeightStore({ w }) })['out']).toBeAllclose(f32([2], [11, 22]));
    });
    test('rejects a missing input with IR_MISSING_INPUT', () => {
      expectCode(() => interpret(g, { weights: { w } }), IrCode.MISSING_INPUT);
    });
    test('rejects a missing weight with IR_MISSING_WEIGHT', () => {
      const e = expectCode(() => interpret(g, { inputs: { x } }), IrCode.MISSING_WEIGHT);
      expect(e.at).toMatchObject({ value: 'w' });
    });
    test('does not read inherited properties of a weight record', () => {
      expectCode(() => interpret(traceGraph('p', (b) => b.param('toString', ['f32', []])), { weights: {} }), IrCode.MISSING_WEIGHT);
    });
    test('rejects a symbol bound to two sizes with IR_BINDING_MISMATCH', () => {
      expectCode(() => interpret(g, { inputs: { x }, weights: { w: f32([3], [1, 2, 3]) } }), IrCode.BINDING_MISMATCH);
    });
    test.each<[string, HostTensor]>([
      ['the wrong dtype', T('f64', [2], [1, 2])],
      ['the wrong rank', f32([1, 2], [1, 2])],
    ])('rejects an input of %s with IR_BINDING_MISMATCH', (_what, bad) => {
      expectCode(() => interpret(g, { inputs: { x: bad }, weights: { w } }), IrCode.BINDING_MISMATCH);
    });
    test('rejects data whose length disagrees with its shape with IR_BINDING_MISMATCH', () => {
      expectCode(() => interpret(g, { inputs: { x: { dtype: 'f32', shape: [2], data: new Float32Array(3) } }, weights: { w } }), IrCode.BINDING_MISMATCH);
    });
  });

  test('draws random ops from the seeded stream: same seed, same samples, all in [0, 1)', () => {
    for (const dtype of ['bf16', 'f16', 'f32', 'f64'] as const) {
      const g = traceGraph('r', (b) => b.op('randomUniform', [], { shape: [2048], dtype }));
      const a = interpret(g, { seed: 7 })['out']!;
      expect(interpret(g, { seed: 7 })['out']).toBeAllclose(a, { rtol: 0, atol: 0 });
      expect(interpret(g, { seed: 8 })['out']).not.toBeAllclose(a, { rtol: 0, atol: 0 });
      for (const seed of [1, 2, 3]) {
        const v = toArray(interpret(g, { seed })['out']!);
        expect(Math.min(...v)).toBeGreaterThanOrEqual(0);
        expect(Math.max(...v), dtype).toBeLessThan(1);
      }
    }
  });
});

describe('bindDims', () => {
  const t = (dtype: DType, shape: readonly (number | string)[]) => tensorType(dtype, shape);
  test('binds each symbol from the first simple dim that mentions it', () => {
    expect(
      bindDims([
        { name: 'x', type: t('f32', ['batch', 'seq']), value: f32([2, 3], [0, 0, 0, 0, 0, 0]) },
        { name: 'y', type: t('f32', ['2*seq']), value: f32([6], [0, 0, 0, 0, 0, 0]) },
      ]),
    ).toEqual({ batch: 2, seq: 3 });
  });
  test('rejects a compound dim that disagrees with the bound symbols', () => {
    expectCode(
      () =>
        bindDims([
          { name: 'x', type: t('f32', ['seq']), value: f32([3], [0, 0, 0]) },
          { name: 'y', type: t('f32', ['seq + 1']), value: f32([5], [0, 0, 0, 0, 0]) },
        ]),
      IrCode.BINDING_MISMATCH,
    );
  });
  test('rejects a symbol that only compound dims mention', () => {
    expectCode(() => bindDims([{ name: 'y', type: t('f32', ['2*seq']), value: f32([4], [0, 0, 0, 0]) }]), IrCode.BINDING_MISMATCH);
  });
  test('rejects a static dim of the wrong size', () => {
    expectCode(() => bindDims([{ name: 'x', type: t('f32', [3]), value: f32([2], [0, 0]) }]), IrCode.BINDING_MISMATCH);
  });
  test('starts from the given bindings', () => {
    expectCode(() => bindDims([{ name: 'x', type: t('f32', ['seq']), value: f32([2], [0, 0]) }], { seq: 3 }), IrCode.BINDING_MISMATCH);
  });
});

describe('seededRandom', () => {
  test('is deterministic per seed and stays in [0, 1)', () => {
    const a = seededRandom(42);
    const b = seededRandom(42);
    const xs = Array.from({ length: 1000 }, () => a());
    expect(Array.from({ length: 1000 }, () => b())).toEqual(xs);
    expect(xs.every((x) => x >= 0 && x < 1)).toBe(true);
    expect(seededRandom(43)()).not.toBe(xs[0]);
  });
});
