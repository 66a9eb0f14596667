import { type DType, isFloatDType } from '@stageml/ir';
import type { FunctionEmitter } from './emitter.js';
import { bitWidth, elementType, isUnsigned } from './types.js';

/** Binary arithmetic an op body can ask for. */
export type ScalarBinary = 'add' | 'sub' | 'mul' | 'div' | 'pow' | 'maximum' | 'minimum';

/** Unary functions an op body can ask for. */
export type ScalarUnary = 'neg' | 'abs' | 'exp' | 'log' | 'sqrt' | 'rsqrt' | 'tanh' | 'sigmoid' | 'silu' | 'gelu' | 'geluTanh' | 'sin' | 'cos';

/** Comparisons, named as the IR's comparison ops. */
export type ScalarCompare = 'equal' | 'notEqual' | 'less' | 'lessEqual' | 'greater' | 'greaterEqual';

/** A scalar constant of `dtype` (hoisted to the function prologue). */
export function scalarConst(e: FunctionEmitter, dtype: DType, v: number): string {
  return e.constant(dtype, v);
}

/**
 * One binary op on scalars of `dtype`: `arith.addf`/`arith.addi`, … Maximum and minimum propagate
 * NaN (`arith.maximumf`), as the IR defines them; on integers they honour `u8`'s signedness.
 */
export function scalarBinary(e: FunctionEmitter, op: ScalarBinary, dtype: DType, a: string, b: string): string {
  const t = elementType(dtype);
  const float = isFloatDType(dtype);
  const u = isUnsigned(dtype);
  switch (op) {
    case 'add':
      return e.let(`arith.add${float ? 'f' : 'i'} ${a}, ${b} : ${t}`);
    case 'sub':
      return e.let(`arith.sub${float ? 'f' : 'i'} ${a}, ${b} : ${t}`);
    case 'mul':
      return e.let(`arith.mul${float ? 'f' : 'i'} ${a}, ${b} : ${t}`);
    case 'div':
      return e.let(float ? `arith.divf ${a}, ${b} : ${t}` : `arith.div${u ? 'ui' : 'si'} ${a}, ${b} : ${t}`);
    case 'pow':
      if (isNarrowFloat(dtype)) {
        const wa = e.let(`arith.extf ${a} : ${t} to f32`);
        const wb = e.let(`arith.extf ${b} : ${t} to f32`);
        return e.let(`arith.truncf ${e.let(`math.powf ${wa}, ${wb} : f32`)} : f32 to ${t}`);
      }
      return e.let(`math.powf ${a}, ${b} : ${t}`);
    case 'maximum':
      return e.let(float ? `arith.maximumf ${a}, ${b} : ${t}` : `arith.max${u ? 'ui' : 'si'} ${a}, ${b} : ${t}`);
    case 'minimum':
      return e.let(float ? `arith.minimumf ${a}, ${b} : ${t}` : `arith.min${u ? 'ui' : 'si'} ${a}, ${b} : ${t}`);
  }
}

function sigmoid(e: FunctionEmitter, t: string, dtype: DType, x: string): string {
  // σ(x) = 1 / (1 + e^(−x)): e^(−x) overflows to +∞ for very negative x, giving the exact limit 0.
  const negx = e.let(`arith.negf ${x} : ${t}`);
  const ex = e.let(`math.exp ${negx} : ${t}`);
  const den = e.let(`arith.addf ${ex}, ${scalarConst(e, dtype, 1)} : ${t}`);
  return e.let(`arith.divf ${scalarConst(e, dtype, 1)}, ${den} : ${t}`);
}

/** Whether a dtype is a 16-bit float (its math is computed in f32). */
function isNarrowFloat(dtype: DType): boolean {
  return dtype === 'f16' || dtype === 'bf16';
}

/**
 * One unary function on a scalar of `dtype` (math dialect for transcendental functions). On f16
 * and bf16 the function is computed in f32 and rounded once, as the reference rounds an exact
 * result (and because libm and LLVM have no 16-bit transcendental functions).
 */
export function scalarUnary(e: FunctionEmitter, op: ScalarUnary, dtype: DType, x: string): string {
  if (isNarrowFloat(dtype) && op !== 'neg' && op !== 'abs') {
    const t = elementType(dtype);
    const wide = e.let(`arith.extf ${x} : ${t} to f32`);
    return e.let(`arith.truncf ${unaryAt(e, op, 'f32', wide)} : f32 to ${t}`);
  }
  return unaryAt(e, op, dtype, x);
}

