// The serving ops of the adapter-bank and MoE kernels the GPU code generators emit (BGMV, one SGMV
// step, the expert GEMM with expert LoRA). Each is the primitive chain `@stageml/peft` or
// `@stageml/moe` builds, folded into one node by `@stageml/kernel-patterns`' serving rules; each
// decomposes into exactly that chain, so every executor without a rule of its own computes what it
// computed before the op existed, and each op's reference semantics rounds where the chain rounds.
import { attr } from '../attrs.js';
import type { GraphBuilder, Value } from '../builder.js';
import { type Dim, dimAdd, dimEquals, dimProduct, dimToString } from '../dim.js';
import { type EvalContext, defineOp, shapeError } from '../op-def.js';
import type { HostTensor } from '../tensor.js';
import { type TensorType, shapeToString } from '../types.js';
import { requireFloat, requireIndex, sameDType } from './common.js';
import { add, mul } from './elementwise.js';
import { constant, gather, indexSelect, scatterAdd } from './indexing.js';
import { linear, matmul } from './linalg.js';
import { groupedMatmul } from './moe.js';
import { scaledBy } from './serving.js';
import { reshape } from './shape.js';

function requireMatrixFactors(op: string, A: TensorType, B: TensorType, inDim: Dim, out: Dim, lead: readonly Dim[]): Dim {
  const n = lead.length;
  const leadText = lead.map((d) => `${dimToString(d)}, `).join('');
  if (A.shape.length !== n + 2 || !lead.every((d, i) => dimEquals(A.shape[i]!, d)) || !dimEquals(A.shape[n + 1]!, inDim)) {
    shapeError(op, `A must be [${leadText}rank, ${dimToString(inDim)}], got ${shapeToString(A.shape)}`);
  }
  const rank = A.shape[n]!;
  if (B.shape.length !== n + 2 || !lead.every((d, i) => dimEquals(B.shape[i]!, d)) || !dimEquals(B.shape[n]!, out) || !dimEquals(B.shape[n + 1]!, rank)) {
    shapeError(op, `B must be [${leadText}${dimToString(out)}, ${dimToString(rank)}], got ${shapeToString(B.shape)}`);
  }
  return rank;
}

function requireVector(op: string, what: string, t: TensorType | undefined, n: Dim): void {
  if (t !== undefined && (t.shape.length !== 1 || !dimEquals(t.shape[0]!, n)))
    shapeError(op, `${what} must be [${dimToString(n)}], got ${shapeToString(t.shape)}`);
}

/** A rank-0 constant `s` of `dtype`, as the decompositions build it (rounded to the dtype). */
function scalarOf(s: number, dtype: TensorType['dtype'], ctx: EvalContext): HostTensor {
  return constant.evaluate([], { value: [s], shape: [], dtype }, ctx)[0]!;
}

function inferGatheredLoraLinear([x, w, A, B, scales, ids, bias]: readonly TensorType[]): TensorType {
  const op = 'gatheredLoraLinear';
  requireFloat(op, x!);
  const dtype = sameDType(op, [x!, w!, A!, B!, scales!, ...(bias === undefined ? [] : [bias])]);
  requireIndex(op, ids!, 'ids');
  if (x!.shape.length !== 3) shapeError(op, `x must be [batch, seq, in], got ${shapeToString(x!.shape)}`);
  const [batch, seq, inDim] = x!.shape as [Dim, Dim, Dim];
  if (w!.shape.length !== 2 || !dimEquals(w!.shape[1]!, inDim)) shapeError(op, `w must be [out, ${dimToString(inDim)}], got ${shapeToString(w!.shape)}`);
  const out = w!.shape[0]!;
  const adapters = A!.shape[0];
  if (adapters === undefined) shapeError(op, `A must be [adapters, rank, ${dimToString(inDim)}], got ${shapeToString(A!.shape)}`);
  requireMatrixFactors(op, A!, B!, inDim, out, [adapters]);
  requireVector(op, 'scales', scales, adapters);
  requireVector(op, 'ids', ids, batch);
  requireVector(op, 'bias', bias, out);
  return { dtype, shape: [batch, seq, out] };
}

