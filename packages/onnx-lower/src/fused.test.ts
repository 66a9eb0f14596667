import { type Graph, GraphBuilder, type HostTensor, interpret } from '@stageml/ir';
import * as ort from 'onnxruntime-node';
import { describe, expect, it } from 'vitest';

import { ONNX_FUSED_RULES, ONNX_RULES, type OnnxRuleTable, encodeOnnx, lowerToOnnx } from './index.js';

/** Uniform [−1, 1) from a 32-bit LCG. */
function rand(shape: readonly number[], seed: number): HostTensor {
  const n = shape.reduce((a, d) => a * d, 1);
  const data = new Float32Array(n);
  let s = (seed * 2654435761) >>> 0;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    data[i] = (s / 4294967296) * 2 - 1;
  }
  return { dtype: 'f32', shape: [...shape], data };
}

function i64(shape: readonly number[], values: readonly number[]): HostTensor {
  return { dtype: 'i64', shape: [...shape], data: Float64Array.from(values) } as unknown as HostTensor;
}

async function runOrt(graph: Graph, inputs: Record<string, HostTensor>, weights: Record<string, HostTensor>, rules: OnnxRuleTable): Promise<{ out: Record<string, Float32Array>; ops: string[]; names: string[] }> {
  const model = lowerToOnnx(graph, { weights, rules });
  const session = await ort.InferenceSession.create(encodeOnnx(model).model, { intraOpNumThreads: 1, graphOptimizationLevel: 'disabled' });
  const feeds: Record<string, ort.Tensor> = {};
  for (const [k, t] of Object.entries(inputs)) {
    feeds[k] = t.dtype === 'i64' ? new ort.Tensor('int64', BigInt64Array.from(Array.from(t.data as ArrayLike<number>, (v) => BigInt(v))), [...t.shape]) : new ort.Tensor('float32', t.data as Float32Array, [...t.shape]);
  }
  const res = await session.run(feeds);
  await session.release();
  return { out: Object.fromEntries(Object.entries(res).map(([k, v]) => [k, v.data as Float32Array])), ops: model.nodes.flatMap((n) => [n.opType, ...n.attribute.flatMap((a) => a.g?.node.map((m) => m.opType) ?? [])]), names: model.nodes.map((n) => n.name) };
}

