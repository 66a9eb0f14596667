import type { DType } from '@stageml/ir';

import type { OnnxGraphBuilder } from './builder.js';
import { ElemType, computeType, isFloat, narrowType } from './dtypes.js';

/**
 * Rounds (f16, bf16) or wraps (i8, u8) a compute-typed tensor to the values of its narrow IR dtype
 * by a round trip through the narrow ONNX type: Cast rounds to nearest even and integer narrowing
 * wraps modulo 2^bits, as the interpreter's `rounderFor` does. Identity for other dtypes.
 */
export function conform(b: OnnxGraphBuilder, x: string, dtype: DType): string {
  const narrow = narrowType(dtype);
  if (narrow === undefined) return x;
  return b.cast(b.cast(x, narrow), computeType(dtype));
}

/** Replaces NaN and ±∞ by 0 (what the interpreter converts them to in integer casts). */
function finiteOrZero(b: OnnxGraphBuilder, x: string, from: DType): string {
  const bad = b.op('Or', [b.op('IsNaN', [x]), b.op('IsInf', [x])]);
  return b.op('Where', [bad, b.scalar(0, computeType(from)), x]);
}

/**
 * IR `cast` semantics from `from` to `to`: floats round to nearest (then to the narrow type),
 * float → integer truncates toward zero with NaN/∞ → 0 and wraps to the target width, integer
 * narrowing wraps, anything → bool is `x ≠ 0` (NaN → true). Returns a new tensor (never `x`).
 */
export function convert(b: OnnxGraphBuilder, x: string, from: DType, to: DType): string {
  if (from === to) return b.op('Identity', [x]);
  if (isFloat(to)) {
    const wide = computeType(from) === computeType(to) ? x : b.cast(x, computeType(to));
    const out = conform(b, wide, to);
    return out === x ? b.op('Identity', [x]) : out;
  }
  if (to === 'bool') return b.cast(x, ElemType.BOOL);
  // Integer targets: truncate floats through int64, then wrap to the width.
  const int = isFloat(from) ? b.cast(finiteOrZero(b, x, from), ElemType.INT64) : x;
  switch (to) {
    case 'i64':
      return int === x ? b.cast(x, ElemType.INT64) : int;
    case 'i32':
      return b.cast(int, ElemType.INT32);
    case 'i8':
    case 'u8':
      return b.cast(b.cast(int, narrowType(to)!), ElemType.INT32);
  }
}
