import { type DType, type TensorType, isFloatDType, normalizeAxis } from '@stageml/ir';
import { type FunctionEmitter, identityMap } from '../emitter.js';
import type { MlirRuleFn } from '../rule.js';
import { indexTo, scalarCompare, scalarIsNan, scalarSelect } from '../scalar.js';
import { elementType } from '../types.js';

/**
 * Whether element a (at position p) is ordered before element b (at q) in top-k order: larger
 * (smaller) first, NaN above +∞ in both orders (as `torch.topk`), ties by the lower index.
 */
function before(e: FunctionEmitter, dtype: DType, largest: boolean, a: string, b: string, p: string, q: string): string {
  const lowerIndex = e.let(`arith.cmpi ult, ${p}, ${q} : index`);
  if (!isFloatDType(dtype)) {
    const wins = scalarCompare(e, largest ? 'greater' : 'less', dtype, a, b);
    const tie = scalarCompare(e, 'equal', dtype, a, b);
    return e.let(`arith.ori ${wins}, ${e.let(`arith.andi ${tie}, ${lowerIndex} : i1`)} : i1`);
  }
  const t = elementType(dtype);
  const inf = e.constant(dtype, Number.POSITIVE_INFINITY);
  const na = scalarIsNan(e, dtype, a);
  const nb = scalarIsNan(e, dtype, b);
  const ka = scalarSelect(e, na, inf, a, dtype);
  const kb = scalarSelect(e, nb, inf, b, dtype);
  const wins = e.let(`arith.cmpf ${largest ? 'ogt' : 'olt'}, ${ka}, ${kb} : ${t}`);
  const keyTie = e.let(`arith.cmpf oeq, ${ka}, ${kb} : ${t}`);
  // Among equal keys (+∞ vs NaN), NaN is larger: it wins for largest, loses for smallest.
  const nanWins = e.let(`arith.cmpi ${largest ? 'ugt' : 'ult'}, ${na}, ${nb} : i1`);
  const nanTie = e.let(`arith.cmpi eq, ${na}, ${nb} : i1`);
  const byNan = e.let(`arith.andi ${keyTie}, ${nanWins} : i1`);
  const byIndex = e.let(`arith.andi ${e.let(`arith.andi ${keyTie}, ${nanTie} : i1`)}, ${lowerIndex} : i1`);
  return e.let(`arith.ori ${e.let(`arith.ori ${wins}, ${byNan} : i1`)}, ${byIndex} : i1`);
}

/**
 * (values, indices) = the k first elements in top-k order along an axis, without sorting: the
 * rank of each element (how many elements come before it) is one reduction over pairs, and slot s
 * of the result takes the element whose rank is s (ranks are a permutation, so exactly one
 * matches). O(n²) per row, which suits router widths (experts) and small vocabularies.
 */
export const topkRule: MlirRuleFn<'topk'> = ({ e, attrs, operands, results, names }) => {
  const x = operands[0]!;
  const dtype = x.type.dtype;
  const rank = x.type.shape.length;
  const axis = normalizeAxis(attrs.axis, rank);
  const [valuesType, indicesType] = results as [TensorType, TensorType];
  const inner = `d${String(rank)}`;
  const alongInner = identityMap(rank).map((d, i) => (i === axis ? inner : d));
  const rankType: TensorType = { dtype: 'i64', shape: x.type.shape };
  const [order] = e.generic(
    {
      loops: rank + 1,
      reductions: [rank],
      ins: [
        { value: x, map: identityMap(rank) },
        { value: x, map: alongInner },
      ],
      outs: [{ value: e.filled(rankType, 0, `${names[0]!}_rank_init`), map: identityMap(rank) }],
      body: ([self, other, count]) => {
        const p = e.let(`linalg.index ${String(rank)} : index`);
        const q = e.let(`linalg.index ${String(axis)} : index`);
        const isBefore = before(e, dtype, attrs.largest, other!, self!, p, q);
        const one = e.let(`arith.extui ${isBefore} : i1 to i64`);
        return [e.let(`arith.addi ${count!}, ${one} : i64`)];
      },
    },
    `${names[0]!}_rank`,
  );
  const picked = e.generic(
    {
      loops: rank + 1,
      reductions: [rank],
      ins: [
        { value: x, map: alongInner },
        { value: order!, map: alongInner },
      ],
      outs: [
        { value: e.filled(valuesType, 0, `${names[0]!}_init`), map: identityMap(rank) },
        { value: e.filled(indicesType, 0, `${names[1]!}_init`), map: identityMap(rank) },
      ],
      body: ([v, r, accV, accI]) => {
        const slot = indexTo(e, 'i64', e.let(`linalg.index ${String(axis)} : index`));
        const hit = e.let(`arith.cmpi eq, ${r!}, ${slot} : i64`);
        const j = indexTo(e, 'i64', e.let(`linalg.index ${String(rank)} : index`));
        return [scalarSelect(e, hit, v!, accV!, dtype), scalarSelect(e, hit, j, accI!, 'i64')];
      },
    },
    names[0]!,
  );
  return picked;
};
