// The kernel-sized shapes of residual graphs, in the rewrite pattern language. Each pattern is plain
// data; `recognize.ts` matches them and turns captures into kernel specs.
import { type Pattern, m } from '@stageml/rewrite';

const x = m.capture('x');
const maybeBias = (src: Pattern, w: Pattern, bias: string): Pattern => m.oneOf(m.op('linear', src, w), m.op('linear', src, w, m.capture(bias)));

/** linear(x, W[, bias]): the base projection. */
export const BASE_LINEAR: Pattern = maybeBias(x, m.capture('w'), 'bias');

/**
 * A LoRA delta on `src`: s·linear(linear(src, A), B[, b_B]) with the scalar scale on either side
 * of the product, or no scale at all.
 */
export function loraDelta(src: Pattern): Pattern {
  const expand = maybeBias(m.op('linear', src, m.capture('a')), m.capture('b'), 'biasB');
  return m.oneOf(m.commutative('mul', expand, m.scalar(undefined, { as: 'scale' })), expand);
}

/** add(linear(x, W, b), Δ(x)) in either order, or a lone linear. */
export const LORA_LINEAR: Pattern = m.oneOf(m.commutative('add', BASE_LINEAR, loraDelta(x)), BASE_LINEAR);

/** One SGMV step: scatterAdd(acc, rows, Δ(indexSelect(src, rows))) along axis 0. */
export const BANK_GROUP_STEP: Pattern = m.op(
  'scatterAdd',
  m.capture('acc'),
  m.capture('rows'),
  loraDelta(m.op('indexSelect', m.capture('src'), m.capture('rows'), { attrs: { axis: 0 } })),
  { attrs: { axis: 0 } },
);

const ids = m.capture('ids');
const gathered = (stack: string): Pattern => m.op('gather', m.capture(stack), ids, { attrs: { axis: 0 } });
const transposedB = { attrs: { transposeA: false, transposeB: true } } as const;

/** BGMV: add(linear(x, W, b), matmul(matmul(x, gather(A, ids)ᵀ), gather(B, ids)ᵀ) · reshape(gather(S, ids))). */
export const BANK_GATHERED: Pattern = m.commutative(
  'add',
  BASE_LINEAR,
  m.commutative('mul', m.op('matmul', m.op('matmul', x, gathered('aStack'), transposedB), gathered('bStack'), transposedB), m.op('reshape', gathered('scales'))),
);

const groups = m.capture('groups');
const MOE_BASE: Pattern = m.op('groupedMatmul', x, m.capture('w'), groups, { as: 'base' });
const moeFactor = (src: Pattern, factor: string): Pattern => m.op('groupedMatmul', src, m.capture(factor), groups, { attrs: { transposeW: true } });

/** MoE expert GEMM: groupedMatmul(x, W, g) [+ s·groupedMatmul(groupedMatmul(x, A, g), B, g)]. */
export const MOE_LORA: Pattern = m.oneOf(
  m.commutative('add', MOE_BASE, m.commutative('mul', moeFactor(moeFactor(x, 'a'), 'b'), m.scalar(undefined, { as: 'scale' }))),
  MOE_BASE,
);