function unaryAt(e: FunctionEmitter, op: ScalarUnary, dtype: DType, x: string): string {
  const t = elementType(dtype);
  switch (op) {
    case 'neg':
      return isFloatDType(dtype) ? e.let(`arith.negf ${x} : ${t}`) : e.let(`arith.subi ${scalarConst(e, dtype, 0)}, ${x} : ${t}`);
    case 'abs':
      if (isFloatDType(dtype)) return e.let(`math.absf ${x} : ${t}`);
      // NOTE: u8 values are non-negative: |x| = x. Signed: x < 0 ? 0 − x : x (wrapping at the
      // minimum, as the reference's rounding does); `math.absi` has no LLVM lowering in MLIR 19.
      if (isUnsigned(dtype)) return x;
      return scalarSelect(e, scalarCompare(e, 'less', dtype, x, scalarConst(e, dtype, 0)), e.let(`arith.subi ${scalarConst(e, dtype, 0)}, ${x} : ${t}`), x, dtype);
    case 'rsqrt':
      // 1/√x, as the reference computes it (`math.rsqrt` has no lowering to LLVM in MLIR 19).
      return e.let(`arith.divf ${scalarConst(e, dtype, 1)}, ${e.let(`math.sqrt ${x} : ${t}`)} : ${t}`);
    case 'exp':
    case 'log':
    case 'sqrt':
    case 'tanh':
    case 'sin':
    case 'cos':
      return e.let(`math.${op} ${x} : ${t}`);
    case 'sigmoid':
      return sigmoid(e, t, dtype, x);
    case 'silu':
      return e.let(`arith.mulf ${x}, ${sigmoid(e, t, dtype, x)} : ${t}`);
    case 'gelu': {
      // ½·x·(1 + erf(x/√2))
      const s = e.let(`arith.mulf ${x}, ${scalarConst(e, dtype, Math.SQRT1_2)} : ${t}`);
      const erf = e.let(`math.erf ${s} : ${t}`);
      const one = e.let(`arith.addf ${erf}, ${scalarConst(e, dtype, 1)} : ${t}`);
      const half = e.let(`arith.mulf ${x}, ${scalarConst(e, dtype, 0.5)} : ${t}`);
      return e.let(`arith.mulf ${half}, ${one} : ${t}`);
    }
    case 'geluTanh': {
      // ½·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
      const x2 = e.let(`arith.mulf ${x}, ${x} : ${t}`);
      const x3 = e.let(`arith.mulf ${x2}, ${x} : ${t}`);
      const c = e.let(`arith.mulf ${x3}, ${scalarConst(e, dtype, 0.044715)} : ${t}`);
      const inner = e.let(`arith.addf ${x}, ${c} : ${t}`);
      const arg = e.let(`arith.mulf ${inner}, ${scalarConst(e, dtype, Math.sqrt(2 / Math.PI))} : ${t}`);
      const th = e.let(`math.tanh ${arg} : ${t}`);
      const one = e.let(`arith.addf ${th}, ${scalarConst(e, dtype, 1)} : ${t}`);
      const half = e.let(`arith.mulf ${x}, ${scalarConst(e, dtype, 0.5)} : ${t}`);
      return e.let(`arith.mulf ${half}, ${one} : ${t}`);
    }
  }
}

const FLOAT_PRED: Record<ScalarCompare, string> = {
  equal: 'oeq',
  // NOTE: `a ≠ b` holds when either side is NaN, as in the reference (`!==`): unordered-or-not-equal.
  notEqual: 'une',
  less: 'olt',
  lessEqual: 'ole',
  greater: 'ogt',
  greaterEqual: 'oge',
};

const INT_PRED: Record<ScalarCompare, [signed: string, unsigned: string]> = {
  equal: ['eq', 'eq'],
  notEqual: ['ne', 'ne'],
  less: ['slt', 'ult'],
  lessEqual: ['sle', 'ule'],
  greater: ['sgt', 'ugt'],
  greaterEqual: ['sge', 'uge'],
};

