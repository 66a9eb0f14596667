import type { OnnxGraphBuilder } from './builder.js';
import { convert } from './convert.js';
import { ElemType, computeType, isFloat } from './dtypes.js';
import { type Lowering, exactLowering, lowering } from './rule.js';

type BinaryKey = 'add' | 'sub' | 'mul' | 'div' | 'pow';
type UnaryKey = 'neg' | 'abs' | 'exp' | 'log' | 'sqrt' | 'tanh' | 'sigmoid' | 'sin' | 'cos';
type CompareKey = 'equal' | 'notEqual' | 'less' | 'lessEqual' | 'greater' | 'greaterEqual';

/** A broadcasting binary op that maps to one ONNX op (numpy broadcasting, as the IR's). */
export function binary<K extends BinaryKey>(opType: string): Lowering<K> {
  return lowering<K>(({ b, inputs }) => [b.op(opType, inputs)]);
}

/** An element-wise unary op that maps to one ONNX op. */
export function unary<K extends UnaryKey>(opType: string): Lowering<K> {
  return lowering<K>(({ b, inputs }) => [b.op(opType, inputs)]);
}

/**
 * max/min with NaN propagation: ONNX leaves NaN handling of Max/Min to the runtime, the IR
 * propagates NaN, so floats select a + b (NaN) wherever either side is NaN.
 */
export function nanPropagating<K extends 'maximum' | 'minimum'>(opType: 'Max' | 'Min'): Lowering<K> {
  return lowering<K>(({ b, inputs, operands }) => {
    const [x, y] = inputs as [string, string];
    const m = b.op(opType, [x, y]);
    if (!isFloat(operands[0]!.dtype)) return [m];
    const nan = b.op('Or', [b.op('IsNaN', [x]), b.op('IsNaN', [y])]);
    return [b.op('Where', [nan, b.op('Add', [x, y]), m])];
  });
}

/** y = 1/√x. */
export const rsqrt = lowering<'rsqrt'>(({ b, inputs }) => [b.op('Reciprocal', [b.op('Sqrt', inputs)])]);

/**
 * y = x·σ(x). NOTE: onnxruntime fuses Mul(x, Sigmoid(x)) into QuickGelu, which has float kernels
 * only, so f64 uses the equal x / (1 + e⁻ˣ) (e⁻ˣ = ∞ gives −0, as x·σ(x) does).
 */
export const silu = lowering<'silu'>(({ b, inputs, operands }) => {
  const x = inputs[0]!;
  if (operands[0]!.dtype !== 'f64') return [b.op('Mul', [x, b.op('Sigmoid', [x])])];
  return [b.op('Div', [x, b.op('Add', [b.scalar(1, ElemType.DOUBLE), b.op('Exp', [b.op('Neg', [x])])])])];
});

/** Coefficients of the Chebyshev-fitted erfc of Numerical Recipes §6.2, highest order first. */
const ERFC_NR = [0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418, 0.37409196, 1.00002368, -1.26551223];

/**
 * erf in double precision, exactly as the IR's reference (`ops/elementwise.ts`) computes it:
 * the Maclaurin series (30 terms) for |x| < 0.5, else 1 − erfc(|x|) with Numerical Recipes' fit.
 * NOTE: onnxruntime has no double Erf kernel; this keeps f64 gelu equal to the interpreter.
 */
function erf64(b: OnnxGraphBuilder, x: string): string {
  const c = (v: number): string => b.scalar(v, ElemType.DOUBLE);
  const horner = (z: string, coefs: readonly number[]): string => coefs.slice(1).reduce((acc, k) => b.op('Add', [b.op('Mul', [acc, z]), c(k)]), c(coefs[0]!));
  const ax = b.op('Abs', [x]);
  // Series: erf(x) = 2/√π · Σₙ (−1)ⁿ x^(2n+1) / (n! (2n+1)), Horner in x² from the highest term.
  const series: number[] = [];
  let fact = 1;
  for (let n = 0; n < 30; n++) {
    if (n > 0) fact *= n;
    series.unshift(((n % 2 === 0 ? 1 : -1) / (fact * (2 * n + 1))) * (2 / Math.sqrt(Math.PI)));
  }
  const small = b.op('Mul', [x, horner(b.op('Mul', [x, x]), series)]);
  const t = b.op('Div', [c(1), b.op('Add', [c(1), b.op('Mul', [c(0.5), ax])])]);
  const y = b.op('Mul', [t, b.op('Exp', [b.op('Sub', [horner(t, ERFC_NR), b.op('Mul', [ax, ax])])])]);
  const large = b.op('Mul', [b.op('Sign', [x]), b.op('Sub', [c(1), y])]);
  return b.op('Where', [b.op('Less', [ax, c(0.5)]), small, large]);
}

