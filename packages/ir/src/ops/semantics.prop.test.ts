import { fc, test } from '@fast-check/vitest';
import { describe, expect } from 'vitest';

import { arbHostTensor } from '../../../testkit/src/index.js';
import { type GraphBuilder, type Value, traceGraph } from '../builder.js';
import type { DType } from '../dtype.js';
import { interpret } from '../interpret.js';
import { type HostTensor, hostTensor, sizeOf, stridesOf } from '../tensor.js';

/*
 * The reference interpreter is the project's numeric oracle, so its kernels are checked here
 * against naive definitions written index by index (one formula per op, no shared helpers with
 * the kernels) on random shapes. Data are f64 so tolerances are tight.
 */

const dim = (min = 1, max = 3): fc.Arbitrary<number> => fc.integer({ min, max });
const shapeArb = (minRank: number, maxRank: number, minDim = 1, maxDim = 3): fc.Arbitrary<number[]> =>
  fc.array(dim(minDim, maxDim), { minLength: minRank, maxLength: maxRank });
const data = (shape: readonly number[], dtype: DType = 'f64'): fc.Arbitrary<HostTensor> => arbHostTensor({ dtype, shape: [...shape] });

/** Every multi-index of `shape`, row-major. */
function* indices(shape: readonly number[]): Generator<number[]> {
  const n = sizeOf(shape);
  const idx = new Array<number>(shape.length).fill(0);
  for (let k = 0; k < n; k++) {
    yield [...idx];
    for (let ax = shape.length - 1; ax >= 0; ax--) {
      idx[ax]!++;
      if (idx[ax]! < shape[ax]!) break;
      idx[ax] = 0;
    }
  }
}

/** The element of `t` at a multi-index. */
function at(t: HostTensor, idx: readonly number[]): number {
  const st = stridesOf(t.shape);
  return t.data[idx.reduce((acc, i, ax) => acc + i * st[ax]!, 0)]!;
}

/** The element of `t` read at `idx` of a broadcast result shape (NumPy rules). */
function atBroadcast(t: HostTensor, idx: readonly number[]): number {
  const off = idx.length - t.shape.length;
  return at(
    t,
    t.shape.map((d, ax) => (d === 1 ? 0 : idx[off + ax]!)),
  );
}

/** A tensor whose element at each index is `f(index)`. */
function tensorOf(dtype: DType, shape: readonly number[], f: (idx: number[]) => number): HostTensor {
  return hostTensor(dtype, shape, Array.from(indices(shape), f));
}

/** A suffix of `shape` with some dims set to 1 (broadcasts against `shape`). */
const partnerShape = (shape: readonly number[]): fc.Arbitrary<number[]> =>
  fc
    .tuple(fc.integer({ min: 0, max: shape.length }), fc.array(fc.boolean(), { minLength: shape.length, maxLength: shape.length }))
    .map(([keep, ones]) => shape.slice(shape.length - keep).map((d, i) => (ones[i] === true ? 1 : d)));

/** Runs a graph over inputs named after the record keys and returns its single output. */
function run(inputs: Readonly<Record<string, HostTensor>>, body: (b: GraphBuilder, x: Record<string, Value>) => Value): HostTensor {
  const g = traceGraph('ref', (b) => {
    const xs: Record<string, Value> = {};
    for (const [name, t] of Object.entries(inputs)) xs[name] = b.input(name, { dtype: t.dtype, shape: t.shape });
    return body(b, xs);
  });
  return interpret(g, { inputs })['out']!;
}

