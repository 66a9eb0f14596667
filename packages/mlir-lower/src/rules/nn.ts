import { type Dim, type TensorType, dimDivExact, dimEquals, dimToString } from '@stageml/ir';
import { type ValueRef, broadcastMap, identityMap } from '../emitter.js';
import { LowerCode, LowerError } from '../errors.js';
import type { MlirRuleFn } from '../rule.js';
import { scalarBinary, scalarSelect, scalarUnary } from '../scalar.js';
import { elementType } from '../types.js';
import { multiplyAccumulate } from './linalg.js';
import { dimAsFloat, lowest, reduceAxes } from './reduce.js';

/**
 * y = softmax(q·kᵀ·scale + mask) · v over [..., heads, seq, dim], as six generics: scores
 * (contraction over the head dim, kv head = h floordiv (hq/hkv) in the map, so grouped-query heads
 * need no copies), scale + mask + causality (key j visible to query i iff j ≤ i + tk − tq),
 * row max, exp, row sum, then Σⱼ eⱼ·v / Σⱼ eⱼ. Fully masked rows and tk = 0 give NaN, as in the
 * reference.
 */
export const attentionRule: MlirRuleFn<'attention'> = ({ e, attrs, operands, results, names }) => {
  const [q, k, v, mask] = operands as [ValueRef, ValueRef, ValueRef, ValueRef | undefined];
  const out = results[0]!;
  const dtype = out.dtype;
  const name = names[0]!;
  const r = q.type.shape.length;
  const nb = r - 3;
  const [hq, tq, d] = q.type.shape.slice(nb) as [Dim, Dim, Dim];
  const [hkv, tk] = k.type.shape.slice(nb) as [Dim, Dim];
  const group = dimEquals(hq, hkv) ? 1 : dimDivExact(hq, hkv);
  if (typeof group !== 'number') {
    throw new LowerError(LowerCode.UNSUPPORTED_OP, `cannot lower sml.attention (%${name}) to MLIR: the query/kv head ratio ${dimToString(hq)}/${dimToString(hkv)} is not a known integer`);
  }
  const batch = identityMap(nb);
  const [h, i, j, p] = [nb, nb + 1, nb + 2, nb + 3].map((n) => `d${String(n)}`) as [string, string, string, string];
  const kvHead = group === 1 ? h : `${h} floordiv ${String(group)}`;
  const scoresType: TensorType = { dtype, shape: [...q.type.shape.slice(0, nb), hq, tq, tk] };
  const [dots] = e.generic(
    {
      loops: nb + 4,
      reductions: [nb + 3],
      ins: [
        { value: q, map: [...batch, h, i, p] },
        { value: k, map: [...batch, kvHead, j, p] },
      ],
      outs: [{ value: e.filled(scoresType, 0, `${name}_dots_init`), map: [...batch, h, i, j] }],
      body: ([a, b, acc]) => [multiplyAccumulate(e, dtype, a!, b!, acc!)],
    },
    `${name}_dots`,
  );
  const scale =
    attrs.scale !== undefined
      ? e.constant(dtype, attrs.scale)
      : typeof d === 'number'
        ? e.constant(dtype, 1 / Math.sqrt(d))
        : e.let(`arith.divf ${e.constant(dtype, 1)}, ${scalarUnary(e, 'sqrt', dtype, dimAsFloat(e, d, dtype))} : ${elementType(dtype)}`);
  const rs = nb + 3;
  const [scores] = e.generic(
    {
      loops: rs,
      ins: [{ value: dots!, map: identityMap(rs) }, ...(mask === undefined ? [] : [{ value: mask, map: broadcastMap(mask.type.shape, scoresType.shape) }])],
      outs: [{ value: e.empty(scoresType, `${name}_scores_init`), map: identityMap(rs) }],
      body: ([dot, m]) => {
        let s = scalarBinary(e, 'mul', dtype, dot!, scale);
        const minusInf = e.constant(dtype, Number.NEGATIVE_INFINITY);
        if (mask !== undefined) s = mask.type.dtype === 'bool' ? scalarSelect(e, m!, s, minusInf, dtype) : scalarBinary(e, 'add', dtype, s, m!);
        if (attrs.causal) {
          const qi = e.let(`linalg.index ${String(nb + 1)} : index`);
          const kj = e.let(`linalg.index ${String(nb + 2)} : index`);
          const limit = e.let(`arith.subi ${e.let(`arith.addi ${qi}, ${e.dim(tk)} : index`)}, ${e.dim(tq)} : index`);
          const visible = e.let(`arith.cmpi sle, ${kj}, ${limit} : index`);
          s = scalarSelect(e, visible, s, minusInf, dtype);
        }
        return [s];
      },
    },
    `${name}_scores`,
  );
  const rows = identityMap(rs - 1);
  const m = reduceAxes(e, scores!, [rs - 1], lowest(dtype), (acc, x) => scalarBinary(e, 'maximum', dtype, acc, x), `${name}_max`);
  const [exps] = e.generic(
    {
      loops: rs,
      ins: [
        { value: scores!, map: identityMap(rs) },
        { value: m, map: rows },
      ],
      outs: [{ value: e.empty(scoresType, `${name}_exp_init`), map: identityMap(rs) }],
      body: ([s, mx]) => [scalarUnary(e, 'exp', dtype, scalarBinary(e, 'sub', dtype, s!, mx!))],
    },
    `${name}_exp`,
  );
  const total = reduceAxes(e, exps!, [rs - 1], 0, (acc, x) => scalarBinary(e, 'add', dtype, acc, x), `${name}_total`);
  // Weighted sum over keys: loops (batch…, h, i, c, j) with j the reduction.
  const [c, jj] = [`d${String(nb + 2)}`, `d${String(nb + 3)}`];
  const [weighted] = e.generic(
    {
      loops: nb + 4,
      reductions: [nb + 3],
      ins: [
        { value: exps!, map: [...batch, h, i, jj] },
        { value: v, map: [...batch, kvHead, jj, c] },
      ],
      outs: [{ value: e.filled(out, 0, `${name}_sum_init`), map: [...batch, h, i, c] }],
      body: ([w, x, acc]) => [multiplyAccumulate(e, dtype, w!, x!, acc!)],
    },
    `${name}_sum`,
  );
  return e.generic(
    {
      loops: rs,
      ins: [
        { value: weighted!, map: identityMap(rs) },
        { value: total, map: rows },
      ],
      outs: [{ value: e.empty(out, `${name}_init`), map: identityMap(rs) }],
      body: ([num, den]) => [scalarBinary(e, 'div', dtype, num!, den!)],
    },
    name,
  );
};
