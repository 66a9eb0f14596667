import { type Dim, type Graph, type ValueId, dimDivExact, dimEquals, dimMul, dimProduct, normalizeAxis } from '@stageml/ir';

import { ElemType } from './dtypes.js';
import { subgraphProto } from './proto.js';
import { type LowerContext, lowering } from './rule.js';
import { linear as decomposedLinear, rmsNorm as decomposedRmsNorm } from './rules-linalg.js';
import { attention as decomposedAttention, rotary as decomposedRotary } from './rules-nn.js';

/**
 * rmsNorm as one onnxruntime `SimplifiedLayerNormalization` node (default domain, an onnxruntime
 * contrib op: x · 1/√(mean(x²) + ε) · w over the last axis, accumulated in f32). f32 with a
 * weight of the last axis' size (or none and a static last axis: a ones scale); other cases keep
 * the decomposed lowering (f64 above all: the fused kernel loses double precision).
 */
export const rmsNormFused = lowering<'rmsNorm'>((ctx) => {
  const { b, inputs, operands, attrs } = ctx;
  const x = operands[0]!;
  const d = b.resolve(x.shape[x.shape.length - 1]!);
  const w = operands[1];
  const weightOk = w === undefined ? typeof d === 'number' : w.dtype === 'f32' && w.shape.length === 1 && dimEquals(b.resolve(w.shape[0]!), d);
  if (x.dtype !== 'f32' || !weightOk) return decomposedRmsNorm.lower(ctx);
  const scale = inputs[1] ?? b.constant(ElemType.FLOAT, [d as number], new Array<number>(d as number).fill(1));
  return [b.op('SimplifiedLayerNormalization', [inputs[0]!, scale], { axis: -1, epsilon: { float: attrs.eps }, stash_type: 1 })];
});

/**
 * skipRmsNorm as one onnxruntime `com.microsoft` SkipSimplifiedLayerNormalization node (input x,
 * skip residual, gamma w; outputs the normed value and, fourth, input + skip: the residual stream).
 * f32 x and residual of rank 2 or 3 (what the kernel takes; the IR op already requires one shape)
 * with a weight `rmsNormFused` would take; other cases keep the decomposed lowering (`add`, then
 * `rmsNormFused`, itself falling back to the decomposed norm).
 */
export const skipRmsNormFused = lowering<'skipRmsNorm'>((ctx) => {
  const { b, inputs, operands, attrs } = ctx;
  const x = operands[0]!;
  const d = b.resolve(x.shape[x.shape.length - 1]!);
  const w = operands[2];
  const weightOk = w === undefined ? typeof d === 'number' : w.dtype === 'f32' && w.shape.length === 1 && dimEquals(b.resolve(w.shape[0]!), d);
  if (x.dtype !== 'f32' || (x.shape.length !== 2 && x.shape.length !== 3) || !weightOk) {
    const sum = b.op('Add', [inputs[0]!, inputs[1]!]);
    const normed = rmsNormFused.lower({ b, attrs, inputs: [sum, ...inputs.slice(2)], operands: [x, ...operands.slice(2)], results: [ctx.results[1]!] })[0]!;
    return [sum, normed];
  }
  const scale = inputs[2] ?? b.constant(ElemType.FLOAT, [d as number], new Array<number>(d as number).fill(1));
  const [y, , , sum] = b.msEmit('SkipSimplifiedLayerNormalization', [inputs[0]!, inputs[1]!, scale], { epsilon: { float: attrs.eps } }, 4);
  return [sum!, y!];
});

/** Ops that map each element of the last axis on its own (so equal halves stay equal). */
const PER_ELEMENT = new Set(['cos', 'sin', 'neg', 'cast', 'abs']);

/**
 * Whether value `v` (last axis of width `width`) provably has equal halves along its last axis:
 * it is `concat([f, f], last)` of one value f, seen through per-element unary ops and reshapes or
 * broadcasts that keep the last axis (`cos(reshape(concat([f, f], -1)))`, how HF-style rotary
 * tables are built).
 */
