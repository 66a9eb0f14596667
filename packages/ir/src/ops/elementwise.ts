import { attr } from '../attrs.js';
import { defineOp, dtypeError, type Trait } from '../op-def.js';
import { broadcastShapes } from '../types.js';
import { mapBroadcast, mapUnary, perElementFlops, requireFloat, sameDType } from './common.js';

function unary<const K extends string>(
  key: K,
  summary: string,
  semantics: string,
  f: (v: number) => number,
  opts: { floatOnly?: boolean; flops?: number } = {},
) {
  return defineOp({
    key,
    summary,
    semantics,
    operands: ['x'],
    traits: ['elementwise'],
    infer: ([x]) => {
      if (opts.floatOnly !== false) requireFloat(key, x!);
      else if (x!.dtype === 'bool') dtypeError(key, 'does not take bool');
      return [x!];
    },
    flops: perElementFlops(opts.flops ?? 1),
    evaluate: ([x]) => [mapUnary(x!, x!.dtype, f)],
  });
}

function binary<const K extends string>(
  key: K,
  summary: string,
  semantics: string,
  f: (a: number, b: number) => number,
  opts: { floatOnly?: boolean; traits?: readonly Trait[] } = {},
) {
  return defineOp({
    key,
    summary,
    semantics,
    operands: ['lhs', 'rhs'],
    traits: ['elementwise', 'broadcasting', ...(opts.traits ?? [])],
    infer: (ops) => {
      const dtype = sameDType(key, ops);
      if (opts.floatOnly === true) requireFloat(key, ops[0]!);
      if (dtype === 'bool') dtypeError(key, 'does not take bool; cast first');
      return [{ dtype, shape: broadcastShapes(ops.map((t) => t.shape)) }];
    },
    flops: perElementFlops(1),
    evaluate: ([a, b]) => [mapBroadcast([a!, b!], a!.dtype, (v) => f(v[0]!, v[1]!))],
  });
}

function compare<const K extends string>(key: K, semantics: string, f: (a: number, b: number) => boolean) {
  return defineOp({
    key,
    summary: `Element-wise comparison with broadcasting, giving bool (${semantics}).`,
    semantics: `y = bool(${semantics})`,
    operands: ['lhs', 'rhs'],
    traits: ['elementwise', 'broadcasting'],
    infer: (ops) => {
      sameDType(key, ops);
      return [{ dtype: 'bool', shape: broadcastShapes(ops.map((t) => t.shape)) }];
    },
    flops: perElementFlops(1),
    evaluate: ([a, b]) => [mapBroadcast([a!, b!], 'bool', (v) => (f(v[0]!, v[1]!) ? 1 : 0))],
  });
}

const sigmoidFn = (v: number): number => (v >= 0 ? 1 / (1 + Math.exp(-v)) : Math.exp(v) / (1 + Math.exp(v)));
const SQRT_2_OVER_PI = Math.sqrt(2 / Math.PI);

/**
 * erf(x): Maclaurin series for |x| < 0.5, else 1 − erfc(|x|) with the Chebyshev-fitted erfc of
 * Press et al., Numerical Recipes §6.2 (fractional error < 1.2e-7, below f32 resolution of gelu).
 */
function erf(x: number): number {
  const sign = x < 0 ? -1 : 1;
  const ax = Math.abs(x);
  if (ax < 0.5) {
    let term = ax;
    let sum = ax;
    const x2 = ax * ax;
    for (let n = 1; n < 30; n++) {
      term *= -x2 / n;
      sum += term / (2 * n + 1);
    }
    return (sign * 2 * sum) / Math.sqrt(Math.PI);
  }
  const t = 1 / (1 + 0.5 * ax);
  const y =
    t *
    Math.exp(
      -ax * ax -
        1.26551223 +
        t *
          (1.00002368 +
            t *
              (0.37409196 +
                t *
                  (0.09678418 +
                    t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))),
    );
  return sign * (1 - y);
}

/** y = x + y. */
export const add = binary('add', 'Element-wise sum with broadcasting.', 'y = a + b', (a, b) => a + b, {
  traits: ['commutative', 'associative'],
});
/** y = a − b. */
export const sub = binary('sub', 'Element-wise difference with broadcasting.', 'y = a − b', (a, b) => a - b);
/** y = a · b. */
export const mul = binary('mul', 'Element-wise product with broadcasting.', 'y = a · b', (a, b) => a * b, {
  traits: ['commutative', 'associative'],
});
/** y = a / b. */
export const div = binary('div', 'Element-wise quotient with broadcasting (floating point).', 'y = a / b', (a, b) => a / b, {
  floatOnly: true,
});
/** y = a^b. */
export const pow = binary('pow', 'Element-wise power with broadcasting (floating point).', 'y = a^b', (a, b) => a ** b, {
  floatOnly: true,
});
/** y = max(a, b). */
export const maximum = binary(
  'maximum',
  'Element-wise maximum with broadcasting; NaN propagates.',
  'y = max(a, b)',
  (a, b) => (Number.isNaN(a) || Number.isNaN(b) ? Number.NaN : Math.max(a, b)),
  { traits: ['commutative', 'associative'] },
);
/** y = min(a, b). */
export const minimum = binary(
  'minimum',
  'Element-wise minimum with broadcasting; NaN propagates.',
  'y = min(a, b)',
  (a, b) => (Number.isNaN(a) || Number.isNaN(b) ? Number.NaN : Math.min(a, b)),
  { traits: ['commutative', 'associative'] },
);

