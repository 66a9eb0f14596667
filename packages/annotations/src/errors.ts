import { StageError, registerErrorCodes } from '@stageml/ir';

/** Error codes of `@stageml/annotations`. */
export const BtaCode = registerErrorCodes({
  /** A stage name is not in the lattice. */
  UNKNOWN_STAGE: 'BTA_UNKNOWN_STAGE',
  /** An annotation names an input or parameter the graph does not have (or a pattern matches none). */
  UNKNOWN_NAME: 'BTA_UNKNOWN_NAME',
  /** A lattice definition is invalid (empty, duplicate or malformed stage names). */
  BAD_LATTICE: 'BTA_BAD_LATTICE',
  /** One name is annotated twice with different stages. */
  CONFLICT: 'BTA_CONFLICT',
}, {
  // Error classes (input / io / unavailable / internal): the CLI exit code and HTTP status derive from them.
  UNKNOWN_STAGE: 'input',
  UNKNOWN_NAME: 'input',
  BAD_LATTICE: 'input',
  CONFLICT: 'input',
});

/** Union of `@stageml/annotations` error codes. */
export type BtaErrorCode = (typeof BtaCode)[keyof typeof BtaCode];

/** An error raised by stage lattices, annotations or binding-time analysis. */
export class BtaError extends StageError<BtaErrorCode> {}