/**
 * GELU in the form ORT's Gelu fusion recognizes: exact ½x(1 + erf(x/√2)), or the tanh form
 * ½x(1 + tanh(√(2/π)(x + 0.044715x³))).
 */
export const gelu = lowering<'gelu'>(({ b, inputs, operands, attrs }) => {
  const x = inputs[0]!;
  const t = computeType(operands[0]!.dtype);
  const c = (v: number): string => b.scalar(v, t);
  let inner: string;
  if (attrs.approximate === 'tanh') {
    const cube = b.op('Mul', [b.op('Mul', [x, x]), x]);
    const arg = b.op('Mul', [b.op('Add', [x, b.op('Mul', [cube, c(0.044715)])]), c(Math.sqrt(2 / Math.PI))]);
    inner = b.op('Tanh', [arg]);
  } else {
    const scaled = b.op('Div', [x, c(Math.SQRT2)]);
    inner = t === ElemType.DOUBLE ? erf64(b, scaled) : b.op('Erf', [scaled]);
  }
  return [b.op('Mul', [b.op('Mul', [x, b.op('Add', [inner, c(1)])]), c(0.5)])];
});

const COMPARE: Readonly<Record<CompareKey, string>> = {
  equal: 'Equal',
  notEqual: 'Equal',
  less: 'Less',
  lessEqual: 'LessOrEqual',
  greater: 'Greater',
  greaterEqual: 'GreaterOrEqual',
};

function orderable(b: OnnxGraphBuilder, x: string, isBool: boolean): string {
  // Order comparisons have no bool kernels; false < true as 0 < 1.
  return isBool ? b.cast(x, ElemType.INT32) : x;
}

/** A comparison giving bool (notEqual is Not(Equal)). */
export function compare<K extends CompareKey>(key: K): Lowering<K> {
  return exactLowering<K>(({ b, inputs, operands }) => {
    const isBool = operands[0]!.dtype === 'bool' && key !== 'equal' && key !== 'notEqual';
    const r = b.op(COMPARE[key], inputs.map((x) => orderable(b, x, isBool)));
    return [key === 'notEqual' ? b.op('Not', [r]) : r];
  });
}

/** y = cond ? a : b (bool values select as uint8: Where has no bool kernel in onnxruntime). */
export const where = exactLowering<'where'>(({ b, inputs, operands }) => {
  if (operands[1]!.dtype !== 'bool') return [b.op('Where', inputs)];
  const [c, x, y] = inputs as [string, string, string];
  return [b.cast(b.op('Where', [c, b.cast(x, ElemType.UINT8), b.cast(y, ElemType.UINT8)]), ElemType.BOOL)];
});

/** IR cast semantics (see `convert`); conformed by `convert` itself. */
export const cast = exactLowering<'cast'>(({ b, inputs, operands, attrs }) => [convert(b, inputs[0]!, operands[0]!.dtype, attrs.dtype)]);

/** Unary lowerings by key, for the table. */
export const UNARY: { readonly [K in UnaryKey]: Lowering<K> } = {
  neg: unary('Neg'),
  abs: unary('Abs'),
  exp: unary('Exp'),
  log: unary('Log'),
  sqrt: unary('Sqrt'),
  tanh: unary('Tanh'),
  sigmoid: unary('Sigmoid'),
  sin: unary('Sin'),
  cos: unary('Cos'),
};

