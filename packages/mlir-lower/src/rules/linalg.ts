import { type DType, type TensorType, dimEquals, isFloatDType } from '@stageml/ir';
import { type FunctionEmitter, type ValueRef, broadcastMap, identityMap } from '../emitter.js';
import type { MlirRuleFn } from '../rule.js';
import { toIndex } from '../scalar.js';
import { elementType, tensorTypeOf } from '../types.js';

/** acc + a·b on scalars of `dtype` (the body of every contraction). */
export function multiplyAccumulate(e: FunctionEmitter, dtype: DType, a: string, b: string, acc: string): string {
  const t = elementType(dtype);
  const f = isFloatDType(dtype) ? 'f' : 'i';
  const p = e.let(`arith.mul${f} ${a}, ${b} : ${t}`);
  return e.let(`arith.add${f} ${acc}, ${p} : ${t}`);
}

function namedContraction(e: FunctionEmitter, op: string, a: ValueRef, b: ValueRef, init: ValueRef, hint: string): ValueRef {
  const t = tensorTypeOf(init.type);
  return {
    ssa: e.def(hint, `linalg.${op} ins(${a.ssa}, ${b.ssa} : ${tensorTypeOf(a.type)}, ${tensorTypeOf(b.type)}) outs(${init.ssa} : ${t}) -> ${t}`),
    type: init.type,
  };
}

/**
 * y = op(a)·op(b) batched over leading dims with broadcasting. Plain 2-D and equal-batch 3-D
 * products use the named ops (`linalg.matmul`, `matmul_transpose_a/b`, `batch_matmul…`); any other
 * combination (broadcast batch dims, both flags) is one `linalg.generic` contraction whose maps
 * encode the transposes and the broadcasting.
 */
export const matmulRule: MlirRuleFn<'matmul'> = ({ e, attrs, operands, results, names }) => {
  const [a, b] = operands as [ValueRef, ValueRef];
  const out = results[0]!;
  const name = names[0]!;
  const ra = a.type.shape.length;
  const rb = b.type.shape.length;
  const init = e.filled(out, 0, `${name}_init`);
  const ta = attrs.transposeA;
  const tb = attrs.transposeB;
  if (!(ta && tb) && ra === rb && (ra === 2 || (ra === 3 && dimEquals(a.type.shape[0]!, b.type.shape[0]!)))) {
    const base = ra === 2 ? 'matmul' : 'batch_matmul';
    return [namedContraction(e, `${base}${ta ? '_transpose_a' : tb ? '_transpose_b' : ''}`, a, b, init, name)];
  }
  const batch = out.shape.slice(0, -2);
  const nb = batch.length;
  const [i, j, k] = [`d${String(nb)}`, `d${String(nb + 1)}`, `d${String(nb + 2)}`];
  const aMap = [...broadcastMap(a.type.shape.slice(0, -2), batch), ...(ta ? [k, i] : [i, k])];
  const bMap = [...broadcastMap(b.type.shape.slice(0, -2), batch), ...(tb ? [j, k] : [k, j])];
  return e.generic(
    {
      loops: nb + 3,
      reductions: [nb + 2],
      ins: [
        { value: a, map: aMap },
        { value: b, map: bMap },
      ],
      outs: [{ value: init, map: identityMap(nb + 2) }],
      body: ([x, y, acc]) => [multiplyAccumulate(e, out.dtype, x!, y!, acc!)],
    },
    name,
  );
};

/**
 * y = x·wᵀ + bias. The accumulator starts as the bias broadcast over rows (`linalg.broadcast`), or
 * zero; rank-2 x is `linalg.matmul_transpose_b`, other ranks one contraction over the last axis.
 */
export const linearRule: MlirRuleFn<'linear'> = ({ e, operands, results, names }) => {
  const [x, w, bias] = operands as [ValueRef, ValueRef, ValueRef | undefined];
  const out = results[0]!;
  const name = names[0]!;
  const rank = out.shape.length;
  let init: ValueRef;
  if (bias === undefined) init = e.filled(out, 0, `${name}_init`);
  else if (rank === 1) init = bias;
  else {
    const empty = e.empty(out, `${name}_init`);
    const dims = Array.from({ length: rank - 1 }, (_, i) => i).join(', ');
    const t = tensorTypeOf(out);
    init = { ssa: e.def(`${name}_bias`, `linalg.broadcast ins(${bias.ssa} : ${tensorTypeOf(bias.type)}) outs(${empty.ssa} : ${t}) dimensions = [${dims}]`), type: out };
  }
  if (rank === 2) return [namedContraction(e, 'matmul_transpose_b', x, w, init, name)];
  const lead = rank - 1;
  const o = `d${String(lead)}`;
  const k = `d${String(lead + 1)}`;
  return e.generic(
    {
      loops: lead + 2,
      reductions: [lead + 1],
      ins: [
        { value: x, map: [...identityMap(lead), k] },
        { value: w, map: [o, k] },
      ],
      outs: [{ value: init, map: identityMap(lead + 1) }],
      body: ([xv, wv, acc]) => [multiplyAccumulate(e, out.dtype, xv!, wv!, acc!)],
    },
    name,
  );
};

/**
 * y[n, m] = Σ_k x[n, k] · w[g_n, k, m] (transposeW: w[g_n, m, k]): one contraction over (n, m, k)
 * whose body reads the row's expert matrix with `tensor.extract` at the group index, so every row
 * uses its own expert without materializing per-row weights. Group ids must be in range (as for
 * `tensor.extract`, out-of-range ids are undefined behaviour rather than an error).
 */
export const groupedMatmulRule: MlirRuleFn<'groupedMatmul'> = ({ e, attrs, operands, results, names }) => {
  const [x, w, g] = operands as [ValueRef, ValueRef, ValueRef];
  const out: TensorType = results[0]!;
  const name = names[0]!;
  const init = e.filled(out, 0, `${name}_init`);
  return e.generic(
    {
      loops: 3,
      reductions: [2],
      ins: [
        { value: x, map: ['d0', 'd2'] },
        { value: g, map: ['d0'] },
      ],
      outs: [{ value: init, map: ['d0', 'd1'] }],
      body: ([xv, gv, acc]) => {
        const expert = toIndex(e, g.type.dtype, gv!);
        const m = e.let('linalg.index 1 : index');
        const k = e.let('linalg.index 2 : index');
        const idx = attrs.transposeW ? [expert, m, k] : [expert, k, m];
        const wv = e.let(`tensor.extract ${w.ssa}[${idx.join(', ')}] : ${tensorTypeOf(w.type)}`);
        return [multiplyAccumulate(e, out.dtype, xv!, wv, acc!)];
      },
    },
    name,
  );
};
