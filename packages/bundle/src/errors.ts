import { StageError, registerErrorCodes } from '@stageml/ir';

/** Error codes of `@stageml/bundle`. */
export const BundleCode = registerErrorCodes(
  {
    /** A residual bundle is missing, corrupt, or of another version. */
    INVALID: 'BUNDLE_INVALID',
    /** The bundle directory could not be written (or exists and `overwrite` was not given). */
    IO: 'BUNDLE_IO',
    /** The contents to write are inconsistent (a stage outside the lattice, a bad name). */
    BAD_CONTENTS: 'BUNDLE_BAD_CONTENTS',
  },
  { INVALID: 'input', IO: 'io', BAD_CONTENTS: 'input' },
);

/** Union of `@stageml/bundle` error codes. */
export type BundleErrorCode = (typeof BundleCode)[keyof typeof BundleCode];

/** An error raised reading or writing a residual bundle. */
export class BundleError extends StageError<BundleErrorCode> {}
