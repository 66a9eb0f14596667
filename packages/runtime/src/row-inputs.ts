import type { DType, HostTensor } from '@stageml/ir';
import { RuntimeCode, RuntimeError } from './errors.js';

/**
 * An input given per batch row instead of as one tensor (`RunOptions.rows`): a position-major
 * cache of shape [rows, past, …] whose row b is `rows[b]`, that row's leading positions (a whole
 * number of them, at most `past`), each row in a buffer of its own — a sequence's own KV, read
 * where it lies instead of copied into one contiguous batch. A row's positions past its buffer
 * read as zeros: the caller masks them, as it masks the padding of a joined batch.
 */
export interface RowsInput {
  /** Dtype of the input (f32 host storage; bf16/f16 values in f32 as `HostTensor` holds them). */
  readonly dtype: DType;
  /** The whole input's shape [rows, past, …]. */
  readonly shape: readonly number[];
  /** Per row, its leading positions (`shape[2..]` elements each). */
  readonly rows: readonly Float32Array[];
}

/** Elements of one position of `r` (the product of its dims after the first two). */
function positionSize(r: RowsInput): number {
  return r.shape.slice(2).reduce((a, d) => a * d, 1);
}

/**
 * Checks a `RowsInput`: rank ≥ 2, one row per leading row, each a Float32Array of a whole number
 * of positions, at most `past`. `RT_BAD_VALUE` naming the input otherwise.
 */
export function checkRowsInput(name: string, r: RowsInput): void {
  const bad = (what: string): never => {
    throw new RuntimeError(RuntimeCode.BAD_VALUE, `row input '${name}': ${what}`);
  };
  if (!Array.isArray(r.shape) || r.shape.length < 2 || !r.shape.every((d) => Number.isSafeInteger(d) && d >= 0)) bad(`its shape must be [rows, past, …] of sizes ≥ 0, got [${String(r.shape)}]`);
  if (!Array.isArray(r.rows) || r.rows.length !== r.shape[0]) bad(`its shape [${r.shape.join(', ')}] needs ${String(r.shape[0])} rows, got ${Array.isArray(r.rows) ? String(r.rows.length) : typeof r.rows}`);
  const per = positionSize(r);
  const past = r.shape[1]!;
  r.rows.forEach((row, b) => {
    if (!(row instanceof Float32Array)) bad(`row ${String(b)} is not a Float32Array`);
    if (per === 0 ? row.length !== 0 : row.length % per !== 0 || row.length / per > past) bad(`row ${String(b)} holds ${String(row.length)} elements: not a whole number of positions of ${String(per)}, at most ${String(past)}`);
  });
}

/**
 * The contiguous tensor a `RowsInput` stands for: each row's positions at the start of its
 * `past`, zeros after them (one copy; what a graph that does not read rows in place is fed).
 */
export function joinRows(r: RowsInput): HostTensor {
  const per = positionSize(r);
  const stride = r.shape[1]! * per;
  const data = new Float32Array(r.shape[0]! * stride);
  r.rows.forEach((row, b) => {
    data.set(row, b * stride);
  });
  return { dtype: r.dtype, shape: [...r.shape], data };
}