export function hasEqualHalves(graph: Graph, v: ValueId, width: Dim): boolean {
  for (let cur = v, depth = 0; depth < 64; depth++) {
    const info = graph.values[cur]!;
    const node = graph.nodes[info.node]!;
    if (node.kind !== 'op') return false;
    const rank = info.type.shape.length;
    if (!dimEquals(info.type.shape[rank - 1]!, width)) return false;
    if (PER_ELEMENT.has(node.op) || node.op === 'reshape' || node.op === 'broadcastTo') {
      const src = graph.values[node.operands[0]!]!.type.shape;
      if (src.length === 0 || !dimEquals(src[src.length - 1]!, width)) return false;
      cur = node.operands[0]!;
      continue;
    }
    if (node.op !== 'concat' || node.operands.length !== 2 || node.operands[0] !== node.operands[1]) return false;
    return normalizeAxis(node.attrs['axis'] as number, rank) === rank - 1;
  }
  return false;
}

/**
 * rotary as one onnxruntime `com.microsoft` RotaryEmbedding node, when its semantics provably
 * match the IR's: half-split pairs (not interleaved), f32, x of rank 4 [batch, heads, seq, d] and
 * cos/sin tables [batch, 1, seq, d] whose two halves are equal (`hasEqualHalves`: RotaryEmbedding
 * applies one angle per pair, the IR one per element). The tables' first halves become the op's
 * caches, flattened to [batch·seq, d/2], and position_ids index row b·seq + s. Anything else keeps
 * the decomposed lowering.
 */
export const rotaryFused = lowering<'rotary'>((ctx: LowerContext<'rotary'>) => {
  const { b, inputs, operands, attrs, source } = ctx;
  const [x, c, s] = operands as [(typeof operands)[number], (typeof operands)[number], (typeof operands)[number]];
  const fallback = (): readonly string[] => decomposedRotary.lower(ctx);
  if (attrs.interleaved || x.dtype !== 'f32' || x.shape.length !== 4 || source === undefined) return fallback();
  const [batch, , seq, d] = x.shape.map((v) => b.resolve(v)) as [Dim, Dim, Dim, Dim];
  const half = dimDivExact(d, 2);
  const tableOk = (t: typeof c): boolean =>
    t.shape.length === 4 && dimEquals(b.resolve(t.shape[0]!), batch) && dimEquals(b.resolve(t.shape[1]!), 1) && dimEquals(b.resolve(t.shape[2]!), seq) && dimEquals(b.resolve(t.shape[3]!), d);
  const { graph, node } = source;
  if (half === undefined || typeof half !== 'number' || !tableOk(c) || !tableOk(s)) return fallback();
  const width = graph.values[node.operands[1]!]!.type.shape[3]!;
  if (!hasEqualHalves(graph, node.operands[1]!, width) || !hasEqualHalves(graph, node.operands[2]!, width)) return fallback();
  const cache = (t: string): string => b.op('Reshape', [b.op('Slice', [t, b.int64s([0]), b.int64s([half]), b.int64s([-1])]), b.int64s([-1, half])]);
  const rows = b.op('Range', [b.scalar(0, ElemType.INT64), b.dimScalar(dimMul(batch, seq)), b.scalar(1, ElemType.INT64)]);
  const positions = b.op('Reshape', [rows, b.shape([batch, seq])]);
  return [b.msOp('RotaryEmbedding', [inputs[0]!, positions, cache(inputs[1]!), cache(inputs[2]!)], { interleaved: 0 })];
});

/**
 * The past and new halves of attention keys or values `v` [.., heads, past + seq, d] when the IR
 * built them as `concat([past, new], seq axis)` with `new` of `seq` rows and both lowered already:
 * their tensor names; undefined otherwise.
 */
function pastAndNew(ctx: LowerContext<'attention'>, v: ValueId, seq: Dim): { past: string; fresh: string } | undefined {
  const { graph, nameOf } = ctx.source!;
  const node = graph.nodes[graph.values[v]!.node]!;
  if (node.kind !== 'op' || node.op !== 'concat' || node.operands.length !== 2) return undefined;
  const rank = graph.values[v]!.type.shape.length;
  if (normalizeAxis(node.attrs['axis'] as number, rank) !== rank - 2) return undefined;
  const [p, n] = node.operands as [ValueId, ValueId];
  const nShape = graph.values[n]!.type.shape;
  const past = nameOf(p);
  const fresh = nameOf(n);
  if (past === undefined || fresh === undefined || !dimEquals(ctx.b.resolve(nShape[rank - 2]!), seq)) return undefined;
  return { past, fresh };
}

