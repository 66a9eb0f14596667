import { quantizeWeight, seededRandom } from '@stageml/ir';

import { conformanceCase as c, t, widened } from './case.js';

const NAN = Number.NaN;
const NEG_INF = Number.NEGATIVE_INFINITY;

/**
 * onnxruntime's MatMulNBits (accuracy level 4) rounds activations in [−2, 2) to int8 steps of
 * max|x|/127 ≈ 0.016, so an output over 48–64 unit weights moves by up to ~0.5 (typically ~0.05);
 * the sound bound is `@stageml/planner`'s `quantizedLinearErrorBound`, tested in models.
 */
const INT8_ACTIVATIONS = { rtol: 0.05, atol: 0.2 };

/** Cases of the contraction, reduction, normalization, shape, indexing and attention ops. */
export const STRUCTURED_CASES = {
  matmul: [
    c('matmul f32 [2,3]·[3,4]', [t('f32', [2, 3]), t('f32', [3, 4], { param: true })], (b, [x, w]) => b.matmul(x!, w!)),
    c('matmul transposeA transposeB', [t('f32', [3, 2]), t('f32', [4, 3])], (b, [x, w]) => b.matmul(x!, w!, { transposeA: true, transposeB: true })),
    c('matmul batch broadcast', [t('f32', [2, 1, 3, 4]), t('f32', [3, 4, 2])], (b, [x, w]) => b.matmul(x!, w!)),
    c('matmul symbolic rows', [t('f32', ['n', 3], { dims: [5, 3] }), t('f32', [3, 2])], (b, [x, w]) => b.matmul(x!, w!)),
    c('matmul i32', [t('i32', [2, 3]), t('i32', [3, 2])], (b, [x, w]) => b.matmul(x!, w!)),
    c('matmul f16', [t('f16', [2, 8]), t('f16', [8, 3])], (b, [x, w]) => widened(b, b.matmul(x!, w!))),
  ],
  linear: [
    c('linear rank 3 with bias', [t('f32', [2, 3, 4]), t('f32', [5, 4], { param: true }), t('f32', [5], { param: true })], (b, [x, w, k]) => b.linear(x!, w!, k)),
    c('linear rank 1 no bias', [t('f32', [4]), t('f32', [2, 4])], (b, [x, w]) => b.linear(x!, w!)),
    c('linear symbolic batch', [t('f32', ['n', 4], { dims: [3, 4] }), t('f32', [6, 4])], (b, [x, w]) => b.linear(x!, w!)),
  ],
  groupedMatmul: [
    c('groupedMatmul rows across groups', [t('f32', [6, 4]), t('f32', [3, 4, 5], { param: true }), t('i64', [6], { values: [2, 0, 2, 1, 0, 2] })], (b, [x, w, g]) =>
      b.op('groupedMatmul', [x!, w!, g!]),
    ),
    c('groupedMatmul transposeW, one group, symbolic rows', [t('f32', ['n', 3], { dims: [4, 3] }), t('f32', [2, 5, 3]), t('u8', ['n'], { dims: [4], values: [1, 1, 1, 1] })], (b, [x, w, g]) =>
      b.op('groupedMatmul', [x!, w!, g!], { transposeW: true }),
    ),
    c('groupedMatmul i32 and f16', [t('i32', [3, 2]), t('i32', [2, 2, 2]), t('i32', [3], { values: [1, 0, 1] }), t('f16', [3, 4]), t('f16', [2, 4, 2])], (b, [x, w, g, h, v]) => [
      b.op('groupedMatmul', [x!, w!, g!]),
      ...[b.op('groupedMatmul', [h!, v!, g!])].flatMap((y) => [y, b.cast(y, 'f32')]),
    ]),
  ],
  quantizedLinear: [
    quantCase('quantizedLinear int8 g16 (MatMulNBits)', 8, 16, 48, 5, true, 3, INT8_ACTIVATIONS),
    quantCase('quantizedLinear int4 g32 asym (MatMulNBits)', 4, 32, 64, 3, false, 2, INT8_ACTIVATIONS),
    quantCase('quantizedLinear int4 g3 asym, partial block (dequantize + MatMul)', 4, 4, 7, 3, false, 2),
    quantCase('quantizedLinear int8 per-channel (dequantize + MatMul)', 8, 5, 5, 4, true, 3),
  ],
  sum: [
    c('sum all axes', [t('f32', [2, 3, 4])], (b, [x]) => b.sum(x!)),
    c('sum axes [0,-1] keepDims', [t('f32', [2, 3, 4])], (b, [x]) => b.sum(x!, [0, -1], true)),
    c('sum i32 symbolic', [t('i32', ['n', 3], { dims: [4, 3] })], (b, [x]) => b.sum(x!, [0])),
    c('sum i8 wraps', [t('i8', [2, 4], { range: [-120, 120] })], (b, [x]) => widened(b, b.sum(x!, [1]))),
    c('sum f16', [t('f16', [3, 5])], (b, [x]) => widened(b, b.sum(x!, [1]))),
  ],
  mean: [
    c('mean all axes', [t('f32', [3, 4])], (b, [x]) => b.mean(x!)),
    c('mean axis 1 keepDims', [t('f32', [2, 5, 3])], (b, [x]) => b.mean(x!, [1], true)),
    c('mean bf16 symbolic', [t('bf16', ['n', 6], { dims: [2, 6] })], (b, [x]) => widened(b, b.mean(x!, [-1]))),
  ],
  max: [
    c('max last axis with NaN', [t('f32', [3, 3], { values: [1, NAN, 3, NAN, 0, 1, -1, -2, -3] })], (b, [x]) => b.max(x!, [-1])),
    c('max all keepDims', [t('f32', [2, 3])], (b, [x]) => b.max(x!, [], true)),
    c('max i32 axis 0', [t('i32', [4, 2])], (b, [x]) => b.max(x!, [0])),
  ],
  argmax: [
    c('argmax ties and NaN', [t('f32', [3, 4], { values: [1, 5, 5, 2, 0, NAN, 9, NAN, 7, 7, 7, 7] })], (b, [x]) => b.argmax(x!, -1)),
    c('argmax axis 0 keepDims', [t('f32', [3, 4])], (b, [x]) => b.argmax(x!, 0, true)),
    c('argmax i32', [t('i32', [2, 5])], (b, [x]) => b.argmax(x!, 1)),
    c('argmax i32', [t('i32', [3, 4])], (b, [x]) => b.argmax(x!, -1)),
  ],
  softmax: [
    c('softmax last axis', [t('f32', [2, 5], { range: [-4, 4] })], (b, [x]) => b.softmax(x!)),
    c('softmax axis 0 of rank 3', [t('f32', [3, 4, 2])], (b, [x]) => b.softmax(x!, 0)),
    c('softmax axis 1 with -∞', [t('f32', [2, 3, 2], { values: [NEG_INF, 0, NEG_INF, 1, NEG_INF, 2, 0, 1, 2, 3, 4, 5] })], (b, [x]) => b.softmax(x!, 1)),
    c('softmax f16', [t('f16', [3, 4])], (b, [x]) => widened(b, b.softmax(x!))),
  ],
  rmsNorm: [
    c('rmsNorm with weight', [t('f32', [2, 3, 8]), t('f32', [8], { param: true })], (b, [x, w]) => b.rmsNorm(x!, w, 1e-6)),
    c('rmsNorm without weight', [t('f32', ['n', 6], { dims: [3, 6] })], (b, [x]) => b.rmsNorm(x!, undefined, 1e-5)),
    c('rmsNorm bf16', [t('bf16', [2, 8]), t('bf16', [8])], (b, [x, w]) => widened(b, b.rmsNorm(x!, w, 1e-6))),
  ],
  layerNorm: [
    c('layerNorm weight and bias', [t('f32', [2, 3, 8]), t('f32', [8]), t('f32', [8])], (b, [x, w, k]) => b.layerNorm(x!, w, k)),
    c('layerNorm bare', [t('f32', [4, 5])], (b, [x]) => b.layerNorm(x!)),
    c('layerNorm weight only f16', [t('f16', [2, 8]), t('f16', [8])], (b, [x, w]) => widened(b, b.layerNorm(x!, w))),
  ],
  reshape: [
    c('reshape with -1', [t('f32', [2, 3, 4])], (b, [x]) => b.reshape(x!, [6, -1])),
    c('reshape symbolic', [t('f32', ['n', 4], { dims: [3, 4] })], (b, [x]) => b.reshape(x!, ['n', 2, 2])),
    c('reshape bool', [t('bool', [2, 3])], (b, [x]) => b.reshape(x!, [3, 2])),
  ],
  transpose: [
    c('transpose [2,0,1]', [t('f32', [2, 3, 4])], (b, [x]) => b.transpose(x!, [2, 0, 1])),
    c('transpose negative perm i32', [t('i32', [3, 2])], (b, [x]) => b.transpose(x!, [-1, 0])),
  ],
  broadcastTo: [
    c('broadcastTo adds leading dims', [t('f32', [3])], (b, [x]) => b.broadcastTo(x!, [2, 3])),
    c('broadcastTo stretches 1s, bool', [t('bool', [2, 1])], (b, [x]) => b.broadcastTo(x!, [2, 4])),
    c('broadcastTo symbolic', [t('f32', [1, 3]), t('f32', ['n'], { dims: [4] })], (b, [x, y]) => [b.broadcastTo(x!, ['n', 3]), y!]),
  ],
  concat: [
    c('concat axis 0', [t('f32', [2, 3]), t('f32', [1, 3])], (b, [x, y]) => b.concat([x!, y!], 0)),
    c('concat axis -1 three operands', [t('f32', [2, 1]), t('f32', [2, 3]), t('f32', [2, 2])], (b, [x, y, z]) => b.concat([x!, y!, z!], -1)),
    c('concat i32 and bool', [t('i32', [2]), t('i32', [3]), t('bool', [2]), t('bool', [1])], (b, [x, y, p, q]) => [b.concat([x!, y!], 0), b.concat([p!, q!], 0)]),
    c('concat single operand', [t('f32', [3])], (b, [x]) => b.concat([x!], 0)),
  ],
  slice: [
    c('slice axis 1 [1:3]', [t('f32', [2, 4])], (b, [x]) => b.slice(x!, 1, 1, 3)),
    c('slice negative start, end past size', [t('f32', [5, 2])], (b, [x]) => b.slice(x!, 0, -3, 9)),
    c('slice step 2 i32', [t('i32', [2, 7])], (b, [x]) => b.slice(x!, -1, 0, 7, 2)),
    c('slice step 3 bool', [t('bool', [8, 2])], (b, [x]) => b.slice(x!, 0, 1, undefined, 3)),
    c('slice symbolic axis', [t('f32', ['n', 3], { dims: [5, 3] })], (b, [x]) => b.slice(x!, 0, 1)),
    c('slice symbolic bound', [t('f32', ['n', 3], { dims: [5, 3] })], (b, [x]) => b.slice(x!, 0, 0, -2)),
  ],
  gather: [
    c('gather rows by [2,2] indices', [t('f32', [5, 3]), t('i64', [2, 2], { range: [0, 4] })], (b, [x, i]) => b.gather(x!, i!)),
    c('gather axis 1', [t('f32', [2, 4, 3]), t('i32', [3], { range: [0, 3] })], (b, [x, i]) => b.gather(x!, i!, 1)),
    c('gather scalar index, axis -1', [t('f32', [2, 3]), t('i8', [], { values: [2] })], (b, [x, i]) => b.gather(x!, i!, -1)),
    c('gather bool table, symbolic indices', [t('bool', [4, 2]), t('u8', ['n'], { dims: [5], range: [0, 3] })], (b, [x, i]) => b.gather(x!, i!)),
  ],
  indexSelect: [
    c('indexSelect axis 0', [t('f32', [4, 3]), t('i64', [5], { range: [0, 3] })], (b, [x, i]) => b.indexSelect(x!, i!)),
    c('indexSelect axis -1 u8', [t('i32', [2, 5]), t('u8', [3], { range: [0, 4] })], (b, [x, i]) => b.indexSelect(x!, i!, -1)),
  ],
  scatterAdd: [
    c('scatterAdd axis 0 duplicates', [t('f32', [4, 2]), t('i64', [5], { values: [1, 3, 1, 0, 1] }), t('f32', [5, 2])], (b, [x, i, u]) => b.scatterAdd(x!, i!, u!)),
    c('scatterAdd axis 1', [t('f32', [2, 3, 2]), t('i32', [4], { values: [2, 2, 0, 1] }), t('f32', [2, 4, 2])], (b, [x, i, u]) => b.scatterAdd(x!, i!, u!, 1)),
    c('scatterAdd i8 wraps', [t('i8', [3], { values: [100, -100, 0] }), t('i32', [2], { values: [0, 1] }), t('i8', [2], { values: [100, -100] })], (b, [x, i, u]) =>
      widened(b, b.scatterAdd(x!, i!, u!)),
    ),
    c('scatterAdd u8 repeated index', [t('u8', [3], { values: [0, 1, 0] }), t('i32', [2], { values: [2, 2] }), t('u8', [2], { values: [1, 0] })], (b, [x, i, u]) =>
      b.scatterAdd(x!, i!, u!),
    ),
  ],
  topk: [
    c('topk last axis with ties', [t('f32', [2, 5], { values: [1, 5, 5, 2, 5, 0, 0, 0, 0, 0] })], (b, [x]) => b.topk(x!, 3)),
    c('topk axis 0 smallest', [t('f32', [5, 3])], (b, [x]) => b.topk(x!, 2, 0, false)),
    c('topk NaN ranks largest', [t('f32', [6], { values: [1, NAN, 5, Number.POSITIVE_INFINITY, -1, NAN] })], (b, [x]) => [...b.topk(x!, 4), ...b.topk(x!, 4, 0, false)]),
    c('topk i32 middle axis', [t('i32', [2, 4, 2])], (b, [x]) => b.topk(x!, 2, 1)),
    c('topk i32 and k = 0', [t('i32', [5])], (b, [x]) => [...b.topk(x!, 2), ...b.topk(x!, 0)]),
  ],
  rotary: [
    c('rotary half-split, tables broadcast', [t('f32', [2, 3, 8]), t('f32', [3, 8]), t('f32', [3, 8])], (b, [x, k, s]) => b.rotary(x!, k!, s!)),
    c('rotary interleaved', [t('f32', [1, 2, 3, 4]), t('f32', [3, 4]), t('f32', [1, 3, 4])], (b, [x, k, s]) => b.rotary(x!, k!, s!, true)),
    c('rotary symbolic seq f16', [t('f16', [2, 'n', 4], { dims: [2, 3, 4] }), t('f16', ['n', 4], { dims: [3, 4] }), t('f16', ['n', 4], { dims: [3, 4] })], (b, [x, k, s]) =>
      widened(b, b.rotary(x!, k!, s!)),
    ),
  ],
  attention: [
    c('attention rank 3', [t('f32', [2, 3, 4]), t('f32', [2, 5, 4]), t('f32', [2, 5, 3])], (b, [q, k, v]) => b.attention(q!, k!, v!)),
    c('attention GQA causal decode-aligned', [t('f32', [1, 4, 2, 8]), t('f32', [1, 2, 5, 8]), t('f32', [1, 2, 5, 8])], (b, [q, k, v]) =>
      b.attention(q!, k!, v!, { causal: true }),
    ),
    c('attention bool mask with a fully masked row', [t('f32', [2, 2, 4]), t('f32', [2, 3, 4]), t('f32', [2, 3, 4]), t('bool', [2, 3], { values: [0, 0, 0, 1, 0, 1] })], (b, [q, k, v, m]) =>
      b.attention(q!, k!, v!, {}, m),
    ),
    c('attention additive mask, scale, causal', [t('f32', [2, 3, 4]), t('f32', [2, 3, 4]), t('f32', [2, 3, 2]), t('f32', [1, 3, 3])], (b, [q, k, v, m]) =>
      b.attention(q!, k!, v!, { causal: true, scale: 0.3 }, m),
    ),
    c('attention symbolic seq causal', [t('f32', [2, 't', 4], { dims: [2, 3, 4] }), t('f32', [1, 't', 4], { dims: [1, 3, 4] }), t('f32', [1, 't', 4], { dims: [1, 3, 4] })], (b, [q, k, v]) =>
      b.attention(q!, k!, v!, { causal: true }),
    ),
  ],
  loraBank: [
    c('loraBank gathered with bias, symbolic rows', [t('f32', ['n', 2, 4], { dims: [3, 2, 4] }), t('f32', [5, 4], { param: true }), t('f32', [3, 2, 4]), t('f32', [3, 2, 5]), t('i64', ['n'], { dims: [3], values: [2, 0, 2] }), t('f32', [5], { param: true })], (b, [x, w, A, B, i, k]) =>
      b.loraBank('gathered', x!, b.linear(x!, w!, k), A!, B!, i!),
    ),
    c('loraBank grouped one-hot', [t('f32', [3, 1, 4]), t('f32', [5, 4]), t('f32', [3, 2, 4]), t('f32', [3, 2, 5]), t('i64', [2], { values: [1, 2] }), t('f32', [3, 2], { values: [1, 0, 0, 1, 1, 0] })], (b, [x, w, A, B, i, s]) =>
      b.loraBank('grouped', x!, b.linear(x!, w!), A!, B!, i!, s),
    ),
    c('loraBank single with a base row', [t('f32', [2, 3, 4]), t('f32', [5, 4]), t('f32', [3, 2, 4]), t('f32', [3, 2, 5]), t('i64', [], { values: [1] }), t('f32', [2, 1, 1], { values: [1, 0] })], (b, [x, w, A, B, i, s]) =>
      b.loraBank('single', x!, b.linear(x!, w!), A!, B!, i!, s),
    ),
  ],
  quantizedLoraBank: [
    c('quantizedLoraBank gathered, int8 codes and row scales', [t('f32', [3, 2, 4]), t('f32', [5, 4], { param: true }), t('i8', [3, 2, 4], { range: [-127, 127] }), t('f32', [3, 2]), t('i8', [3, 2, 5], { range: [-127, 127] }), t('f32', [3, 2]), t('i64', [3], { values: [2, 0, 1] })], (b, [x, w, A, sa, B, sb, i]) =>
      b.quantizedLoraBank('gathered', x!, b.linear(x!, w!), A!, sa!, B!, sb!, i!),
    ),
    c('quantizedLoraBank single with a base row', [t('f32', [2, 3, 4]), t('f32', [5, 4]), t('i8', [3, 2, 4], { range: [-127, 127] }), t('f32', [3, 2]), t('i8', [3, 2, 5], { range: [-127, 127] }), t('f32', [3, 2]), t('i64', [], { values: [1] }), t('f32', [2, 1, 1], { values: [1, 0] })], (b, [x, w, A, sa, B, sb, i, s]) =>
      b.quantizedLoraBank('single', x!, b.linear(x!, w!), A!, sa!, B!, sb!, i!, s),
    ),
  ],
  loraLinear: [
    c('loraLinear rank 2, symbolic rows', [t('f32', ['n', 4], { dims: [3, 4] }), t('f32', [5, 4], { param: true }), t('f32', [2, 4], { param: true }), t('f32', [5, 2], { param: true })], (b, [x, w, A, B]) =>
      b.loraLinear(x!, w!, A!, B!, 0.75),
    ),
    c('loraLinear over [rows, seq, in]', [t('f32', [2, 3, 4]), t('f32', [5, 4]), t('f32', [1, 4]), t('f32', [5, 1])], (b, [x, w, A, B]) => b.loraLinear(x!, w!, A!, B!, 2)),
    c('loraLinear with both biases', [t('f32', [3, 4]), t('f32', [5, 4], { param: true }), t('f32', [2, 4]), t('f32', [5, 2]), t('f32', [5]), t('f32', [5])], (b, [x, w, A, B, k, kb]) =>
      b.loraLinear(x!, w!, A!, B!, 0.5, { bias: k!, biasB: kb! }),
    ),
    c('loraLinear with only B’s bias', [t('f32', [3, 4]), t('f32', [5, 4]), t('f32', [2, 4]), t('f32', [5, 2]), t('f32', [5])], (b, [x, w, A, B, kb]) => b.loraLinear(x!, w!, A!, B!, 2, { biasB: kb! })),
  ],
  cachedAttention: [
    c('cachedAttention GQA causal over a resident cache', [t('f32', [2, 4, 1, 8]), t('f32', [2, 3, 2, 8]), t('f32', [2, 3, 2, 8]), t('f32', [2, 2, 1, 8]), t('f32', [2, 2, 1, 8]), t('f32', [2, 1, 1, 4])], (b, [q, pk, pv, k, v, m]) =>
      b.cachedAttention(q!, pk!, pv!, k!, v!, { causal: true }, b.reshape(m!, [2, 1, 1, 4])),
    ),
    c('cachedAttention symbolic past, prefill chunk', [t('f32', [1, 2, 3, 4]), t('f32', [1, 'p', 2, 4], { dims: [1, 2, 2, 4] }), t('f32', [1, 'p', 2, 4], { dims: [1, 2, 2, 4] }), t('f32', [1, 2, 3, 4]), t('f32', [1, 2, 3, 4])], (b, [q, pk, pv, k, v]) =>
      b.cachedAttention(q!, pk!, pv!, k!, v!, { causal: true, scale: 0.4 }),
    ),
  ],
  loraBankLinear: [
    c('loraBankLinear gathered with bias, symbolic rows', [t('f32', ['n', 2, 4], { dims: [3, 2, 4] }), t('f32', [5, 4], { param: true }), t('f32', [3, 2, 4]), t('f32', [3, 2, 5]), t('i64', ['n'], { dims: [3], values: [2, 0, 2] }), t('f32', [5], { param: true })], (b, [x, w, A, B, i, k]) =>
      b.loraBankLinear('gathered', x!, w!, A!, B!, i!, undefined, { bias: k! }),
    ),
    c('loraBankLinear grouped one-hot', [t('f32', [3, 1, 4]), t('f32', [5, 4]), t('f32', [3, 2, 4]), t('f32', [3, 2, 5]), t('i64', [2], { values: [1, 2] }), t('f32', [3, 2], { values: [1, 0, 0, 1, 1, 0] })], (b, [x, w, A, B, i, s]) =>
      b.loraBankLinear('grouped', x!, w!, A!, B!, i!, s),
    ),
    c('loraBankLinear single with a base row and a bias', [t('f32', [2, 3, 4]), t('f32', [5, 4]), t('f32', [3, 2, 4]), t('f32', [3, 2, 5]), t('i64', [], { values: [1] }), t('f32', [2, 1, 1], { values: [1, 0] }), t('f32', [5])], (b, [x, w, A, B, i, s, k]) =>
      b.loraBankLinear('single', x!, w!, A!, B!, i!, s, { bias: k! }),
    ),
  ],
  skipRmsNorm: [
    c('skipRmsNorm with weight (sum and normed)', [t('f32', [2, 3, 8]), t('f32', [2, 3, 8]), t('f32', [8], { param: true })], (b, [x, r, w]) => b.skipRmsNorm(x!, r!, w, 1e-6)),
    c('skipRmsNorm without weight, symbolic rows', [t('f32', ['n', 6], { dims: [3, 6] }), t('f32', ['n', 6], { dims: [3, 6] })], (b, [x, r]) => b.skipRmsNorm(x!, r!, undefined, 1e-5)),
    c('skipRmsNorm bf16', [t('bf16', [2, 8]), t('bf16', [2, 8]), t('bf16', [8])], (b, [x, r, w]) => b.skipRmsNorm(x!, r!, w, 1e-6).flatMap((v) => widened(b, v))),
  ],
  gatheredLoraLinear: [
    c('gatheredLoraLinear with bias, symbolic batch', [t('f32', ['n', 2, 4], { dims: [3, 2, 4] }), t('f32', [5, 4], { param: true }), t('f32', [3, 2, 4]), t('f32', [3, 5, 2]), t('f32', [3]), t('i64', ['n'], { dims: [3], values: [2, 0, 2] }), t('f32', [5])], (b, [x, w, A, B, s, i, k]) =>
      b.gatheredLoraLinear(x!, w!, A!, B!, s!, i!, k),
    ),
    c('gatheredLoraLinear one row per id', [t('f32', [2, 1, 4]), t('f32', [5, 4]), t('f32', [2, 3, 4]), t('f32', [2, 5, 3]), t('f32', [2]), t('i64', [2], { values: [1, 1] })], (b, [x, w, A, B, s, i]) =>
      b.gatheredLoraLinear(x!, w!, A!, B!, s!, i!),
    ),
  ],
  loraScatterAdd: [
    c('loraScatterAdd with a repeated row and B’s bias', [t('f32', [4, 5]), t('f32', [4, 3]), t('i64', [3], { values: [2, 0, 2] }), t('f32', [2, 3]), t('f32', [5, 2]), t('f32', [5])], (b, [acc, x, r, A, B, kb]) =>
      b.loraScatterAdd(acc!, x!, r!, A!, B!, 0.5, kb),
    ),
    c('loraScatterAdd over [n, seq, in]', [t('f32', [3, 2, 5]), t('f32', [3, 2, 4]), t('i64', [1], { values: [1] }), t('f32', [1, 4]), t('f32', [5, 1])], (b, [acc, x, r, A, B]) => b.loraScatterAdd(acc!, x!, r!, A!, B!, 2)),
  ],
  groupedLoraMatmul: [
    c('groupedLoraMatmul, experts [E, out, in]', [t('f32', [4, 3]), t('f32', [2, 5, 3], { param: true }), t('f32', [2, 2, 3]), t('f32', [2, 5, 2]), t('i64', [4], { values: [1, 0, 1, 1] })], (b, [x, w, A, B, g]) =>
      b.groupedLoraMatmul(x!, w!, A!, B!, g!, { transposeW: true, scale: 2 }),
    ),
    c('groupedLoraMatmul, experts [E, in, out]', [t('f32', [3, 3]), t('f32', [2, 3, 4]), t('f32', [2, 1, 3]), t('f32', [2, 4, 1]), t('i64', [3], { values: [0, 0, 1] })], (b, [x, w, A, B, g]) =>
      b.groupedLoraMatmul(x!, w!, A!, B!, g!, { scale: 0.5 }),
    ),
  ],
} as const;


/**
 * A quantized linear case from a quantized random weight. MatMulNBits-eligible cases get a loose
 * tolerance: onnxruntime's default lowering (accuracy level 4) quantizes activations to int8.
 */
function quantCase(name: string, bits: 4 | 8, blockSize: number, inF: number, out: number, symmetric: boolean, rows: number, tol?: { rtol: number; atol: number }) {
  const rnd = seededRandom(inF * 31 + out);
  const w = Array.from({ length: out * inF }, () => rnd() * 2 - 1);
  const p = quantizeWeight(w, out, inF, { bits, blockSize, symmetric });
  const ops = [
    t('f32', ['n', inF], { dims: [rows, inF] }),
    t('u8', p.qweight.shape, { param: true, values: Array.from(p.qweight.data) }),
    t('f32', p.scales.shape, { param: true, values: Array.from(p.scales.data) }),
    ...(p.zeroPoints === undefined ? [] : [t('u8', p.zeroPoints.shape, { param: true, values: Array.from(p.zeroPoints.data) })]),
  ];
  return c(name, ops, (b, [x, q, s, z]) => b.quantizedLinear(x!, q!, s!, z, p.attrs), tol === undefined ? {} : { tol });
}
