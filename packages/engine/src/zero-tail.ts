import { type FloatDType, roundFloat32InPlace } from '@stageml/ir';

/**
 * Moves a slot's all-zero A rows (and their B rows, zeroed) after its other rows, keeping the
 * order of the others: A [rank, inDim] at `aStart` of `A`, B [rank, outDim] at `bStart` of `B`,
 * in place. A row whose A is zero adds 0·B[r] to every output, so neither the move nor zeroing its
 * B changes the result (the remaining rows keep their order, so not even the rounding); afterwards
 * the rows after the first all-zero A row are zero in A and B — the promise `loraBank`'s
 * `zeroTail` attribute makes, which lets the cpu-native kernel stop reading a slot at its first
 * zero row instead of streaming the R-rank slot's padding. Returns the rows kept (the nonzero ones).
 */
export function zeroRowsLast(A: Float32Array, aStart: number, B: Float32Array, bStart: number, rank: number, inDim: number, outDim: number): number {
  let kept = 0;
  for (let j = 0; j < rank; j++) {
    const a0 = aStart + j * inDim;
    let zero = true;
    for (let i = 0; i < inDim && zero; i++) zero = A[a0 + i] === 0;
    if (zero) continue;
    if (kept !== j) {
      A.copyWithin(aStart + kept * inDim, a0, a0 + inDim);
      B.copyWithin(bStart + kept * outDim, bStart + j * outDim, bStart + (j + 1) * outDim);
    }
    kept++;
  }
  A.fill(0, aStart + kept * inDim, aStart + rank * inDim);
  B.fill(0, bStart + kept * outDim, bStart + rank * outDim);
  return kept;
}

const scratch = new Float32Array(1);

/** Whether `v` rounds to ±0 in `dtype`. */
function roundsToZero(v: number, dtype: FloatDType): boolean {
  if (v === 0) return true;
  scratch[0] = v;
  roundFloat32InPlace(scratch, dtype);
  return scratch[0] === 0;
}

/**
 * Whether a row of A [rank, inDim] is all zeros once rounded to `dtype` (what `zeroRowsLast`
 * moves): a row's scan ends at its first value that does not round to zero, so this is ~rank
 * reads for a trained adapter.
 */
export function hasZeroRow(A: Float32Array, rank: number, inDim: number, dtype: FloatDType): boolean {
  for (let j = 0; j < rank; j++) {
    let zero = true;
    for (let i = j * inDim, end = i + inDim; i < end && zero; i++) zero = roundsToZero(A[i]!, dtype);
    if (zero) return true;
  }
  return false;
}
