import { type AttrsIn, type DType, type HostTensor, type OpKey, type TensorType, hostTensor, sizeOf } from '@stageml/ir';
import fc from 'fast-check';

import { arbHostTensor } from './arb-tensor.js';

/** One valid application of op `K`: concrete operands (index operands in range) and attributes. */
export interface OpSample<K extends OpKey> {
  /** Operand tensors, in the op's operand order. */
  readonly operands: readonly HostTensor[];
  /** Attributes as a builder call takes them. */
  readonly attrs: AttrsIn<K>;
}

/**
 * Random valid applications of every registry op, for conformance tests (`infer` agrees with
 * `evaluate`, costs are sane, every backend matches the reference). The table is a complete
 * mapped type over `OpKey`: adding an op to `OPS` fails this file's typecheck until it has a sampler.
 */
export type OpSamplers = { readonly [K in OpKey]: fc.Arbitrary<OpSample<K>> };

const FLOAT: readonly DType[] = ['f32', 'f64', 'f16', 'bf16'];
const NUMERIC: readonly DType[] = ['f32', 'f64', 'f16', 'bf16', 'i64', 'i32', 'i8', 'u8'];
const ANY: readonly DType[] = [...NUMERIC, 'bool'];

const dtypeOf = (xs: readonly DType[]): fc.Arbitrary<DType> => fc.constantFrom(...xs);
const dim = (min = 1, max = 3): fc.Arbitrary<number> => fc.integer({ min, max });
const shapeOf = (minRank: number, maxRank: number, minDim = 1, maxDim = 3): fc.Arbitrary<number[]> =>
  fc.array(dim(minDim, maxDim), { minLength: minRank, maxLength: maxRank });
const t = (dtype: DType, shape: readonly number[]): TensorType => ({ dtype, shape: [...shape] });

/** Data for `types` (finite, moderate). */
function tensors(types: readonly TensorType[]): fc.Arbitrary<HostTensor[]> {
  return fc.tuple(...types.map((ty) => arbHostTensor(ty)));
}

/** An integer tensor of `shape` with every value in [0, size). */
function indices(dtype: DType, shape: readonly number[], size: number): fc.Arbitrary<HostTensor> {
  const n = sizeOf(shape);
  return fc
    .array(fc.integer({ min: 0, max: size - 1 }), { minLength: n, maxLength: n })
    .map((v) => hostTensor(dtype, shape, v));
}

/** A shape broadcasting against `shape`: a suffix of it with some dims set to 1. */
function partnerShape(shape: readonly number[]): fc.Arbitrary<number[]> {
  return fc
    .tuple(fc.integer({ min: 0, max: shape.length }), fc.array(fc.boolean(), { minLength: shape.length, maxLength: shape.length }))
    .map(([keep, ones]) => shape.slice(shape.length - keep).map((d, i) => (ones[i] === true ? 1 : d)));
}

/** An axis of a rank-`rank` tensor, sometimes written negatively. */
function axisOf(rank: number): fc.Arbitrary<number> {
  return fc.tuple(fc.integer({ min: 0, max: rank - 1 }), fc.boolean()).map(([a, neg]) => (neg ? a - rank : a));
}

function sample<K extends OpKey>(operands: fc.Arbitrary<HostTensor[]>, attrs: AttrsIn<K>): fc.Arbitrary<OpSample<K>> {
  return operands.map((ops) => ({ operands: ops, attrs }));
}

function binary<K extends OpKey>(dtypes: readonly DType[], attrs: AttrsIn<K>): fc.Arbitrary<OpSample<K>> {
  return fc
    .tuple(dtypeOf(dtypes), shapeOf(0, 3), fc.boolean())
    .chain(([dtype, shape, swap]) =>
      partnerShape(shape).chain((other) => sample<K>(tensors(swap ? [t(dtype, other), t(dtype, shape)] : [t(dtype, shape), t(dtype, other)]), attrs)),
    );
}

function unary<K extends OpKey>(dtypes: readonly DType[], attrs: AttrsIn<K>): fc.Arbitrary<OpSample<K>> {
  return fc.tuple(dtypeOf(dtypes), shapeOf(0, 3, 0)).chain(([dtype, shape]) => sample<K>(tensors([t(dtype, shape)]), attrs));
}