/** y = −x. */
export const neg = unary('neg', 'Element-wise negation.', 'y = −x', (v) => -v, { floatOnly: false });
/** y = |x|. */
export const abs = unary('abs', 'Element-wise absolute value.', 'y = |x|', Math.abs, { floatOnly: false });
/** y = eˣ. */
export const exp = unary('exp', 'Element-wise natural exponential.', 'y = eˣ', Math.exp);
/** y = ln x. */
export const log = unary('log', 'Element-wise natural logarithm.', 'y = ln x', Math.log);
/** y = √x. */
export const sqrt = unary('sqrt', 'Element-wise square root.', 'y = √x', Math.sqrt);
/** y = 1/√x. */
export const rsqrt = unary('rsqrt', 'Element-wise reciprocal square root.', 'y = 1/√x', (v) => 1 / Math.sqrt(v));
/** y = tanh x. */
export const tanh = unary('tanh', 'Element-wise hyperbolic tangent.', 'y = tanh x', Math.tanh, { flops: 4 });
/** y = 1/(1+e⁻ˣ). */
export const sigmoid = unary('sigmoid', 'Element-wise logistic sigmoid.', 'y = 1/(1 + e⁻ˣ)', sigmoidFn, { flops: 4 });
/** y = x·σ(x). */
export const silu = unary('silu', 'Element-wise SiLU (swish).', 'y = x · σ(x)', (v) => v * sigmoidFn(v), { flops: 5 });
/** y = sin x. */
export const sin = unary('sin', 'Element-wise sine.', 'y = sin x', Math.sin);
/** y = cos x. */
export const cos = unary('cos', 'Element-wise cosine.', 'y = cos x', Math.cos);

/** y = x·Φ(x), exactly (erf) or by the tanh approximation. */
export const gelu = defineOp({
  key: 'gelu',
  summary: 'Element-wise GELU, exact (erf) or tanh-approximated.',
  semantics: 'y = x·Φ(x) = ½x(1 + erf(x/√2)); tanh: ½x(1 + tanh(√(2/π)(x + 0.044715x³)))',
  operands: ['x'],
  attrs: { approximate: attr.enum(['none', 'tanh'], { default: 'none' }) },
  traits: ['elementwise'],
  infer: ([x]) => {
    requireFloat('gelu', x!);
    return [x!];
  },
  flops: perElementFlops(8),
  evaluate: ([x], a) => [
    mapUnary(x!, x!.dtype, (v) =>
      a.approximate === 'tanh'
        ? 0.5 * v * (1 + Math.tanh(SQRT_2_OVER_PI * (v + 0.044715 * v * v * v)))
        : 0.5 * v * (1 + erf(v / Math.SQRT2)),
    ),
  ],
});

/** y = a = b. */
export const equal = compare('equal', 'a = b', (a, b) => a === b);
/** y = a ≠ b. */
export const notEqual = compare('notEqual', 'a ≠ b', (a, b) => a !== b);
/** y = a < b. */
export const less = compare('less', 'a < b', (a, b) => a < b);
/** y = a ≤ b. */
export const lessEqual = compare('lessEqual', 'a ≤ b', (a, b) => a <= b);
/** y = a > b. */
export const greater = compare('greater', 'a > b', (a, b) => a > b);
/** y = a ≥ b. */
export const greaterEqual = compare('greaterEqual', 'a ≥ b', (a, b) => a >= b);

/** y = cond ? a : b. */
export const where = defineOp({
  key: 'where',
  summary: 'Element-wise selection with broadcasting: a where cond is true, else b.',
  semantics: 'y = cond ? a : b',
  operands: ['cond', 'a', 'b'],
  traits: ['elementwise', 'broadcasting'],
  infer: ([c, a, b]) => {
    if (c!.dtype !== 'bool') dtypeError('where', `cond must be bool, got ${c!.dtype}`);
    const dtype = sameDType('where', [a!, b!]);
    return [{ dtype, shape: broadcastShapes([c!.shape, a!.shape, b!.shape]) }];
  },
  flops: perElementFlops(1),
  evaluate: ([c, a, b]) => [mapBroadcast([c!, a!, b!], a!.dtype, (v) => (v[0] !== 0 ? v[1]! : v[2]!))],
});

/** y = dtype(x). */
export const cast = defineOp({
  key: 'cast',
  summary: 'Element-wise conversion to another dtype (floats round to nearest; ints truncate and wrap).',
  semantics: 'y = convert_dtype(x)',
  operands: ['x'],
  attrs: { dtype: attr.dtype({}) },
  traits: ['elementwise'],
  infer: ([x], a) => [{ dtype: a.dtype, shape: x!.shape }],
  flops: perElementFlops(1),
  evaluate: ([x], a) => [mapUnary(x!, a.dtype, (v) => v)],
});
