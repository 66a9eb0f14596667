import { type Dim, type Graph, type ValueId, dimDivExact, dimEquals, dimMul, normalizeAxis } from '@stageml/ir';

import { ElemType } from './dtypes.js';
import { type LowerContext, lowering } from './rule.js';
import { rmsNorm as decomposedRmsNorm } from './rules-linalg.js';
import { rotary as decomposedRotary } from './rules-nn.js';

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