/**
 * BGMV (Punica's batched gather matrix-vector product): a linear layer over a mixed batch where
 * each leading row i gathers its adapter's factors from stacks A [L, r, in], B [L, out, r] and
 * scales [L] by ids[i] (i64 [batch]); x is [batch, seq, in], w [out, in], bias [out] optional:
 *
 *   y[i] = x[i]·wᵀ + bias + scales[ids_i] · (x[i]·A[ids_i]ᵀ)·B[ids_i]ᵀ
 *
 * `@stageml/peft`'s `bankLinearGathered` in one node. Unlike `loraBankLinear`'s gathered form, B
 * keeps PEFT's [out, r] layout per adapter and the scales are their own operand, which is what the
 * generated BGMV kernels read. Its decomposition is exactly that function's chain: a linear, two
 * gathers and two batched matmuls, the gathered scales reshaped to [batch, 1, 1], a mul and an add.
 */
export const gatheredLoraLinear = defineOp({
  key: 'gatheredLoraLinear',
  summary: 'A linear layer plus per-row LoRA updates gathered by adapter id from stacked factors and scales (BGMV over a mixed batch).',
  semantics:
    'y[i] = x[i]·wᵀ + bias + scales[ids_i]·(x[i]·A[ids_i]ᵀ)·B[ids_i]ᵀ; x [batch, seq, in], A [L, r, in], B [L, out, r], scales [L], ids [batch], bias [out] optional',
  operands: ['x', 'w', 'A', 'B', 'scales', 'ids', 'bias?'],
  traits: ['contraction'],
  infer: (types) => [inferGatheredLoraLinear(types)],
  flops: ([x, w, A, , , , bias], [y]) => {
    const rows = dimProduct(x!.shape.slice(0, -1));
    const [out, inDim] = w!.shape as [Dim, Dim];
    const rank = A!.shape[1]!;
    const adds = bias === undefined ? 2 : 3;
    return dimAdd(dimAdd(dimProduct([2, rows, out, inDim]), dimProduct([2, rows, rank, dimAdd(inDim, out)])), dimProduct([adds, ...y!.shape]));
  },
  evaluate: ([x, w, A, B, scales, ids, bias], _a, ctx) => {
    const base = linear.evaluate(bias === undefined ? [x!, w!] : [x!, w!, bias], {}, ctx)[0]!;
    const at = gather.evaluate([A!, ids!], { axis: 0 }, ctx)[0]!;
    const bt = gather.evaluate([B!, ids!], { axis: 0 }, ctx)[0]!;
    const shrink = matmul.evaluate([x!, at], { transposeA: false, transposeB: true }, ctx)[0]!;
    const expand = matmul.evaluate([shrink, bt], { transposeA: false, transposeB: true }, ctx)[0]!;
    const s = reshape.evaluate(gather.evaluate([scales!, ids!], { axis: 0 }, ctx), { shape: [-1, 1, 1] }, ctx)[0]!;
    return add.evaluate([base, mul.evaluate([expand, s], {}, ctx)[0]!], {}, ctx);
  },
  decompose: (b, [x, w, A, B, scales, ids, bias]) => {
    const base = b.linear(x!, w!, bias);
    const shrink = b.matmul(x!, b.gather(A!, ids!, 0), { transposeB: true });
    const expand = b.matmul(shrink, b.gather(B!, ids!, 0), { transposeB: true });
    return [b.add(base, b.mul(expand, b.reshape(b.gather(scales!, ids!, 0), [-1, 1, 1])))];
  },
});