describe('interpret agrees with naive index-by-index definitions', () => {
  test.prop([
    fc
      .record({ batch: shapeArb(0, 2), m: dim(), k: dim(0, 3), n: dim(), ta: fc.boolean(), tb: fc.boolean(), fullLeft: fc.boolean() })
      .chain((p) => partnerShape(p.batch).map((other) => ({ ...p, other })))
      .chain((p) => {
        const lb = p.fullLeft ? p.batch : p.other;
        const rb = p.fullLeft ? p.other : p.batch;
        const a = [...lb, ...(p.ta ? [p.k, p.m] : [p.m, p.k])];
        const b = [...rb, ...(p.tb ? [p.n, p.k] : [p.k, p.n])];
        return fc.tuple(fc.constant(p), data(a), data(b));
      }),
  ])('matmul with transpose flags and broadcast batch dims', ([p, a, b]) => {
    const y = run({ a, b }, (g, x) => g.matmul(x['a']!, x['b']!, { transposeA: p.ta, transposeB: p.tb }));
    const want = tensorOf('f64', [...p.batch, p.m, p.n], (idx) => {
      const bi = idx.slice(0, -2);
      const [i, j] = idx.slice(-2) as [number, number];
      let s = 0;
      for (let q = 0; q < p.k; q++) {
        s += atBroadcast(a, [...bi, ...(p.ta ? [q, i] : [i, q])]) * atBroadcast(b, [...bi, ...(p.tb ? [j, q] : [q, j])]);
      }
      return s;
    });
    expect(y).toBeAllclose(want);
  });

  test.prop([
    fc
      .record({
        batch: shapeArb(0, 2, 1, 2),
        hkv: dim(1, 2),
        group: dim(1, 2),
        tq: dim(1, 3),
        tk: dim(1, 4),
        d: dim(1, 3),
        dv: dim(1, 3),
        causal: fc.boolean(),
        scale: fc.option(fc.constantFrom(0.5, 2), { nil: undefined }),
        mask: fc.constantFrom('none', 'bool', 'add'),
      })
      .chain((p) => {
        const hq = p.hkv * p.group;
        const scores = [...p.batch, hq, p.tq, p.tk];
        return fc.tuple(
          fc.constant({ ...p, hq }),
          data([...p.batch, hq, p.tq, p.d]),
          data([...p.batch, p.hkv, p.tk, p.d]),
          data([...p.batch, p.hkv, p.tk, p.dv]),
          partnerShape(scores).chain((ms) => data(ms, p.mask === 'bool' ? 'bool' : 'f64')),
        );
      }),
  ])('attention with GQA, decode-aligned causal masking and broadcast masks', ([p, q, k, v, mask]) => {
    const useMask = p.mask !== 'none';
    const attrs = p.scale === undefined ? { causal: p.causal } : { causal: p.causal, scale: p.scale };
    const y = run(useMask ? { q, k, v, m: mask } : { q, k, v }, (g, x) => g.attention(x['q']!, x['k']!, x['v']!, attrs, x['m']));
    const scale = p.scale ?? 1 / Math.sqrt(p.d);
    const rows = new Map<string, number[]>();
    const want = tensorOf('f64', [...p.batch, p.hq, p.tq, p.dv], (idx) => {
      const b = idx.slice(0, p.batch.length);
      const [h, i, c] = idx.slice(p.batch.length) as [number, number, number];
      const kh = Math.floor(h / p.group);
      const key = [...b, h, i].join(',');
      let w = rows.get(key);
      if (w === undefined) {
        const logits = Array.from({ length: p.tk }, (_, j) => {
          if (p.causal && j > i + p.tk - p.tq) return Number.NEGATIVE_INFINITY;
          let s = 0;
          for (let r = 0; r < p.d; r++) s += at(q, [...b, h, i, r]) * at(k, [...b, kh, j, r]);
          s *= scale;
          if (p.mask === 'add') s += atBroadcast(mask, [...b, h, i, j]);
          if (p.mask === 'bool' && atBroadcast(mask, [...b, h, i, j]) === 0) s = Number.NEGATIVE_INFINITY;
          return s;
        });
        const m = Math.max(...logits);
        const e = logits.map((l) => (m === Number.NEGATIVE_INFINITY ? Number.NaN : Math.exp(l - m)));
        const z = e.reduce((acc, x) => acc + x, 0);
        w = e.map((x) => x / z);
        rows.set(key, w);
      }
      return w.reduce((acc, wj, j) => acc + (wj === 0 ? 0 : wj * at(v, [...b, kh, j, c])), 0);
    });
    expect(y).toBeAllclose(want);
  });

  test.prop([
    fc.record({ n: dim(0, 4), k: dim(0, 3), m: dim(), e: dim(1, 3), transposeW: fc.boolean() }).chain((p) =>
      fc.tuple(
        fc.constant(p),
        data([p.n, p.k]),
        data(p.transposeW ? [p.e, p.m, p.k] : [p.e, p.k, p.m]),
        fc.array(fc.integer({ min: 0, max: p.e - 1 }), { minLength: p.n, maxLength: p.n }),
      ),
    ),
  ])('groupedMatmul multiplies each row by the matrix of its group', ([p, x, w, groups]) => {
    const g = hostTensor('i32', [p.n], groups);
    const y = run({ x, w, g }, (b, v) => b.op('groupedMatmul', [v['x']!, v['w']!, v['g']!], { transposeW: p.transposeW }));
    const want = tensorOf('f64', [p.n, p.m], ([r, j]) => {
      let s = 0;
      for (let q = 0; q < p.k; q++) s += at(x, [r!, q]) * at(w, p.transposeW ? [groups[r!]!, j!, q] : [groups[r!]!, q, j!]);
      return s;
    });
    expect(y).toBeAllclose(want);
  });

  test.prop([
    shapeArb(1, 3, 0, 5).chain((shape) =>
      fc.tuple(
        fc.constant(shape),
        fc.integer({ min: 0, max: shape.length - 1 }),
        fc.integer({ min: -7, max: 7 }),
        fc.option(fc.integer({ min: -7, max: 7 }), { nil: undefined }),
        fc.integer({ min: 1, max: 3 }),
        data(shape),
      ),
    ),
  ])('slice with Python semantics (negative bounds, clamping, steps)', ([shape, axis, start, end, step, x]) => {
    const n = shape[axis]!;
    // Python's slice.indices for a positive step.
    const clamp = (v: number): number => (v < 0 ? Math.max(v + n, 0) : Math.min(v, n));
    const picked: number[] = [];
    for (let i = clamp(start); i < (end === undefined ? n : clamp(end)); i += step) picked.push(i);
    const y = run({ x }, (g, v) => g.slice(v['x']!, axis, start, end, step));
    const outShape = shape.map((d, ax) => (ax === axis ? picked.length : d));
    expect(y).toBeAllclose(tensorOf('f64', outShape, (idx) => at(x, idx.map((i, ax) => (ax === axis ? picked[i]! : i)))));
  });

  test.prop([
    shapeArb(1, 3, 1, 5).chain((shape) =>
      fc.tuple(
        fc.constant(shape),
        fc.integer({ min: 0, max: shape.length - 1 }),
        fc.boolean(),
        // Few distinct values so ties are common; NaN and ±∞ now and then.
        fc
          .array(fc.constantFrom(0, 1, 2, -1, Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY), { minLength: sizeOf(shape), maxLength: sizeOf(shape) })
          .map((vals) => hostTensor('f32', shape, vals)),
      ),
    ).chain(([shape, axis, largest, x]) => fc.tuple(fc.constant({ shape, axis, largest, x }), fc.integer({ min: 0, max: shape[axis]! }))),
  ])('topk: a stable sort with NaN above +∞, lower index first among ties', ([{ shape, axis, largest, x }, k]) => {
    const g = traceGraph('topk', (b) => {
      const [values, idx] = b.topk(b.input('x', { dtype: 'f32', shape }), k, axis, largest);
      return { values, idx };
    });
    const out = interpret(g, { inputs: { x } });
    const rank = (v: number): [number, number] => (Number.isNaN(v) ? [1, 0] : [0, v]);
    const outShape = shape.map((d, ax) => (ax === axis ? k : d));
    const order = (idx: number[]): number[] => {
      const lane = Array.from({ length: shape[axis]! }, (_, j) => j);
      const val = (j: number): number => at(x, idx.map((i, ax) => (ax === axis ? j : i)));
      return lane.sort((p, q) => {
        const [np, vp] = rank(val(p));
        const [nq, vq] = rank(val(q));
        const cmp = np !== nq ? np - nq : vp === vq ? 0 : vp < vq ? -1 : 1;
        return (largest ? -cmp : cmp) || p - q;
      });
    };
    const wantIdx = tensorOf('i64', outShape, (idx) => order(idx)[idx[axis]!]!);
    expect(out['idx']).toBeAllclose(wantIdx);
    expect(out['values']).toBeAllclose(tensorOf('f32', outShape, (idx) => at(x, idx.map((i, ax) => (ax === axis ? at(wantIdx, idx) : i)))));
  });

  test.prop([
    fc
      .tuple(shapeArb(1, 3), shapeArb(0, 2))
      .chain(([shape, idxShape]) =>
        fc.integer({ min: 0, max: shape.length - 1 }).chain((axis) =>
          fc.tuple(
            fc.constant({ shape, idxShape, axis }),
            data(shape),
            fc
              .array(fc.integer({ min: 0, max: shape[axis]! - 1 }), { minLength: sizeOf(idxShape), maxLength: sizeOf(idxShape) })
              .map((v) => hostTensor('i32', idxShape, v)),
          ),
        ),
      ),
  ])('gather takes table slices at indices of any shape', ([{ shape, idxShape, axis }, t, idx]) => {
    const y = run({ t, idx }, (g, x) => g.gather(x['t']!, x['idx']!, axis));
    const outShape = [...shape.slice(0, axis), ...idxShape, ...shape.slice(axis + 1)];
    const want = tensorOf('f64', outShape, (o) => {
      const row = at(idx, o.slice(axis, axis + idxShape.length));
      return at(t, [...o.slice(0, axis), row, ...o.slice(axis + idxShape.length)]);
    });
    expect(y).toBeAllclose(want);
  });

  test.prop([
    shapeArb(1, 3).chain((shape) =>
      fc.integer({ min: 0, max: shape.length - 1 }).chain((axis) =>
        fc.integer({ min: 0, max: 4 }).chain((n) =>
          fc.tuple(
            fc.constant({ shape, axis, n }),
            data(shape),
            fc.array(fc.integer({ min: 0, max: shape[axis]! - 1 }), { minLength: n, maxLength: n }),
            data(shape.map((d, ax) => (ax === axis ? n : d))),
          ),
        ),
      ),
    ),
  ])('indexSelect selects and scatterAdd accumulates along an axis', ([{ shape, axis, n }, x, index, updates]) => {
    const idx = hostTensor('i64', [n], index);
    const selected = run({ x, idx }, (g, v) => g.indexSelect(v['x']!, v['idx']!, axis));
    expect(selected).toBeAllclose(tensorOf('f64', shape.map((d, ax) => (ax === axis ? n : d)), (o) => at(x, o.map((i, ax) => (ax === axis ? index[i]! : i)))));
    const scattered = run({ x, idx, u: updates }, (g, v) => g.scatterAdd(v['x']!, v['idx']!, v['u']!, axis));
    const want = tensorOf('f64', shape, (o) => {
      let s = at(x, o);
      index.forEach((row, j) => {
        if (row === o[axis]) s += at(updates, o.map((i, ax) => (ax === axis ? j : i)));
      });
      return s;
    });
    expect(scattered).toBeAllclose(want);
  });

  test.prop([
    shapeArb(0, 3).chain((shape) =>
      fc.tuple(
        fc.constant(shape),
        fc.subarray(shape.map((_, i) => i)),
        fc.boolean(),
        fc.constantFrom('sum' as const, 'mean' as const, 'max' as const),
        data(shape),
      ),
    ),
  ])('sum, mean and max over any subset of axes', ([shape, axesIn, keepDims, op, x]) => {
    const axes = axesIn.length === 0 ? shape.map((_, i) => i) : axesIn;
    const y = run({ x }, (g, v) => g.op(op, [v['x']!], { axes: axesIn, keepDims }));
    const outShape = shape.flatMap((d, ax) => (axes.includes(ax) ? (keepDims ? [1] : []) : [d]));
    const want = tensorOf('f64', outShape, (o) => {
      const kept = shape.flatMap((_, ax) => (axes.includes(ax) ? [] : [ax]));
      const fixed = new Map<number, number>();
      let k = 0;
      shape.forEach((_, ax) => {
        if (!axes.includes(ax)) fixed.set(ax, o[keepDims ? ax : k++]!);
      });
      expect(fixed.size).toBe(kept.length);
      const vals = [...indices(axes.map((ax) => shape[ax]!))].map((r) => at(x, shape.map((_, ax) => fixed.get(ax) ?? r[axes.indexOf(ax)]!)));
      if (op === 'max') return Math.max(...vals);
      const s = vals.reduce((a, b) => a + b, 0);
      return op === 'sum' ? s : s / vals.length;
    });
    expect(y).toBeAllclose(want);
  });

  test.prop([shapeArb(1, 3).chain((shape) => fc.tuple(fc.constant(shape), fc.integer({ min: 0, max: shape.length - 1 }), data(shape)))])(
    'softmax and argmax along an axis',
    ([shape, axis, x]) => {
      const lane = (o: number[]): number[] => Array.from({ length: shape[axis]! }, (_, j) => at(x, o.map((i, ax) => (ax === axis ? j : i))));
      const y = run({ x }, (g, v) => g.softmax(v['x']!, axis));
      expect(y).toBeAllclose(
        tensorOf('f64', shape, (o) => {
          const l = lane(o);
          const m = Math.max(...l);
          return Math.exp(at(x, o) - m) / l.reduce((acc, v) => acc + Math.exp(v - m), 0);
        }),
      );
      const am = run({ x }, (g, v) => g.argmax(v['x']!, axis, true));
      expect(am).toBeAllclose(
        tensorOf('i64', shape.map((d, ax) => (ax === axis ? 1 : d)), (o) => {
          const l = lane(o);
          return l.indexOf(Math.max(...l));
        }),
      );
    },
  );

  test.prop([
    fc
      .tuple(shapeArb(0, 2), dim(1, 3), fc.boolean(), fc.boolean())
      .chain(([lead, half, interleaved, norm]) => {
        const shape = [...lead, 2 * half];
        return fc.tuple(fc.constant({ shape, interleaved, norm }), data(shape), partnerShape(shape).chain((cs) => fc.tuple(data(cs), data(cs))), data([2 * half]));
      }),
  ])('rotary (half-split and interleaved) and the norms over the last axis', ([{ shape, interleaved }, x, [c, s], w]) => {
    const d = shape[shape.length - 1]!;
    const half = d / 2;
    const y = run({ x, c, s }, (g, v) => g.rotary(v['x']!, v['c']!, v['s']!, interleaved));
    const want = tensorOf('f64', shape, (o) => {
      const j = o[o.length - 1]!;
      const other = (jj: number): number => at(x, [...o.slice(0, -1), jj]);
      const partner = interleaved ? (j % 2 === 0 ? -other(j + 1) : other(j - 1)) : j < half ? -other(j + half) : other(j - half);
      return at(x, o) * atBroadcast(c, o) + partner * atBroadcast(s, o);
    });
    expect(y).toBeAllclose(want);

    const lastLane = (o: number[]): number[] => Array.from({ length: d }, (_, j) => at(x, [...o.slice(0, -1), j]));
    const rms = run({ x, w }, (g, v) => g.rmsNorm(v['x']!, v['w'], 1e-5));
    expect(rms).toBeAllclose(
      tensorOf('f64', shape, (o) => {
        const l = lastLane(o);
        return (at(x, o) / Math.sqrt(l.reduce((acc, v) => acc + v * v, 0) / d + 1e-5)) * at(w, [o[o.length - 1]!]);
      }),
    );
    const ln = run({ x, w }, (g, v) => g.layerNorm(v['x']!, v['w'], v['w'], 1e-5));
    expect(ln).toBeAllclose(
      tensorOf('f64', shape, (o) => {
        const l = lastLane(o);
        const mu = l.reduce((acc, v) => acc + v, 0) / d;
        const variance = l.reduce((acc, v) => acc + (v - mu) ** 2, 0) / d;
        const wj = at(w, [o[o.length - 1]!]);
        return ((at(x, o) - mu) / Math.sqrt(variance + 1e-5)) * wj + wj;
      }),
    );
  });

  test.prop([
    shapeArb(1, 3, 0, 3).chain((shape) =>
      fc.tuple(
        fc.constant(shape),
        fc.shuffledSubarray(
          shape.map((_, i) => i),
          { minLength: shape.length, maxLength: shape.length },
        ),
        fc.integer({ min: 0, max: shape.length - 1 }),
        dim(0, 2),
        data(shape),
      ),
    ).chain(([shape, perm, axis, extra, x]) => fc.tuple(fc.constant({ shape, perm, axis }), fc.constant(x), data(shape.map((d, ax) => (ax === axis ? extra : d))))),
  ])('transpose, concat and broadcastTo move elements as their index maps say', ([{ shape, perm, axis }, x, y]) => {
    const t = run({ x }, (g, v) => g.transpose(v['x']!, perm));
    expect(t).toBeAllclose(
      tensorOf('f64', perm.map((p) => shape[p]!), (o) => {
        const src = new Array<number>(shape.length);
        perm.forEach((p, i) => (src[p] = o[i]!));
        return at(x, src);
      }),
    );
    const n = shape[axis]!;
    const cat = run({ x, y }, (g, v) => g.concat([v['x']!, v['y']!], axis));
    expect(cat).toBeAllclose(
      tensorOf('f64', shape.map((d, ax) => (ax === axis ? d + y.shape[axis]! : d)), (o) =>
        o[axis]! < n ? at(x, o) : at(y, o.map((i, ax) => (ax === axis ? i - n : i))),
      ),
    );
    const target = [2, ...shape];
    expect(run({ x }, (g, v) => g.broadcastTo(v['x']!, target))).toBeAllclose(tensorOf('f64', target, (o) => atBroadcast(x, o)));
  });
});