/**
 * Causal attention as one onnxruntime `com.microsoft` GroupQueryAttention node when its semantics
 * match the IR's: f32, q [batch, hq, seq, d], k/v [batch, hkv, past + seq, d] with hq a multiple
 * of hkv and d a multiple of 8 (the kernel's limit), causal, and an additive f32 mask (or none) as its `attention_bias` [batch|1, 1|hq, seq,
 * keys]. GroupQueryAttention's causal rule (query i sees keys ≤ past + i, past = keys − seq from
 * `seqlens_k` = keys − 1 for every row) is the IR's j ≤ i + tk − tq, and padded keys are masked by
 * the bias, not by per-row lengths, so rows of different lengths batch as the IR does. Keys built
 * as `concat([past, new])` (a KV cache) feed past_key and key separately, and the concat is left
 * dead (pruned); otherwise keys of length seq are all "new". q, new keys and values are turned to
 * [batch, seq, heads·d] and the output back to [batch, hq, seq, d] (transposes onnxruntime's
 * transpose optimizer cancels against the caller's merge). Anything else keeps the decomposed form.
 */
export const attentionFused = lowering<'attention'>((ctx) => {
  const { b, inputs, operands, attrs, source } = ctx;
  const fallback = (): readonly string[] => decomposedAttention.lower(ctx);
  const [qt, kt, vt] = operands as [(typeof operands)[number], (typeof operands)[number], (typeof operands)[number]];
  const mt = operands[3];
  if (source === undefined || !attrs.causal || qt.dtype !== 'f32' || qt.shape.length !== 4 || kt.shape.length !== 4 || vt.shape.length !== 4) return fallback();
  if (mt !== undefined && (mt.dtype !== 'f32' || mt.shape.length > 4)) return fallback();
  const [batch, hq, seq, d] = qt.shape.map((x) => b.resolve(x)) as [Dim, Dim, Dim, Dim];
  const [, hkv, keys, dk] = kt.shape.map((x) => b.resolve(x)) as [Dim, Dim, Dim, Dim];
  const dv = b.resolve(vt.shape[3]!);
  // onnxruntime's kernel takes head sizes that are multiples of 8 only.
  if (typeof hq !== 'number' || typeof hkv !== 'number' || typeof d !== 'number' || d % 8 !== 0 || hq % hkv !== 0 || !dimEquals(dk, d) || !dimEquals(dv, d) || !dimEquals(b.resolve(vt.shape[1]!), hkv)) return fallback();
  // The bias must name every key (a mask broadcast along the keys is not one the kernel takes).
  if (mt !== undefined && (mt.shape.length === 0 || !dimEquals(b.resolve(mt.shape[mt.shape.length - 1]!), keys))) return fallback();
  const [, kId, vId] = source.node.operands as [ValueId, ValueId, ValueId];
  let kv = [pastAndNew(ctx, kId, seq), pastAndNew(ctx, vId, seq)] as const;
  if (kv[0] === undefined || kv[1] === undefined) {
    // No cache: every key is new, which GroupQueryAttention needs to be seq of them.
    if (!dimEquals(keys, seq)) return fallback();
    kv = [{ past: '', fresh: inputs[1]! }, { past: '', fresh: inputs[2]! }];
  }
  const [k, v] = kv as readonly [{ past: string; fresh: string }, { past: string; fresh: string }];
  const gqa = (): string => {
    const merge = (x: string, heads: number): string => b.op('Reshape', [b.op('Transpose', [x], { perm: [0, 2, 1, 3] }), b.shape([batch, seq, heads * d])], { allowzero: 1 });
    const total = b.cast(b.op('Squeeze', [b.dim(keys), b.int64s([0])]), ElemType.INT32);
    const seqlens = b.op('Expand', [b.cast(b.op('Sub', [b.dim(keys), b.int64s([1])]), ElemType.INT32), b.dim(batch)]);
    const ins = [merge(inputs[0]!, hq), merge(k.fresh, hkv), merge(v.fresh, hkv), k.past, v.past, seqlens, total];
    if (inputs[3] !== undefined) ins.push('', '', '', b.op('Expand', [inputs[3], b.shape([1, 1, seq, 1])]));
    const [out] = b.msEmit('GroupQueryAttention', ins, { num_heads: hq, kv_num_heads: hkv, scale: { float: attrs.scale ?? 1 / Math.sqrt(d) } }, 3);
    return b.op('Transpose', [b.op('Reshape', [out!, b.shape([batch, seq, hq, d])], { allowzero: 1 })], { perm: [0, 2, 1, 3] });
  };
  // With a past, onnxruntime's kernel takes several query rows only in a batch of one: an If picks
  // it for batch = 1 or seq = 1 (every engine step: a prefill chunk is one sequence, a decode
  // step one query per row) and the decomposed form otherwise, unless the dims say so statically.
  if (k.past === '' || dimEquals(batch, 1) || dimEquals(seq, 1)) return [gqa()];
  const one = b.int64s([1]);
  const cond = b.op('Squeeze', [b.op('Or', [b.op('Equal', [b.dim(batch), one]), b.op('Equal', [b.dim(seq), one])]), b.int64s([0])]);
  const then = b.detached(gqa);
  // The fallback concatenates inside its branch, so the outer KV concat is dead (pruned) and the
  // fused branch runs without it.
  const otherwise = b.detached(() => {
    const cat = (x: { past: string; fresh: string }): string => b.op('Concat', [x.past, x.fresh], { axis: 2 });
    return decomposedAttention.lower({ ...ctx, inputs: [inputs[0]!, cat(k), cat(v), ...inputs.slice(3)] })[0]!;
  });
  return [b.op('If', [cond], { then_branch: { graph: subgraphProto('gqa', then.nodes, then.out, ElemType.FLOAT) }, else_branch: { graph: subgraphProto('decomposed', otherwise.nodes, otherwise.out, ElemType.FLOAT) } })];
});