function inferLoraScatterAdd([acc, x, rows, A, B, biasB]: readonly TensorType[]): TensorType {
  const op = 'loraScatterAdd';
  requireFloat(op, x!);
  sameDType(op, [acc!, x!, A!, B!, ...(biasB === undefined ? [] : [biasB])]);
  requireIndex(op, rows!, 'rows');
  if (rows!.shape.length !== 1) shapeError(op, `rows must be 1-D, got ${shapeToString(rows!.shape)}`);
  const r = x!.shape.length;
  // NOTE: rank ≥ 2, so the selected row axis (0) is not the contracted feature axis (last).
  if (r < 2) shapeError(op, `x must be [n, ..., in] (rank ≥ 2), got ${shapeToString(x!.shape)}`);
  const inDim = x!.shape[r - 1]!;
  const out = acc!.shape[r - 1];
  if (acc!.shape.length !== r || out === undefined || !x!.shape.slice(1, -1).every((d, i) => dimEquals(d, acc!.shape[i + 1]!))) {
    shapeError(op, `acc ${shapeToString(acc!.shape)} must be x ${shapeToString(x!.shape)} with its last dim the output dim`);
  }
  requireMatrixFactors(op, A!, B!, inDim, out, []);
  requireVector(op, 'biasB', biasB, out);
  return acc!;
}

/** The LoRA delta of one SGMV step's rows, as its decomposition computes it (before the scatter). */
function stepDelta(b: GraphBuilder, [, x, rows, A, B, biasB]: readonly Value[], scale: number): Value {
  return scaledBy(b, b.linear(b.linear(b.indexSelect(x!, rows!, 0), A!), B!, biasB), scale);
}

/**
 * One step of SGMV (Punica's segmented gather matrix-vector product) over a mixed batch: the rows
 * `rows` (i64 [k]) of x [n, ..., in] use one adapter A [r, in], B [out, r] with scale s and an
 * optional B bias [out] (PEFT's `lora_bias`), and their delta is added into acc [n, ..., out]:
 *
 *   y = acc;  y[rows_j] += s·((x[rows_j]·Aᵀ)·Bᵀ + biasB)
 *
 * `@stageml/peft`'s `bankLinearGrouped` chains one step per adapter group over the base linear
 * `linear(x, W, bias)`; the SGMV kernels read such a chain (ranks may differ per step). Its
 * decomposition is exactly one step of that chain: indexSelect, two linears, the scale (none when
 * s = 1), scatterAdd.
 */
export const loraScatterAdd = defineOp({
  key: 'loraScatterAdd',
  summary: 'Adds one adapter’s scaled LoRA delta of the selected rows of x into an accumulator at those rows (one SGMV step of a mixed batch).',
  semantics: 'y = acc; y[rows_j] += s·((x[rows_j]·Aᵀ)·Bᵀ + biasB); acc [n, ..., out], x [n, ..., in], rows [k], A [r, in], B [out, r], biasB [out] optional',
  operands: ['acc', 'x', 'rows', 'A', 'B', 'biasB?'],
  attrs: { scale: attr.float({}) },
  traits: ['contraction'],
  infer: (types) => [inferLoraScatterAdd(types)],
  flops: ([acc, x, rows, A]) => {
    const r = x!.shape.length;
    const k = dimProduct([rows!.shape[0]!, ...x!.shape.slice(1, -1)]);
    const rank = A!.shape[0]!;
    return dimAdd(dimProduct([2, k, rank, dimAdd(x!.shape[r - 1]!, acc!.shape[r - 1]!)]), dimProduct([3, k, acc!.shape[r - 1]!]));
  },
  evaluate: ([acc, x, rows, A, B, biasB], a, ctx) => {
    const xs = indexSelect.evaluate([x!, rows!], { axis: 0 }, ctx)[0]!;
    const shrink = linear.evaluate([xs, A!], {}, ctx)[0]!;
    const expand = linear.evaluate(biasB === undefined ? [shrink, B!] : [shrink, B!, biasB], {}, ctx)[0]!;
    const delta = mul.evaluate([expand, scalarOf(a.scale, A!.dtype, ctx)], {}, ctx)[0]!;
    return scatterAdd.evaluate([acc!, rows!, delta], { axis: 0 }, ctx);
  },
  decompose: (b, operands, a) => [b.scatterAdd(operands[0]!, operands[2]!, stepDelta(b, operands, a.scale), 0)],
});