function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  expect(a.length).toBe(b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

/** A Llama-style block fragment: rmsNorm, HF rotary tables from position ids, q/k rotated, residual add + rmsNorm. */
function block(heads: number, kvHeads: number, hd: number, opts: { interleaved?: boolean; oddTables?: boolean } = {}): Graph {
  const H = heads * hd;
  const b = new GraphBuilder('block');
  const x = b.input('x', ['f32', ['batch', 'seq', H]]);
  const r = b.input('r', ['f32', ['batch', 'seq', H]]);
  const pos = b.input('position_ids', ['i64', ['batch', 'seq']]);
  const inv = b.constant(Array.from({ length: hd / 2 }, (_, i) => 1 / 10000 ** ((2 * i) / hd)), 'f32', [hd / 2]);
  const freqs = b.mul(b.reshape(b.cast(pos, 'f32'), ['batch', 'seq', 1]), inv);
  // oddTables: the halves differ (freqs ‖ 2·freqs), so the fused op must not be used.
  const emb = b.reshape(b.concat([freqs, opts.oddTables === true ? b.mul(freqs, b.scalar(2)) : freqs], -1), ['batch', 1, 'seq', hd]);
  const cos = b.cos(emb);
  const sin = b.sin(emb);
  const normed = b.rmsNorm(x, b.param('w1', ['f32', [H]]), 1e-5);
  const q = b.transpose(b.reshape(normed, ['batch', 'seq', heads, hd]), [0, 2, 1, 3]);
  const k = b.transpose(b.reshape(b.slice(normed, -1, 0, kvHeads * hd), ['batch', 'seq', kvHeads, hd]), [0, 2, 1, 3]);
  b.output('q', b.rotary(q, cos, sin, opts.interleaved === true));
  b.output('k', b.rotary(k, cos, sin, opts.interleaved === true));
  const [sum, y] = b.skipRmsNorm(x, r, b.param('w2', ['f32', [H]]), 1e-5);
  b.output('sum', sum);
  b.output('y', y);
  return b.build();
}

const CASES = [
  { name: 'batch 1, seq 1 (decode), GQA 9/3', batch: 1, seq: 1, heads: 9, kv: 3, hd: 16, start: [37] },
  { name: 'batch 3, seq 5 (chunked prefill after a past), GQA 9/3, per-row offsets', batch: 3, seq: 5, heads: 9, kv: 3, hd: 16, start: [0, 11, 130] },
  { name: 'batch 2, seq 4, MHA 4/4, head dim 64', batch: 2, seq: 4, heads: 4, kv: 4, hd: 64, start: [3, 500] },
];

describe('fused lowerings match the interpreter on onnxruntime', () => {
  it.each(CASES)('$name', async ({ batch, seq, heads, kv, hd, start }) => {
    const H = heads * hd;
    const g = block(heads, kv, hd);
    const inputs = { x: rand([batch, seq, H], 1), r: rand([batch, seq, H], 2), position_ids: i64([batch, seq], start.flatMap((s) => Array.from({ length: seq }, (_, i) => s + i))) };
    const weights = { w1: rand([H], 3), w2: rand([H], 4) };
    const want = interpret(g, { inputs, weights });
    const fused = await runOrt(g, inputs, weights, ONNX_FUSED_RULES);
    expect(fused.ops).toContain('SimplifiedLayerNormalization');
    expect(fused.ops).toContain('SkipSimplifiedLayerNormalization');
    expect(fused.ops.filter((o) => o === 'RotaryEmbedding')).toHaveLength(2);
    expect(fused.ops).not.toContain('Neg');
    for (const name of ['q', 'k', 'sum', 'y']) expect(maxAbsDiff(fused.out[name]!, want[name]!.data), name).toBeLessThan(2e-5);
    // The default table keeps the default domain's decomposed forms.
    const std = await runOrt(g, inputs, weights, ONNX_RULES);
    expect(std.ops.some((o) => o.includes('Simplified') || o === 'RotaryEmbedding')).toBe(false);
    for (const name of ['q', 'k', 'sum', 'y']) expect(maxAbsDiff(std.out[name]!, want[name]!.data), name).toBeLessThan(2e-5);
  });

  it('keeps the decomposed rotary where the fused op would be wrong (interleaved pairs, unequal table halves)', async () => {
    for (const opts of [{ interleaved: true }, { oddTables: true }]) {
      const g = block(2, 2, 8, opts);
      const inputs = { x: rand([2, 3, 16], 5), r: rand([2, 3, 16], 6), position_ids: i64([2, 3], [0, 1, 2, 7, 8, 9]) };
      const weights = { w1: rand([16], 7), w2: rand([16], 8) };
      const want = interpret(g, { inputs, weights });
      const fused = await runOrt(g, inputs, weights, ONNX_FUSED_RULES);
      expect(fused.ops).not.toContain('RotaryEmbedding');
      for (const name of ['q', 'k']) expect(maxAbsDiff(fused.out[name]!, want[name]!.data), name).toBeLessThan(2e-5);
    }
  });

  it('lowers skipRmsNorm by its table entry only: an add + rmsNorm of primitives is never fused', async () => {
    const b = new GraphBuilder('primitives');
    const x = b.input('x', ['f32', ['n', 8]]);
    const r = b.input('r', ['f32', ['n', 8]]);
    b.output('y', b.rmsNorm(b.add(x, r), undefined, 1e-6));
    const g = b.build();
    const inputs = { x: rand([3, 8], 9), r: rand([3, 8], 10) };
    const fused = await runOrt(g, inputs, {}, ONNX_FUSED_RULES);
    expect(fused.ops).toContain('SimplifiedLayerNormalization');
    expect(fused.ops).not.toContain('SkipSimplifiedLayerNormalization');
    expect(maxAbsDiff(fused.out['y']!, interpret(g, { inputs, weights: {} })['y']!.data)).toBeLessThan(2e-5);
  });

  it('keeps the add and the norm for a skipRmsNorm the contrib op does not take (rank 4, f64)', async () => {
    for (const [dtype, shape] of [['f32', [2, 1, 3, 8]], ['f64', [3, 8]]] as const) {
      const b = new GraphBuilder('other');
      const [sum, y] = b.skipRmsNorm(b.input('x', [dtype, shape]), b.input('r', [dtype, shape]), undefined, 1e-6);
      b.output('sum', dtype === 'f64' ? b.cast(sum, 'f32') : sum);
      b.output('y', dtype === 'f64' ? b.cast(y, 'f32') : y);
      const g = b.build();
      const model = lowerToOnnx(g, { rules: ONNX_FUSED_RULES });
      expect(model.nodes.map((m) => m.opType)).not.toContain('SkipSimplifiedLayerNormalization');
      expect(model.nodes.map((m) => m.opType)).toContain('Add');
      if (dtype === 'f32') {
        const inputs = { x: rand(shape, 11), r: rand(shape, 12) };
        const fused = await runOrt(g, inputs, {}, ONNX_FUSED_RULES);
        const want = interpret(g, { inputs, weights: {} });
        for (const name of ['sum', 'y']) expect(maxAbsDiff(fused.out[name]!, want[name]!.data), name).toBeLessThan(2e-5);
      }
    }
  });

  /** The engine's attention: q/k/v projections [batch, seq, heads·d], a resident past [batch, past, kv, d], an additive mask. */
  function attn(heads: number, kv: number, d: number, opts: { cache?: boolean; perQuery?: boolean; causal?: boolean } = {}): Graph {
    const b = new GraphBuilder('attn');
    const cache = opts.cache ?? true;
    const keys = cache ? 'past + seq' : 'seq';
    const split = (x: string, n: number) => b.transpose(b.reshape(b.input(x, ['f32', ['batch', 'seq', n * d]]), ['batch', 'seq', n, d]), [0, 2, 1, 3]);
    const q = split('q', heads);
    let k = split('k', kv);
    let v = split('v', kv);
    if (cache) {
      k = b.concat([b.transpose(b.input('past_key', ['f32', ['batch', 'past', kv, d]]), [0, 2, 1, 3]), k], 2);
      v = b.concat([b.transpose(b.input('past_value', ['f32', ['batch', 'past', kv, d]]), [0, 2, 1, 3]), v], 2);
    }
    const mask = opts.perQuery === true ? b.reshape(b.input('mask', ['f32', ['batch', 'seq', keys]]), ['batch', 1, 'seq', -1]) : b.reshape(b.input('mask', ['f32', ['batch', keys]]), ['batch', 1, 1, -1]);
    const a = b.attention(q, k, v, { causal: opts.causal ?? true }, mask);
    b.output('y', b.reshape(b.transpose(a, [0, 2, 1, 3]), ['batch', 'seq', heads * d]));
    return b.build();
  }

  const ATTN = [
    { name: 'decode, batch 1, GQA 9/3, past 17', batch: 1, seq: 1, past: 17, heads: 9, kv: 3, d: 64 },
    { name: 'decode, batch 4 with padded rows, GQA 9/3', batch: 4, seq: 1, past: 9, heads: 9, kv: 3, d: 64, pad: true },
    { name: 'chunked prefill after a past, batch 2, GQA 32/4', batch: 2, seq: 5, past: 7, heads: 32, kv: 4, d: 16, pad: true },
    { name: 'first prefill chunk (empty past), GQA 4/2', batch: 1, seq: 6, past: 0, heads: 4, kv: 2, d: 16 },
    { name: 'per-query (sliding-window) mask, batch 2, seq 3', batch: 2, seq: 3, past: 6, heads: 4, kv: 2, d: 16, perQuery: true, pad: true },
    { name: 'no cache, batch 2, seq 4, MHA 4/4', batch: 2, seq: 4, past: 0, heads: 4, kv: 4, d: 32, cache: false },
  ];

  it.each(ATTN)('attention → GroupQueryAttention: $name', async (c) => {
    const cache = c.cache ?? true;
    const g = attn(c.heads, c.kv, c.d, { cache, perQuery: c.perQuery === true });
    const keys = cache ? c.past + c.seq : c.seq;
    const key = new Float32Array(c.batch * keys);
    // Padded rows: row r masks its first r keys (left padding), as the engine's staging does.
    if (c.pad === true) for (let r = 0; r < c.batch; r++) for (let j = 0; j < Math.min(r, c.past); j++) key[r * keys + j] = -1e9;
    const mask: HostTensor = c.perQuery === true
      ? { dtype: 'f32', shape: [c.batch, c.seq, keys], data: Float32Array.from({ length: c.batch * c.seq * keys }, (_, i) => (key[Math.floor(i / (c.seq * keys)) * keys + (i % keys)]! !== 0 || (i % keys) < ((Math.floor(i / keys) % c.seq) + c.past - 3) ? -1e9 : 0)) }
      : { dtype: 'f32', shape: [c.batch, keys], data: key };
    const inputs: Record<string, HostTensor> = { q: rand([c.batch, c.seq, c.heads * c.d], 11), k: rand([c.batch, c.seq, c.kv * c.d], 12), v: rand([c.batch, c.seq, c.kv * c.d], 13), mask };
    if (cache) {
      inputs['past_key'] = rand([c.batch, c.past, c.kv, c.d], 14);
      inputs['past_value'] = rand([c.batch, c.past, c.kv, c.d], 15);
    }
    const want = interpret(g, { inputs })['y']!.data;
    const fused = await runOrt(g, inputs, {}, ONNX_FUSED_RULES);
    expect(fused.ops).toContain('GroupQueryAttention');
    // With a cache and symbolic batch and seq, an If keeps the decomposed form for batch > 1 and
    // seq > 1 at once (onnxruntime's kernel refuses that with a past); this run takes the fused
    // branch unless both are > 1.
    expect(fused.ops.includes('If')).toBe(cache);
    if (!cache) expect(fused.ops).not.toContain('Softmax');
    // The KV concat is read as past and new halves; the dead concat is pruned.
    expect(fused.names.filter((n) => n.includes('(sml.concat)'))).toEqual([]);
    expect(maxAbsDiff(fused.out['y']!, want)).toBeLessThan(2e-5);
    const std = await runOrt(g, inputs, {}, ONNX_RULES);
    expect(std.ops).not.toContain('GroupQueryAttention');
    expect(maxAbsDiff(std.out['y']!, want)).toBeLessThan(2e-5);
  });

  it('keeps the decomposed attention when it is not causal, the head size is not a multiple of 8, or the mask does not name every key', async () => {
    const odd = attn(2, 1, 12);
    const oddIn = { q: rand([1, 1, 24], 31), k: rand([1, 1, 12], 32), v: rand([1, 1, 12], 33), past_key: rand([1, 4, 1, 12], 34), past_value: rand([1, 4, 1, 12], 35), mask: { dtype: 'f32', shape: [1, 5], data: new Float32Array(5) } as HostTensor };
    const oddRun = await runOrt(odd, oddIn, {}, ONNX_FUSED_RULES);
    expect(oddRun.ops).not.toContain('GroupQueryAttention');
    expect(maxAbsDiff(oddRun.out['y']!, interpret(odd, { inputs: oddIn })['y']!.data)).toBeLessThan(2e-5);
    const g = attn(4, 2, 16, { causal: false });
    const inputs = { q: rand([1, 2, 64], 1), k: rand([1, 2, 32], 2), v: rand([1, 2, 32], 3), past_key: rand([1, 3, 2, 16], 4), past_value: rand([1, 3, 2, 16], 5), mask: { dtype: 'f32', shape: [1, 5], data: new Float32Array(5) } as HostTensor };
    const fused = await runOrt(g, inputs, {}, ONNX_FUSED_RULES);
    expect(fused.ops).not.toContain('GroupQueryAttention');
    expect(maxAbsDiff(fused.out['y']!, interpret(g, { inputs })['y']!.data)).toBeLessThan(2e-5);
    // A per-query mask broadcast along the keys ([batch, 1, seq, 1]).
    const b = new GraphBuilder('bcast-mask');
    const x = (n: string, h: number) => b.transpose(b.reshape(b.input(n, ['f32', [1, 'seq', h * 16]]), [1, 'seq', h, 16]), [0, 2, 1, 3]);
    const m = b.reshape(b.input('mask', ['f32', [1, 'seq']]), [1, 1, 'seq', 1]);
    b.output('y', b.attention(x('q', 4), x('k', 2), x('v', 2), { causal: true }, m));
    const g2 = b.build();
    const in2 = { q: rand([1, 3, 64], 6), k: rand([1, 3, 32], 7), v: rand([1, 3, 32], 8), mask: { dtype: 'f32', shape: [1, 3], data: Float32Array.from([0, -1, 0.5]) } as HostTensor };
    const f2 = await runOrt(g2, in2, {}, ONNX_FUSED_RULES);
    expect(f2.ops).not.toContain('GroupQueryAttention');
    expect(maxAbsDiff(f2.out['y']!, interpret(g2, { inputs: in2 })['y']!.data)).toBeLessThan(2e-5);
  });

  it.each([
    { name: 'x [batch, seq, in], several rows, bias', shape: [2, 3, 24], bias: true },
    { name: 'x [batch, seq, in], one row (the If takes x·Wᵀ)', shape: [1, 1, 24], bias: false },
    { name: 'x [rows, in]', shape: [5, 24], bias: true },
    { name: 'x [in]', shape: [24], bias: false },
  ])('linear with a run-time weight → weight-major MatMul(W, xᵀ): $name', async ({ shape, bias }) => {
    const b = new GraphBuilder('wmajor');
    const sym = shape.length === 3 ? ['batch', 'seq', 24] : shape.length === 2 ? ['rows', 24] : [24];
    const x = b.input('x', ['f32', sym]);
    const w = b.input('w', ['f32', [10, 24]]);
    const p = b.param('p', ['f32', [10, 24]]);
    b.output('y', b.linear(x, w, bias ? b.param('bias', ['f32', [10]]) : undefined));
    // A parameter weight (prepacked by onnxruntime) keeps x·Wᵀ.
    b.output('z', b.linear(x, p));
    const g = b.build();
    const inputs = { x: rand(shape, 21), w: rand([10, 24], 22) };
    const weights = { p: rand([10, 24], 23), ...(bias ? { bias: rand([10], 24) } : {}) };
    const want = interpret(g, { inputs, weights });
    const fused = await runOrt(g, inputs, weights, ONNX_FUSED_RULES);
    // Symbolic rows: an If picks x·Wᵀ for one row at run time.
    expect(fused.ops.includes('If')).toBe(shape.length >= 2);
    for (const name of ['y', 'z']) expect(maxAbsDiff(fused.out[name]!, want[name]!.data), name).toBeLessThan(2e-5);
  });
});