/** A comparison of two scalars of `dtype`, giving `i1`. */
export function scalarCompare(e: FunctionEmitter, op: ScalarCompare, dtype: DType, a: string, b: string): string {
  const t = elementType(dtype);
  if (isFloatDType(dtype)) return e.let(`arith.cmpf ${FLOAT_PRED[op]}, ${a}, ${b} : ${t}`);
  const [s, u] = INT_PRED[op];
  return e.let(`arith.cmpi ${isUnsigned(dtype) ? u : s}, ${a}, ${b} : ${t}`);
}

/** Whether a scalar is NaN (`cmpf uno x, x`). */
export function scalarIsNan(e: FunctionEmitter, dtype: DType, x: string): string {
  return e.let(`arith.cmpf uno, ${x}, ${x} : ${elementType(dtype)}`);
}

/** `cond ? a : b` on scalars. */
export function scalarSelect(e: FunctionEmitter, cond: string, a: string, b: string, dtype: DType | 'index'): string {
  return e.let(`arith.select ${cond}, ${a}, ${b} : ${dtype === 'index' ? 'index' : elementType(dtype)}`);
}

/** An `index` value as a scalar of `dtype` (loop positions written into tensors). */
export function indexTo(e: FunctionEmitter, dtype: DType, i: string): string {
  if (dtype === 'bool') return e.let(`arith.cmpi ne, ${i}, ${e.index(0)} : index`);
  const asInt = e.let(`arith.index_cast ${i} : index to i64`);
  return scalarCast(e, 'i64', dtype, asInt);
}

/** An integer scalar of `dtype` as an `index` (for tensor.extract and slice offsets). */
export function toIndex(e: FunctionEmitter, dtype: DType, v: string): string {
  return e.let(`arith.index_cast${isUnsigned(dtype) ? 'ui' : ''} ${v} : ${elementType(dtype)} to index`);
}

/**
 * Converts a scalar between dtypes with the IR's semantics: floats round to nearest; float → int
 * truncates toward zero and wraps (through i64, and NaN/±∞ give 0, as the reference does);
 * int → int sign- or zero-extends or truncates; anything → bool is `x ≠ 0`.
 */
export function scalarCast(e: FunctionEmitter, from: DType, to: DType, x: string): string {
  if (from === to) return x;
  const ft = elementType(from);
  const tt = elementType(to);
  const ff = isFloatDType(from);
  const tf = isFloatDType(to);
  if (to === 'bool') {
    return ff ? e.let(`arith.cmpf une, ${x}, ${scalarConst(e, from, 0)} : ${ft}`) : e.let(`arith.cmpi ne, ${x}, ${scalarConst(e, from, 0)} : ${ft}`);
  }
  if (ff && tf) {
    if (bitWidth(from) === bitWidth(to)) {
      // f16 ↔ bf16: through f32 (exact on the way up).
      const wide = e.let(`arith.extf ${x} : ${ft} to f32`);
      return e.let(`arith.truncf ${wide} : f32 to ${tt}`);
    }
    return e.let(`arith.${bitWidth(from) < bitWidth(to) ? 'extf' : 'truncf'} ${x} : ${ft} to ${tt}`);
  }
  if (!ff && tf) return e.let(`arith.${isUnsigned(from) ? 'uitofp' : 'sitofp'} ${x} : ${ft} to ${tt}`);
  if (ff) {
    // fptosi of NaN/±∞ is poison in LLVM; the reference gives 0.
    const abs = e.let(`math.absf ${x} : ${ft}`);
    const finite = e.let(`arith.cmpf one, ${abs}, ${scalarConst(e, from, Number.POSITIVE_INFINITY)} : ${ft}`);
    const safe = scalarSelect(e, finite, x, scalarConst(e, from, 0), from);
    const wide = e.let(`arith.fptosi ${safe} : ${ft} to i64`);
    return to === 'i64' ? wide : e.let(`arith.trunci ${wide} : i64 to ${tt}`);
  }
  const fw = bitWidth(from);
  const tw = bitWidth(to);
  if (fw === tw) return x;
  if (fw < tw) return e.let(`arith.${isUnsigned(from) ? 'extui' : 'extsi'} ${x} : ${ft} to ${tt}`);
  return e.let(`arith.trunci ${x} : ${ft} to ${tt}`);
}
