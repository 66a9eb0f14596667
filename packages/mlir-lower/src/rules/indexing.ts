import { type TensorType, allocData, normalizeAxis, rounderFor, sizeOf } from '@stageml/ir';
import { type ValueRef, identityMap } from '../emitter.js';
import type { MlirRuleFn } from '../rule.js';
import { indexTo, scalarBinary, toIndex } from '../scalar.js';
import { tensorTypeOf } from '../types.js';
import { sliceSpec } from './shape.js';

/** y = literal values: a `dense<…>` (or the module's large-constant form), rounded to the dtype. */
export const constantRule: MlirRuleFn<'constant'> = ({ attrs, results, names, literal }) => {
  const type = results[0]!;
  const shape = type.shape as number[];
  const n = sizeOf(shape);
  const data = allocData(type.dtype, n);
  const round = rounderFor(type.dtype);
  for (let i = 0; i < n; i++) data[i] = round(attrs.value.length === 1 ? attrs.value[0]! : attrs.value[i]!);
  return [literal({ dtype: type.dtype, shape, data }, names[0]!)];
};

/** y[i…] = i_axis: a `linalg.generic` with no inputs writing `linalg.index`. */
export const iotaRule: MlirRuleFn<'iota'> = ({ e, attrs, results, names }) => {
  const out = results[0]!;
  const rank = out.shape.length;
  const axis = normalizeAxis(attrs.axis, rank);
  return e.generic(
    {
      loops: rank,
      ins: [],
      outs: [{ value: e.empty(out, `${names[0]!}_init`), map: identityMap(rank) }],
      body: () => [indexTo(e, out.dtype, e.let(`linalg.index ${String(axis)} : index`))],
    },
    names[0]!,
  );
};

/**
 * y[a…, i…, b…] = table[a…, indices[i…], b…]: a `linalg.generic` over the result that reads the
 * index operand through its map and the table with `tensor.extract` (out-of-range indices are
 * undefined behaviour, as for `tensor.extract`).
 */
export const gatherRule: MlirRuleFn<'gather'> = ({ e, attrs, operands, results, names }) => {
  const [table, idx] = operands as [ValueRef, ValueRef];
  const out = results[0]!;
  const rank = out.shape.length;
  const axis = normalizeAxis(attrs.axis, table.type.shape.length);
  const ri = idx.type.shape.length;
  return e.generic(
    {
      loops: rank,
      ins: [{ value: idx, map: identityMap(ri, axis) }],
      outs: [{ value: e.empty(out, `${names[0]!}_init`), map: identityMap(rank) }],
      body: ([iv]) => {
        const at = toIndex(e, idx.type.dtype, iv!);
        const coords = table.type.shape.map((_, k) => (k < axis ? e.let(`linalg.index ${String(k)} : index`) : k === axis ? at : e.let(`linalg.index ${String(k - 1 + ri)} : index`)));
        return [e.let(`tensor.extract ${table.ssa}[${coords.join(', ')}] : ${tensorTypeOf(table.type)}`)];
      },
    },
    names[0]!,
  );
};

/** y[…, j, …] = x[…, index[j], …] along an axis (a gather with a 1-D index). */
export const indexSelectRule: MlirRuleFn<'indexSelect'> = ({ e, attrs, operands, results, names }) => {
  const [x, idx] = operands as [ValueRef, ValueRef];
  const out = results[0]!;
  const rank = out.shape.length;
  const axis = normalizeAxis(attrs.axis, rank);
  return e.generic(
    {
      loops: rank,
      ins: [{ value: idx, map: [`d${String(axis)}`] }],
      outs: [{ value: e.empty(out, `${names[0]!}_init`), map: identityMap(rank) }],
      body: ([iv]) => {
        const at = toIndex(e, idx.type.dtype, iv!);
        const coords = x.type.shape.map((_, k) => (k === axis ? at : e.let(`linalg.index ${String(k)} : index`)));
        return [e.let(`tensor.extract ${x.ssa}[${coords.join(', ')}] : ${tensorTypeOf(x.type)}`)];
      },
    },
    names[0]!,
  );
};

/**
 * y = x; y[…, index[j], …] += updates[…, j, …] for j in order: an `scf.for` over j carrying the
 * accumulator, each step adding one slab (`extract_slice` + `linalg.generic` + `insert_slice`), so
 * repeated indices accumulate and the cost is linear in the updates. Indices must be in range.
 */
export const scatterAddRule: MlirRuleFn<'scatterAdd'> = ({ e, attrs, operands, results, names }) => {
  const [x, idx, up] = operands as [ValueRef, ValueRef, ValueRef];
  const out = results[0]!;
  const rank = out.shape.length;
  const axis = normalizeAxis(attrs.axis, rank);
  const slab: TensorType = { dtype: out.dtype, shape: out.shape.map((d, i) => (i === axis ? 1 : d)) };
  const name = e.fresh(names[0]!);
  const j = e.temp();
  const acc = e.temp();
  const t = tensorTypeOf(out);
  e.nested(
    `${name} = scf.for ${j} = ${e.index(0)} to ${e.dim(idx.type.shape[0]!)} step ${e.index(1)} iter_args(${acc} = ${x.ssa}) -> (${t}) {`,
    () => {
      const iv = e.let(`tensor.extract ${idx.ssa}[${j}] : ${tensorTypeOf(idx.type)}`);
      const at = toIndex(e, idx.type.dtype, iv);
      const st = tensorTypeOf(slab);
      const u = e.let(`tensor.extract_slice ${up.ssa}${sliceSpec(e, rank, axis, j, slab.shape)} : ${tensorTypeOf(up.type)} to ${st}`);
      const a = e.let(`tensor.extract_slice ${acc}${sliceSpec(e, rank, axis, at, slab.shape)} : ${t} to ${st}`);
      const [sum] = e.generic(
        {
          loops: rank,
          ins: [{ value: { ssa: u, type: slab }, map: identityMap(rank) }],
          outs: [{ value: { ssa: a, type: slab }, map: identityMap(rank) }],
          body: ([uv, av]) => [scalarBinary(e, 'add', out.dtype, av!, uv!)],
        },
        `${names[0]!}_step`,
      );
      const next = e.let(`tensor.insert_slice ${sum!.ssa} into ${acc}${sliceSpec(e, rank, axis, at, slab.shape)} : ${st} into ${t}`);
      e.line(`scf.yield ${next} : ${t}`);
    },
    '}',
  );
  return [{ ssa: name, type: out }];
};