/**
 * linear with a run-time weight (a graph input, e.g. weights fed per run as zero-copy inputs) as
 * yᵀ = W·xᵀ: MatMul(W, Transpose(x)) then Transpose, x flattened to [rows, in] around it. MLAS
 * packs a GEMM's B operand per call unless it is a constant it could prepack, so x·Wᵀ re-packs the
 * whole weight every run; as the A operand the weight streams through unpacked and only the small
 * xᵀ is packed. Constant weights (parameters, prepacked once) and other dtypes keep `linear`.
 */
export const linearWeightMajor = lowering<'linear'>((ctx) => {
  const { b, inputs, operands, source } = ctx;
  const [x, w] = operands as [(typeof operands)[number], (typeof operands)[number]];
  const producer = source === undefined ? undefined : source.graph.nodes[source.graph.values[source.node.operands[1]!]!.node];
  if (producer?.kind !== 'input' || x.dtype !== 'f32' || w.dtype !== 'f32' || x.shape.length < 1) return decomposedLinear.lower(ctx);
  const rank = x.shape.length;
  const lead = x.shape.slice(0, rank - 1).map((d) => b.resolve(d));
  const out = b.resolve(w.shape[0]!);
  const weightMajor = (): string => {
    if (rank === 1) return b.op('MatMul', [inputs[1]!, inputs[0]!]);
    const rows = rank === 2 ? inputs[0]! : b.op('Reshape', [inputs[0]!, b.shape([-1, b.resolve(x.shape[rank - 1]!)])]);
    const yt = b.op('Transpose', [b.op('MatMul', [inputs[1]!, b.op('Transpose', [rows], { perm: [1, 0] })])], { perm: [1, 0] });
    return rank > 2 ? b.op('Reshape', [yt, b.shape([...lead, out])], { allowzero: 1 }) : yt;
  };
  const rowCount = b.resolve(dimProduct(lead));
  let y: string;
  // One row (a decode step of one sequence) is a GEMV, where x·Wᵀ measured faster (MLAS's
  // N = 1 tiles waste the weight-major product): an If picks by the run's row count.
  if (rank === 1 || (typeof rowCount === 'number' && rowCount > 1)) y = weightMajor();
  else if (rowCount === 1) y = decomposedLinear.lower({ ...ctx, inputs: inputs.slice(0, 2) })[0]!;
  else {
    const single = b.op('Squeeze', [b.op('Equal', [b.dim(rowCount), b.int64s([1])]), b.int64s([0])]);
    const then = b.detached(() => decomposedLinear.lower({ ...ctx, inputs: inputs.slice(0, 2) })[0]!);
    const otherwise = b.detached(weightMajor);
    y = b.op('If', [single], { then_branch: { graph: subgraphProto('rowwise', then.nodes, then.out, ElemType.FLOAT) }, else_branch: { graph: subgraphProto('weight_major', otherwise.nodes, otherwise.out, ElemType.FLOAT) } });
  }
  return [inputs[2] === undefined ? y : b.op('Add', [y, inputs[2]])];
});
