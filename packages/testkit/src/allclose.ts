import type { DType, HostTensor } from '@stageml/ir';

/** Tolerances of `toBeAllclose`: |actual − expected| ≤ atol + rtol·|expected| elementwise. */
export interface AllcloseOptions {
  /** Relative tolerance (default depends on the expected dtype, see `defaultTolerance`). */
  readonly rtol?: number;
  /** Absolute tolerance (default depends on the expected dtype). */
  readonly atol?: number;
}

/** What `allcloseReport` found: whether the tensors agree, and the worst disagreement. */
export interface AllcloseReport {
  /** Whether shapes, dtypes and every element agree within tolerance. */
  readonly pass: boolean;
  /** Why the tensors disagree structurally (dtype, shape, element count), if they do. */
  readonly structural: string | undefined;
  /** Largest |actual − expected| over finite pairs (0 when none). */
  readonly maxAbs: number;
  /** Largest |actual − expected| / |expected| over finite pairs with expected ≠ 0. */
  readonly maxRel: number;
  /** Multi-index of the worst element (the first failing one with the largest excess), if any fails. */
  readonly worst: readonly number[] | undefined;
  /** Actual and expected values at `worst`. */
  readonly worstValues: readonly [actual: number, expected: number] | undefined;
  /** Number of elements outside tolerance. */
  readonly mismatches: number;
  /** Tolerances used. */
  readonly rtol: number;
  readonly atol: number;
}

/**
 * Dtype-aware default tolerances: about a few ulps of the narrowest float involved; integer and
 * bool tensors compare exactly.
 */
export function defaultTolerance(dtype: DType): { rtol: number; atol: number } {
  switch (dtype) {
    case 'f64':
      return { rtol: 1e-12, atol: 1e-12 };
    case 'f32':
      return { rtol: 1e-5, atol: 1e-6 };
    case 'f16':
      return { rtol: 2e-3, atol: 1e-3 };
    case 'bf16':
      return { rtol: 1.6e-2, atol: 1e-2 };
    case 'i64':
    case 'i32':
    case 'i8':
    case 'u8':
    case 'bool':
      return { rtol: 0, atol: 0 };
  }
}

function unravel(flat: number, shape: readonly number[]): number[] {
  const idx = new Array<number>(shape.length).fill(0);
  let rem = flat;
  for (let ax = shape.length - 1; ax >= 0; ax--) {
    const d = shape[ax]!;
    idx[ax] = d === 0 ? 0 : rem % d;
    rem = d === 0 ? 0 : Math.floor(rem / d);
  }
  return idx;
}

/**
 * Compares two host tensors elementwise as `numpy.allclose` does, except that NaN equals NaN and
 * infinities must match exactly. Returns the full report (the matcher formats it).
 */
