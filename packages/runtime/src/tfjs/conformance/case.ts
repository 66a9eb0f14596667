import {
  type DType,
  GraphBuilder,
  type HostTensor,
  type OpKey,
  type Value,
  hostTensor,
  isFloatDType,
  seededRandom,
  sizeOf,
} from '@stageml/ir';
import type { ExecutorCase } from '@stageml/testkit';

/** One small graph exercising an op, with its data and how to compare executors on it (testkit's `ExecutorCase`). */
export type ConformanceCase = ExecutorCase;

/** Cases for every registry op: a complete mapped type, so a new op without cases fails typecheck. */
export type ConformanceTable = Readonly<Record<OpKey, readonly ConformanceCase[]>>;

/** An operand of a case graph: its declared type, concrete dims and data. */
export interface OperandSpec {
  readonly dtype: DType;
  /** Declared shape: numbers and symbol names. */
  readonly shape: readonly (number | string)[];
  /** Concrete dims (required when `shape` has symbols). */
  readonly dims?: readonly number[];
  /** Explicit row-major values; otherwise drawn from `range`. */
  readonly values?: readonly number[];
  /** Range of drawn values: floats uniform in [lo, hi), integers in [lo, hi] (default ±2 and ±5). */
  readonly range?: readonly [number, number];
  /** Declared as a parameter (weights) instead of an input. */
  readonly param?: boolean;
}

/** An operand spec: `t('f32', ['n', 3], { dims: [2, 3] })`. */
export function t(dtype: DType, shape: readonly (number | string)[], opts: Omit<OperandSpec, 'dtype' | 'shape'> = {}): OperandSpec {
  return { dtype, shape, ...opts };
}

function seedOf(name: string): number {
  let h = 2166136261;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 16777619);
  return h >>> 0;
}

function dataFor(spec: OperandSpec, dims: readonly number[], rnd: () => number): HostTensor {
  if (spec.values !== undefined) return hostTensor(spec.dtype, dims, spec.values);
  const n = sizeOf(dims);
  const values = new Array<number>(n);
  if (spec.dtype === 'bool') {
    for (let i = 0; i < n; i++) values[i] = rnd() < 0.5 ? 0 : 1;
  } else if (isFloatDType(spec.dtype)) {
    const [lo, hi] = spec.range ?? [-2, 2];
    for (let i = 0; i < n; i++) values[i] = lo + (hi - lo) * rnd();
  } else {
    const [lo, hi] = spec.range ?? [-5, 5];
    for (let i = 0; i < n; i++) values[i] = Math.floor(lo + (hi - lo + 1) * rnd());
  }
  return hostTensor(spec.dtype, dims, values);
}

/**
 * Builds a case: operands become inputs `x0`, `x1`, … (or parameters `w0`, … when `param`), with
 * deterministic data seeded by the case name; `body` applies the op under test.
 */
export function conformanceCase(
  name: string,
  operands: readonly OperandSpec[],
  body: (b: GraphBuilder, xs: Value[]) => Value | readonly Value[],
  opts: { readonly tol?: { readonly rtol: number; readonly atol: number }; readonly compare?: 'values' | 'range' } = {},
): ConformanceCase {
  const b = new GraphBuilder(name.replace(/[^A-Za-z0-9_]/g, '_'), { intern: false });
  const rnd = seededRandom(seedOf(name));
  const inputs: Record<string, HostTensor> = {};
  const weights: Record<string, HostTensor> = {};
  const xs = operands.map((spec, i) => {
    const dims = spec.dims ?? spec.shape.map((d) => (typeof d === 'number' ? d : Number.NaN));
    const data = dataFor(spec, dims, rnd);
    if (spec.param === true) {
      weights[`w${String(i)}`] = data;
      return b.param(`w${String(i)}`, [spec.dtype, spec.shape]);
    }
    inputs[`x${String(i)}`] = data;
    return b.input(`x${String(i)}`, [spec.dtype, spec.shape]);
  });
  const out = body(b, xs);
  if (Array.isArray(out)) (out as readonly Value[]).forEach((v, i) => { b.output(`out${String(i)}`, v); });
  else b.output('out', out as Value);
  return { name, graph: b.build(), inputs, weights, compare: opts.compare ?? 'values', ...(opts.tol === undefined ? {} : { tol: opts.tol }) };
}

/**
 * The result, plus for narrow dtypes the result cast to a wide one: the host rounds and wraps what
 * it downloads, so only a wide copy shows whether the device held the narrow value.
 */
export function widened(b: GraphBuilder, y: Value): Value | Value[] {
  const wide = { f16: 'f32', bf16: 'f32', i8: 'i32', u8: 'i32' } as const;
  const d = y.type.dtype;
  return d === 'f16' || d === 'bf16' || d === 'i8' || d === 'u8' ? [y, b.cast(y, wide[d])] : y;
}