// NOTE: sum, mean and max share one attribute schema, so one sampler type serves all three.
function reduction(dtypes: readonly DType[]): fc.Arbitrary<OpSample<'sum'>> {
  return fc.tuple(dtypeOf(dtypes), shapeOf(0, 3), fc.boolean()).chain(([dtype, shape, keepDims]) =>
    fc
      .shuffledSubarray(
        shape.map((_, i) => i),
        { minLength: 0 },
      )
      .chain((axes) => fc.array(fc.boolean(), { minLength: axes.length, maxLength: axes.length }).map((neg) => axes.map((a, i) => (neg[i] === true ? a - shape.length : a))))
      .chain((axes) => sample<'sum'>(tensors([t(dtype, shape)]), { axes, keepDims })),
  );
}

/** Samplers of every registry op. */
export const opSamples: OpSamplers = {
  constant: fc
    .tuple(dtypeOf(ANY), shapeOf(0, 2, 0), fc.boolean())
    .chain(([dtype, shape, splat]) => {
      const n = sizeOf(shape);
      const values = fc.array(fc.integer({ min: -16, max: 16 }).map((k) => k / 4), splat ? { minLength: 1, maxLength: 1 } : { minLength: n, maxLength: n });
      return values.map((value) => ({ operands: [], attrs: { value, shape, dtype } }));
    }),
  iota: fc
    .tuple(dtypeOf(NUMERIC), shapeOf(1, 3))
    .chain(([dtype, shape]) => axisOf(shape.length).map((axis) => ({ operands: [], attrs: { shape, axis, dtype } }))),
  randomUniform: fc.tuple(dtypeOf(FLOAT), shapeOf(0, 3, 0)).map(([dtype, shape]) => ({ operands: [], attrs: { shape, dtype } })),
  add: binary(NUMERIC, {}),
  sub: binary(NUMERIC, {}),
  mul: binary(NUMERIC, {}),
  div: binary(FLOAT, {}),
  pow: binary(FLOAT, {}),
  maximum: binary(NUMERIC, {}),
  minimum: binary(NUMERIC, {}),
  neg: unary(NUMERIC, {}),
  abs: unary(NUMERIC, {}),
  exp: unary(FLOAT, {}),
  log: unary(FLOAT, {}),
  sqrt: unary(FLOAT, {}),
  rsqrt: unary(FLOAT, {}),
  tanh: unary(FLOAT, {}),
  sigmoid: unary(FLOAT, {}),
  silu: unary(FLOAT, {}),
  gelu: fc.constantFrom('none' as const, 'tanh' as const).chain((approximate) => unary<'gelu'>(FLOAT, { approximate })),
  sin: unary(FLOAT, {}),
  cos: unary(FLOAT, {}),
  equal: binary(ANY, {}),
  notEqual: binary(ANY, {}),
  less: binary(ANY, {}),
  lessEqual: binary(ANY, {}),
  greater: binary(ANY, {}),
  greaterEqual: binary(ANY, {}),
  where: fc.tuple(dtypeOf(ANY), shapeOf(0, 3)).chain(([dtype, shape]) =>
    fc
      .tuple(partnerShape(shape), partnerShape(shape), partnerShape(shape), fc.integer({ min: 0, max: 2 }))
      .chain(([s0, s1, s2, full]) => {
        // One of the three operands keeps the full shape so the result is `shape`.
        const shapes = [s0, s1, s2];
        shapes[full] = shape;
        return sample<'where'>(tensors([t('bool', shapes[0]!), t(dtype, shapes[1]!), t(dtype, shapes[2]!)]), {});
      }),
  ),
  cast: fc
    .tuple(dtypeOf(ANY), dtypeOf(ANY), shapeOf(0, 3, 0))
    .chain(([from, to, shape]) => sample<'cast'>(tensors([t(from, shape)]), { dtype: to })),
  matmul: fc
    .tuple(dtypeOf(NUMERIC), shapeOf(0, 2), dim(), dim(0, 3), dim(), fc.boolean(), fc.boolean())
    .chain(([dtype, batch, m, k, n, transposeA, transposeB]) =>
      fc.tuple(partnerShape(batch), partnerShape(batch), fc.boolean()).chain(([ba, bb, fullLeft]) => {
        const lb = fullLeft ? batch : ba;
        const rb = fullLeft ? bb : batch;
        const a = t(dtype, [...lb, ...(transposeA ? [k, m] : [m, k])]);
        const b = t(dtype, [...rb, ...(transposeB ? [n, k] : [k, n])]);
        return sample<'matmul'>(tensors([a, b]), { transposeA, transposeB });
      }),
    ),
  linear: fc
    .tuple(dtypeOf(NUMERIC), shapeOf(0, 2), dim(0, 3), dim(), fc.boolean())
    .chain(([dtype, lead, inDim, out, bias]) =>
      sample<'linear'>(tensors([t(dtype, [...lead, inDim]), t(dtype, [out, inDim]), ...(bias ? [t(dtype, [out])] : [])]), {}),
    ),
  sum: reduction(NUMERIC),
  mean: reduction(FLOAT),
  max: reduction(NUMERIC),
  argmax: fc
    .tuple(dtypeOf(NUMERIC), shapeOf(1, 3), fc.boolean())
    .chain(([dtype, shape, keepDims]) => axisOf(shape.length).chain((axis) => sample<'argmax'>(tensors([t(dtype, shape)]), { axis, keepDims }))),
  softmax: fc
    .tuple(dtypeOf(FLOAT), shapeOf(1, 3))
    .chain(([dtype, shape]) => axisOf(shape.length).chain((axis) => sample<'softmax'>(tensors([t(dtype, shape)]), { axis }))),
  rmsNorm: fc
    .tuple(dtypeOf(FLOAT), shapeOf(1, 3), fc.boolean(), fc.constantFrom(1e-6, 1e-5, 0.1))
    .chain(([dtype, shape, weight, eps]) =>
      sample<'rmsNorm'>(tensors([t(dtype, shape), ...(weight ? [t(dtype, [shape[shape.length - 1]!])] : [])]), { eps }),
    ),
  layerNorm: fc
    .tuple(dtypeOf(FLOAT), shapeOf(1, 3), fc.integer({ min: 0, max: 2 }), fc.constantFrom(1e-5, 0.1))
    .chain(([dtype, shape, params, eps]) =>
      sample<'layerNorm'>(tensors([t(dtype, shape), ...Array.from({ length: params }, () => t(dtype, [shape[shape.length - 1]!]))]), { eps }),
    ),
  reshape: fc.tuple(dtypeOf(ANY), shapeOf(0, 3, 0)).chain(([dtype, shape]) =>
    fc.integer({ min: 0, max: 3 }).chain((how) => {
      const n = sizeOf(shape);
      const target =
        how === 0 ? [n] : how === 1 ? [1, n, 1] : how === 2 && n > 0 ? [-1] : shape.length >= 2 ? [shape[0]! * shape[1]!, ...shape.slice(2)] : [...shape, 1];
      return sample<'reshape'>(tensors([t(dtype, shape)]), { shape: target });
    }),
  ),
  transpose: fc.tuple(dtypeOf(ANY), shapeOf(0, 3)).chain(([dtype, shape]) =>
    fc
      .shuffledSubarray(
        shape.map((_, i) => i),
        { minLength: shape.length, maxLength: shape.length },
      )
      .chain((perm) => sample<'transpose'>(tensors([t(dtype, shape)]), { perm })),
  ),
  broadcastTo: fc
    .tuple(dtypeOf(ANY), shapeOf(0, 3))
    .chain(([dtype, shape]) => partnerShape(shape).chain((from) => sample<'broadcastTo'>(tensors([t(dtype, from)]), { shape }))),
  concat: fc.tuple(dtypeOf(ANY), shapeOf(1, 3), fc.array(dim(0, 3), { minLength: 1, maxLength: 3 })).chain(([dtype, shape, sizes]) =>
    axisOf(shape.length).chain((axis) => {
      const a = axis < 0 ? axis + shape.length : axis;
      const types = sizes.map((s) => t(dtype, shape.map((d, i) => (i === a ? s : d))));
      return sample<'concat'>(tensors(types), { axis });
    }),
  ),
  slice: fc.tuple(dtypeOf(ANY), shapeOf(1, 3, 0, 4)).chain(([dtype, shape]) =>
    axisOf(shape.length).chain((axis) => {
      const size = shape[axis < 0 ? axis + shape.length : axis]!;
      const bound = fc.integer({ min: -size - 2, max: size + 2 });
      return fc
        .tuple(bound, fc.option(bound, { nil: undefined }), fc.integer({ min: 1, max: 3 }))
        .chain(([start, end, step]) =>
          sample<'slice'>(tensors([t(dtype, shape)]), end === undefined ? { axis, start, step } : { axis, start, end, step }),
        );
    }),
  ),
  gather: fc.tuple(dtypeOf(ANY), shapeOf(1, 3), shapeOf(0, 2), dtypeOf(['i64', 'i32', 'i8', 'u8'])).chain(([dtype, shape, idxShape, idxType]) =>
    axisOf(shape.length).chain((axis) =>
      fc
        .tuple(arbHostTensor(t(dtype, shape)), indices(idxType, idxShape, shape[axis < 0 ? axis + shape.length : axis]!))
        .map(([table, idx]) => ({ operands: [table, idx], attrs: { axis } })),
    ),
  ),
  indexSelect: fc.tuple(dtypeOf(ANY), shapeOf(1, 3), dim(0, 4), dtypeOf(['i64', 'i32'])).chain(([dtype, shape, n, idxType]) =>
    axisOf(shape.length).chain((axis) =>
      fc
        .tuple(arbHostTensor(t(dtype, shape)), indices(idxType, [n], shape[axis < 0 ? axis + shape.length : axis]!))
        .map(([x, idx]) => ({ operands: [x, idx], attrs: { axis } })),
    ),
  ),
  scatterAdd: fc.tuple(dtypeOf(NUMERIC), shapeOf(1, 3), dim(0, 4), dtypeOf(['i64', 'i32'])).chain(([dtype, shape, n, idxType]) =>
    axisOf(shape.length).chain((axis) => {
      const a = axis < 0 ? axis + shape.length : axis;
      const upShape = shape.map((d, i) => (i === a ? n : d));
      return fc
        .tuple(arbHostTensor(t(dtype, shape)), indices(idxType, [n], shape[a]!), arbHostTensor(t(dtype, upShape)))
        .map(([x, idx, up]) => ({ operands: [x, idx, up], attrs: { axis } }));
    }),
  ),
  topk: fc.tuple(dtypeOf(NUMERIC), shapeOf(1, 3, 1, 4), fc.boolean()).chain(([dtype, shape, largest]) =>
    axisOf(shape.length).chain((axis) =>
      fc
        .integer({ min: 0, max: shape[axis < 0 ? axis + shape.length : axis]! })
        .chain((k) => sample<'topk'>(tensors([t(dtype, shape)]), { k, axis, largest })),
    ),
  ),
  rotary: fc.tuple(dtypeOf(FLOAT), shapeOf(0, 2), dim(0, 2), fc.boolean()).chain(([dtype, lead, half, interleaved]) => {
    const shape = [...lead, 2 * half];
    return fc
      .tuple(partnerShape(shape), partnerShape(shape))
      .chain(([cs, ss]) => sample<'rotary'>(tensors([t(dtype, shape), t(dtype, cs), t(dtype, ss)]), { interleaved }));
  }),
  groupedMatmul: fc
    .tuple(dtypeOf(NUMERIC), dim(0, 4), dim(0, 3), dim(), dim(1, 3), fc.boolean(), dtypeOf(['i64', 'i32', 'u8']))
    .chain(([dtype, n, k, m, e, transposeW, gType]) =>
      fc
        .tuple(arbHostTensor(t(dtype, [n, k])), arbHostTensor(t(dtype, transposeW ? [e, m, k] : [e, k, m])), indices(gType, [n], e))
        .map(([x, w, groups]) => ({ operands: [x, w, groups], attrs: { transposeW } })),
    ),
  quantizedLinear: fc
    .tuple(dtypeOf(FLOAT), shapeOf(0, 2), dim(1, 6), dim(), fc.constantFrom<4 | 8>(4, 8), fc.integer({ min: 1, max: 4 }), fc.boolean())
    .chain(([dtype, lead, inFeatures, out, bits, half, zp]) => {
      const blockSize = bits === 4 ? 2 * half : half;
      const blocks = Math.ceil(inFeatures / blockSize);
      const bb = Math.ceil((blockSize * bits) / 8);
      const zb = Math.ceil((blocks * bits) / 8);
      return sample<'quantizedLinear'>(
        tensors([t(dtype, [...lead, inFeatures]), t('u8', [out, blocks, bb]), t(dtype, [out, blocks]), ...(zp ? [t('u8', [out, zb])] : [])]),
        { bits, blockSize, inFeatures },
      );
    }),
  attention: fc
    .tuple(dtypeOf(FLOAT), shapeOf(0, 1), dim(1, 2), dim(1, 2), dim(0, 3), dim(0, 3), dim(1, 3), dim(1, 3))
    .chain(([dtype, batch, hkv, group, tq, tk, d, dv]) =>
      fc
        .tuple(fc.boolean(), fc.option(fc.constantFrom(0.5, 0.25), { nil: undefined }), fc.constantFrom('none', 'bool', 'additive'))
        .chain(([causal, scale, maskKind]) => {
          const hq = hkv * group;
          const types = [t(dtype, [...batch, hq, tq, d]), t(dtype, [...batch, hkv, tk, d]), t(dtype, [...batch, hkv, tk, dv])];
          if (maskKind === 'bool') types.push(t('bool', [tq, tk]));
          if (maskKind === 'additive') types.push(t(dtype, [hq, 1, tk]));
          return sample<'attention'>(tensors(types), scale === undefined ? { causal } : { causal, scale });
        }),
    ),
  loraBank: fc
    .tuple(dtypeOf(FLOAT), dim(1, 3), dim(1, 2), dim(1, 3), dim(1, 3), dim(1, 3), dim(1, 2), fc.constantFrom('gathered', 'grouped', 'single'))
    .chain(([dtype, rows, seq, inDim, out, slots, rank, form]) =>
      fc.integer({ min: 1, max: slots }).chain((groups) => {
        const head = tensors([t(dtype, [rows, seq, inDim]), t(dtype, [rows, seq, out]), t(dtype, [slots, rank, inDim]), t(dtype, [slots, rank, out])]);
        const index = form === 'gathered' ? indices('i64', [rows], slots) : form === 'grouped' ? indices('i64', [groups], slots) : indices('i64', [], slots);
        const select = tensors(form === 'gathered' ? [] : [t(dtype, form === 'grouped' ? [rows, groups] : [rows, 1, 1])]);
        return fc.tuple(head, index, select).map(([h, i, r]) => ({ operands: [...h, i, ...r], attrs: { form } }));
      }),
    ),
  quantizedLoraBank: fc
    .tuple(dtypeOf(FLOAT), dim(1, 3), dim(1, 2), dim(1, 3), dim(1, 3), dim(1, 3), dim(1, 2), fc.constantFrom('gathered', 'grouped', 'single'))
    .chain(([dtype, rows, seq, inDim, out, slots, rank, form]) =>
      fc.integer({ min: 1, max: slots }).chain((groups) => {
        const head = tensors([t(dtype, [rows, seq, inDim]), t(dtype, [rows, seq, out]), t('i8', [slots, rank, inDim]), t(dtype, [slots, rank]), t('i8', [slots, rank, out]), t(dtype, [slots, rank])]);
        const index = form === 'gathered' ? indices('i64', [rows], slots) : form === 'grouped' ? indices('i64', [groups], slots) : indices('i64', [], slots);
        const select = tensors(form === 'gathered' ? [] : [t(dtype, form === 'grouped' ? [rows, groups] : [rows, 1, 1])]);
        return fc.tuple(head, index, select).map(([h, i, r]) => ({ operands: [...h, i, ...r], attrs: { form } }));
      }),
    ),
  loraLinear: fc
    .tuple(dtypeOf(FLOAT), shapeOf(0, 2), dim(1, 3), dim(1, 3), dim(1, 2), fc.constantFrom(0.5, 2, 0.3), fc.boolean(), fc.boolean())
    .chain(([dtype, lead, inDim, out, rank, scale, bias, biasB]) =>
      sample<'loraLinear'>(
        tensors([t(dtype, [...lead, inDim]), t(dtype, [out, inDim]), t(dtype, [rank, inDim]), t(dtype, [out, rank]), ...(bias ? [t(dtype, [out])] : []), ...(biasB ? [t(dtype, [out])] : [])]),
        biasB ? { scale, loraBias: true } : { scale },
      ),
    ),
  gatheredLoraLinear: fc
    .tuple(dtypeOf(FLOAT), dim(1, 3), dim(1, 2), dim(1, 3), dim(1, 3), dim(1, 3), dim(1, 2), fc.boolean())
    .chain(([dtype, batch, seq, inDim, out, adapters, rank, bias]) =>
      fc
        .tuple(
          tensors([t(dtype, [batch, seq, inDim]), t(dtype, [out, inDim]), t(dtype, [adapters, rank, inDim]), t(dtype, [adapters, out, rank]), t(dtype, [adapters])]),
          indices('i64', [batch], adapters),
          tensors(bias ? [t(dtype, [out])] : []),
        )
        .map(([head, ids, tail]) => ({ operands: [...head, ids, ...tail], attrs: {} })),
    ),
  loraScatterAdd: fc
    .tuple(dtypeOf(FLOAT), dim(1, 3), shapeOf(0, 1), dim(1, 3), dim(1, 3), dim(1, 2), dim(0, 3), fc.constantFrom(0.5, 2), fc.boolean())
    .chain(([dtype, n, mid, inDim, out, rank, k, scale, biasB]) =>
      fc
        .tuple(
          tensors([t(dtype, [n, ...mid, out]), t(dtype, [n, ...mid, inDim])]),
          indices('i64', [k], n),
          tensors([t(dtype, [rank, inDim]), t(dtype, [out, rank]), ...(biasB ? [t(dtype, [out])] : [])]),
        )
        .map(([head, rows, tail]) => ({ operands: [...head, rows, ...tail], attrs: { scale } })),
    ),
  groupedLoraMatmul: fc
    .tuple(dtypeOf(FLOAT), dim(0, 4), dim(1, 3), dim(1, 3), dim(1, 3), dim(1, 2), fc.boolean(), fc.constantFrom(0.5, 2))
    .chain(([dtype, n, k, m, e, rank, transposeW, scale]) =>
      fc
        .tuple(tensors([t(dtype, [n, k]), t(dtype, transposeW ? [e, m, k] : [e, k, m]), t(dtype, [e, rank, k]), t(dtype, [e, m, rank])]), indices('i64', [n], e))
        .map(([head, groups]) => ({ operands: [...head, groups], attrs: { transposeW, scale } })),
    ),
  loraBankLinear: fc
    .tuple(dtypeOf(FLOAT), dim(1, 3), dim(1, 2), dim(1, 3), dim(1, 3), dim(1, 3), dim(1, 2), fc.constantFrom('gathered', 'grouped', 'single'), fc.boolean())
    .chain(([dtype, rows, seq, inDim, out, slots, rank, form, bias]) =>
      fc.integer({ min: 1, max: slots }).chain((groups) => {
        const head = tensors([t(dtype, [rows, seq, inDim]), t(dtype, [out, inDim]), t(dtype, [slots, rank, inDim]), t(dtype, [slots, rank, out])]);
        const index = form === 'gathered' ? indices('i64', [rows], slots) : form === 'grouped' ? indices('i64', [groups], slots) : indices('i64', [], slots);
        const select = tensors(form === 'gathered' ? [] : [t(dtype, form === 'grouped' ? [rows, groups] : [rows, 1, 1])]);
        const tail = tensors(bias ? [t(dtype, [out])] : []);
        return fc.tuple(head, index, select, tail).map(([h, i, r, k]) => ({ operands: [...h, i, ...r, ...k], attrs: { form } }));
      }),
    ),
  skipRmsNorm: fc
    .tuple(dtypeOf(FLOAT), shapeOf(1, 3), fc.boolean(), fc.constantFrom(1e-6, 1e-5, 0.1))
    .chain(([dtype, shape, weight, eps]) =>
      sample<'skipRmsNorm'>(tensors([t(dtype, shape), t(dtype, shape), ...(weight ? [t(dtype, [shape[shape.length - 1]!])] : [])]), { eps }),
    ),
  cachedAttention: fc
    .tuple(dtypeOf(FLOAT), shapeOf(0, 1), dim(1, 2), dim(1, 2), dim(1, 3), dim(0, 3), dim(1, 3), dim(1, 3))
    .chain(([dtype, batch, hkv, group, tq, past, d, dv]) =>
      fc
        .tuple(fc.boolean(), fc.option(fc.constantFrom(0.5, 0.25), { nil: undefined }), fc.constantFrom('none', 'bool', 'additive'))
        .chain(([causal, scale, maskKind]) => {
          const hq = hkv * group;
          const tk = past + tq;
          const types = [
            t(dtype, [...batch, hq, tq, d]),
            t(dtype, [...batch, past, hkv, d]),
            t(dtype, [...batch, past, hkv, dv]),
            t(dtype, [...batch, hkv, tq, d]),
            t(dtype, [...batch, hkv, tq, dv]),
          ];
          if (maskKind === 'bool') types.push(t('bool', [tq, tk]));
          if (maskKind === 'additive') types.push(t(dtype, [hq, 1, tk]));
          return sample<'cachedAttention'>(tensors(types), scale === undefined ? { causal } : { causal, scale });
        }),
    ),
};