export function allcloseReport(actual: HostTensor, expected: HostTensor, opts: AllcloseOptions = {}): AllcloseReport {
  const tol = defaultTolerance(expected.dtype);
  const rtol = opts.rtol ?? tol.rtol;
  const atol = opts.atol ?? tol.atol;
  const base = { maxAbs: 0, maxRel: 0, worst: undefined, worstValues: undefined, mismatches: 0, rtol, atol };
  if (actual.dtype !== expected.dtype) {
    return { ...base, pass: false, structural: `dtype ${actual.dtype} ≠ expected ${expected.dtype}` };
  }
  if (actual.shape.length !== expected.shape.length || actual.shape.some((d, i) => d !== expected.shape[i])) {
    return { ...base, pass: false, structural: `shape [${actual.shape.join(', ')}] ≠ expected [${expected.shape.join(', ')}]` };
  }
  if (actual.data.length !== expected.data.length) {
    return { ...base, pass: false, structural: `${String(actual.data.length)} elements ≠ expected ${String(expected.data.length)}` };
  }
  let maxAbs = 0;
  let maxRel = 0;
  let worstFlat = -1;
  let worstExcess = -1;
  let mismatches = 0;
  for (let i = 0; i < expected.data.length; i++) {
    const a = actual.data[i]!;
    const e = expected.data[i]!;
    let ok: boolean;
    let excess: number;
    if (Number.isNaN(a) || Number.isNaN(e)) {
      ok = Number.isNaN(a) && Number.isNaN(e);
      excess = Number.POSITIVE_INFINITY;
    } else if (!Number.isFinite(a) || !Number.isFinite(e)) {
      ok = a === e;
      excess = Number.POSITIVE_INFINITY;
    } else {
      const diff = Math.abs(a - e);
      maxAbs = Math.max(maxAbs, diff);
      if (e !== 0) maxRel = Math.max(maxRel, diff / Math.abs(e));
      excess = diff - (atol + rtol * Math.abs(e));
      ok = excess <= 0;
    }
    if (!ok) {
      mismatches++;
      if (excess > worstExcess) {
        worstExcess = excess;
        worstFlat = i;
      }
    }
  }
  const worst = worstFlat < 0 ? undefined : unravel(worstFlat, expected.shape);
  const worstValues = worstFlat < 0 ? undefined : ([actual.data[worstFlat]!, expected.data[worstFlat]!] as const);
  return { pass: mismatches === 0, structural: undefined, maxAbs, maxRel, worst, worstValues, mismatches, rtol, atol };
}

/** Formats a report as the matcher's failure message. */
export function formatAllcloseReport(r: AllcloseReport, negated: boolean): string {
  if (negated) {
    return `expected tensors not to be allclose (rtol=${String(r.rtol)}, atol=${String(r.atol)}), but every element agrees (max abs error ${String(r.maxAbs)}, max rel error ${String(r.maxRel)})`;
  }
  if (r.structural !== undefined) return `expected tensors to be allclose, but ${r.structural}`;
  const at = r.worst === undefined ? '' : ` worst at [${r.worst.join(', ')}]: actual ${String(r.worstValues?.[0])} vs expected ${String(r.worstValues?.[1])};`;
  return `expected tensors to be allclose (rtol=${String(r.rtol)}, atol=${String(r.atol)}), but ${String(r.mismatches)} element(s) differ;${at} max abs error ${String(r.maxAbs)}, max rel error ${String(r.maxRel)}`;
}

/**
 * The `toBeAllclose` matcher body, for `expect.extend` (setup.ts registers it):
 * `expect(actual).toBeAllclose(expected, { rtol, atol })`.
 */
export function toBeAllclose(
  this: { readonly isNot: boolean },
  actual: unknown,
  expected: HostTensor,
  opts: AllcloseOptions = {},
): { pass: boolean; message: () => string } {
  if (!isHostTensor(actual)) {
    return { pass: false, message: () => `expected a HostTensor ({ dtype, shape, data }), got ${typeof actual}` };
  }
  const r = allcloseReport(actual, expected, opts);
  return { pass: r.pass, message: () => formatAllcloseReport(r, this.isNot) };
}

function isHostTensor(x: unknown): x is HostTensor {
  if (typeof x !== 'object' || x === null) return false;
  const t = x as Partial<HostTensor>;
  return typeof t.dtype === 'string' && Array.isArray(t.shape) && ArrayBuffer.isView(t.data);
}

declare module 'vitest' {
  // NOTE: the type parameter must repeat vitest's declaration (`T = any`) for the merge to apply.
  // eslint-disable-next-line @typescript-eslint/no-explicit-any, @typescript-eslint/no-unused-vars
  interface Matchers<T = any> {
    /**
     * Asserts that a `HostTensor` equals `expected` within `|a − e| ≤ atol + rtol·|e|`
     * elementwise (NaN equals NaN; dtype and shape must match). Tolerances default per dtype.
     */
    toBeAllclose: (expected: HostTensor, opts?: AllcloseOptions) => void;
  }
}