function inferGroupedLoraMatmul([x, w, A, B, groups]: readonly TensorType[], transposeW: boolean): TensorType {
  const op = 'groupedLoraMatmul';
  requireFloat(op, x!);
  const dtype = sameDType(op, [x!, w!, A!, B!]);
  const base = groupedMatmul.infer([x!, w!, groups!], { transposeW })[0]!;
  const experts = w!.shape[0]!;
  requireMatrixFactors(op, A!, B!, x!.shape[1]!, base.shape[1]!, [experts]);
  return { dtype, shape: base.shape };
}

/**
 * A MoE expert GEMM with per-expert LoRA (`@stageml/moe`'s expert projections with adapters): rows
 * of x [n, in] are routed to experts g (i64 [n]); w is [E, in, out] ([E, out, in] with
 * `transposeW`), A [E, r, in], B [E, out, r], s an attribute:
 *
 *   y[n] = x[n]·w[g_n] + s·(x[n]·A[g_n]ᵀ)·B[g_n]ᵀ
 *
 * Its decomposition is exactly the chain `groupedMatmul(x, w, g) + s·groupedMatmul(groupedMatmul(x,
 * A, g)ᵀ, B, g)ᵀ` (the factor products with `transposeW`; no scale product when s = 1), which the
 * MoE-LoRA kernels compute in one.
 */
export const groupedLoraMatmul = defineOp({
  key: 'groupedLoraMatmul',
  summary: 'A row-wise grouped matrix product (MoE expert GEMM) plus each expert’s scaled LoRA delta, the scale an attribute.',
  semantics: 'y[n] = x[n]·w[g_n] + s·(x[n]·A[g_n]ᵀ)·B[g_n]ᵀ   (transposeW: w[g_n]ᵀ); x [n, in], A [E, r, in], B [E, out, r], groups [n]',
  operands: ['x', 'w', 'A', 'B', 'groups'],
  attrs: { transposeW: attr.bool({ default: false }), scale: attr.float({}) },
  traits: ['contraction'],
  infer: (types, a) => [inferGroupedLoraMatmul(types, a.transposeW)],
  flops: ([x, , A], [y]) => {
    const [n, inDim] = x!.shape as [Dim, Dim];
    const out = y!.shape[1]!;
    const rank = A!.shape[1]!;
    return dimAdd(dimAdd(dimProduct([2, n, inDim, out]), dimProduct([2, n, rank, dimAdd(inDim, out)])), dimProduct([2, n, out]));
  },
  evaluate: ([x, w, A, B, groups], a, ctx) => {
    const base = groupedMatmul.evaluate([x!, w!, groups!], { transposeW: a.transposeW }, ctx)[0]!;
    const shrink = groupedMatmul.evaluate([x!, A!, groups!], { transposeW: true }, ctx)[0]!;
    const expand = groupedMatmul.evaluate([shrink, B!, groups!], { transposeW: true }, ctx)[0]!;
    return add.evaluate([base, mul.evaluate([expand, scalarOf(a.scale, x!.dtype, ctx)], {}, ctx)[0]!], {}, ctx);
  },
  decompose: (b, operands, a) => [decomposeGroupedLoraMatmul(b, operands, a.transposeW, a.scale)],
});

/** `groupedLoraMatmul` in primitive ops: the base expert GEMM plus the scaled expert-LoRA chain. */
function decomposeGroupedLoraMatmul(b: GraphBuilder, [x, w, A, B, groups]: readonly Value[], transposeW: boolean, scale: number): Value {
  const base = b.op('groupedMatmul', [x!, w!, groups!], { transposeW });
  const expand = b.op('groupedMatmul', [b.op('groupedMatmul', [x!, A!, groups!], { transposeW: true }), B!, groups!], { transposeW: true });
  return b.add(base, scaledBy(b, expand, scale));
}
