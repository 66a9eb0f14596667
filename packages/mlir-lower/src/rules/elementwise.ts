import type { OpKey, TensorType } from '@stageml/ir';
import { type FunctionEmitter, type ValueRef, broadcastMap, identityMap } from '../emitter.js';
import type { MlirRuleFn } from '../rule.js';
import { type ScalarBinary, type ScalarCompare, type ScalarUnary, scalarBinary, scalarCast, scalarCompare, scalarSelect, scalarUnary } from '../scalar.js';

/**
 * y[i] = f(x₀[b₀(i)], x₁[b₁(i)], …): one `linalg.generic` over the output with NumPy broadcasting
 * expressed in the operands' indexing maps (a static 1 facing a larger dim reads index 0).
 */
export function mapElementwise(e: FunctionEmitter, operands: readonly ValueRef[], out: TensorType, hint: string, f: (args: readonly string[]) => string): ValueRef {
  const rank = out.shape.length;
  return e.generic(
    {
      loops: rank,
      ins: operands.map((v) => ({ value: v, map: broadcastMap(v.type.shape, out.shape) })),
      outs: [{ value: e.empty(out, `${hint}_init`), map: identityMap(rank) }],
      body: (args) => [f(args)],
    },
    hint,
  )[0]!;
}

/** A binary arithmetic op with broadcasting (`arith.addf` / `arith.addi`, …). */
export function binaryRule(op: ScalarBinary): MlirRuleFn<OpKey> {
  return ({ e, operands, results, names }) => {
    const dtype = operands[0]!.type.dtype;
    return [mapElementwise(e, operands, results[0]!, names[0]!, ([a, b]) => scalarBinary(e, op, dtype, a!, b!))];
  };
}

/** A unary op (`arith.negf`, `math.exp`, …). */
export function unaryRule(op: ScalarUnary): MlirRuleFn<OpKey> {
  return ({ e, operands, results, names }) => {
    const dtype = operands[0]!.type.dtype;
    return [mapElementwise(e, operands, results[0]!, names[0]!, ([x]) => scalarUnary(e, op, dtype, x!))];
  };
}

/** A comparison with broadcasting, giving `i1` (`arith.cmpf` / `arith.cmpi`). */
export function compareRule(op: ScalarCompare): MlirRuleFn<OpKey> {
  return ({ e, operands, results, names }) => {
    const dtype = operands[0]!.type.dtype;
    return [mapElementwise(e, operands, results[0]!, names[0]!, ([a, b]) => scalarCompare(e, op, dtype, a!, b!))];
  };
}

/** y = cond ? a : b with broadcasting (`arith.select`). */
export const whereRule: MlirRuleFn<'where'> = ({ e, operands, results, names }) => [
  mapElementwise(e, operands, results[0]!, names[0]!, ([c, a, b]) => scalarSelect(e, c!, a!, b!, results[0]!.dtype)),
];

/** y = dtype(x) (`arith.extf`/`truncf`/`sitofp`/`fptosi`/…, see `scalarCast`). */
export const castRule: MlirRuleFn<'cast'> = ({ e, operands, results, names }) => {
  const from = operands[0]!.type.dtype;
  const to = results[0]!.dtype;
  if (from === to) return [operands[0]!];
  return [mapElementwise(e, operands, results[0]!, names[0]!, ([x]) => scalarCast(e, from, to, x!))];
};

/** GELU, exact (`math.erf`) or tanh-approximated. */
export const geluRule: MlirRuleFn<'gelu'> = ({ e, attrs, operands, results, names }) => {
  const dtype = operands[0]!.type.dtype;
  const op: ScalarUnary = attrs.approximate === 'tanh' ? 'geluTanh' : 'gelu';
  return [mapElementwise(e, operands, results[0]!, names[0]!, ([x]) => scalarUnary(e, op, dtype, x!))];
};

/** y = x broadcast to a shape: a copy whose input map reads index 0 along stretched dims. */
export const broadcastToRule: MlirRuleFn<'broadcastTo'> = ({ e, operands, results, names }) => [mapElementwise(e, operands, results[0]!, names[0]!, ([x]) => x!)];
