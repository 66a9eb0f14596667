import { type DType, DTYPES, type Dim, type DimBindings, type HostTensor, type TensorType, concreteShape, hostTensor, isFloatDType, sizeOf, sym } from '@stageml/ir';
import fc from 'fast-check';

/** Any dtype, or one of `dtypes`. */
export function arbDType(dtypes: readonly DType[] = DTYPES): fc.Arbitrary<DType> {
  return fc.constantFrom(...dtypes);
}

/** Options of `arbTensorType`. */
export interface TensorTypeOptions {
  /** Dtypes to draw from (default: all). */
  readonly dtypes?: readonly DType[];
  /** Smallest rank (default 0). */
  readonly minRank?: number;
  /** Largest rank (default 3). */
  readonly maxRank?: number;
  /** Largest static dim (default 4; dims start at 1 unless `allowZero`). */
  readonly maxDim?: number;
  /** Whether static dims may be 0 (default false). */
  readonly allowZero?: boolean;
  /** Symbol names dims may be (default none: static shapes only). */
  readonly symbols?: readonly string[];
}

/** A small static or symbolic dimension. */
export function arbDim(opts: Pick<TensorTypeOptions, 'maxDim' | 'allowZero' | 'symbols'> = {}): fc.Arbitrary<Dim> {
  const stat = fc.integer({ min: opts.allowZero === true ? 0 : 1, max: opts.maxDim ?? 4 });
  const symbols = opts.symbols ?? [];
  if (symbols.length === 0) return stat;
  return fc.oneof({ arbitrary: stat, weight: 3 }, { arbitrary: fc.constantFrom(...symbols).map(sym), weight: 1 });
}

/** A tensor type with small static (and, when `symbols` are given, symbolic) dims. */
export function arbTensorType(opts: TensorTypeOptions = {}): fc.Arbitrary<TensorType> {
  return fc.record({
    dtype: arbDType(opts.dtypes),
    shape: fc.array(arbDim(opts), { minLength: opts.minRank ?? 0, maxLength: opts.maxRank ?? 3 }),
  });
}

/** Options of `arbHostTensor`. */
export interface HostTensorOptions {
  /** Sizes of the symbols the type mentions (required when the type is symbolic). */
  readonly bindings?: DimBindings;
  /** Largest magnitude of a float element (default 4). */
  readonly maxAbs?: number;
}

/** An element value for `dtype`: finite, moderate, already representable after rounding. */
function arbElement(dtype: DType, maxAbs: number): fc.Arbitrary<number> {
  if (dtype === 'bool') return fc.constantFrom(0, 1);
  if (dtype === 'u8') return fc.integer({ min: 0, max: 8 });
  if (!isFloatDType(dtype)) return fc.integer({ min: -8, max: 8 });
  // NOTE: multiples of 1/64 are exact in every float dtype up to |x| ≤ 4 (bf16 has 8 mantissa bits),
  // and avoiding subnormals keeps reference comparisons free of denormal flushing questions.
  return fc.oneof(
    { arbitrary: fc.integer({ min: -64 * maxAbs, max: 64 * maxAbs }).map((k) => k / 64), weight: 3 },
    { arbitrary: fc.double({ min: -maxAbs, max: maxAbs, noNaN: true, noDefaultInfinity: true }), weight: 1 },
  );
}

/**
 * A host tensor of `type` (symbolic dims evaluated under `opts.bindings`) with finite values of
 * moderate magnitude, rounded to the dtype.
 */
export function arbHostTensor(type: TensorType, opts: HostTensorOptions = {}): fc.Arbitrary<HostTensor> {
  const shape = concreteShape(type, opts.bindings ?? {});
  const n = sizeOf(shape);
  return fc
    .array(arbElement(type.dtype, opts.maxAbs ?? 4), { minLength: n, maxLength: n })
    .map((values) => hostTensor(type.dtype, shape, values));
}
