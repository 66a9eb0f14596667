import { StageError, registerErrorCodes } from '@stageml/ir';

/** Error codes of `@stageml/mlir-lower`. Codes are public API: never renamed or reused. */
export const LowerCode = registerErrorCodes({
  /** The graph uses an op this lowering cannot express; the message names the op and the reason. */
  UNSUPPORTED_OP: 'LOWER_UNSUPPORTED_OP',
  /** A symbolic dimension cannot be computed from the function's arguments. */
  UNBOUND_DIM: 'LOWER_UNBOUND_DIM',
  /** A constant's dtype or shape differs from the parameter it binds. */
  BAD_CONSTANT: 'LOWER_BAD_CONSTANT',
  /** Lowering options are invalid (negative inline limit, unknown constants mode, bad name). */
  BAD_OPTIONS: 'LOWER_BAD_OPTIONS',
  /** An MLIR tool this operation needs (mlir-opt, mlir-cpu-runner, runner libraries) is not installed. */
  TOOL_MISSING: 'LOWER_TOOL_MISSING',
  /** An MLIR tool ran and failed (verification or execution); the message carries its diagnostics. */
  TOOL_FAILED: 'LOWER_TOOL_FAILED',
}, {
  // Error classes (input / io / unavailable / internal): the CLI exit code and HTTP status derive from them.
  UNSUPPORTED_OP: 'input',
  UNBOUND_DIM: 'input',
  BAD_CONSTANT: 'input',
  BAD_OPTIONS: 'input',
  TOOL_MISSING: 'unavailable',
  TOOL_FAILED: 'internal',
});

/** Union of `@stageml/mlir-lower` error codes. */
export type LowerErrorCode = (typeof LowerCode)[keyof typeof LowerCode];

/** An error raised while lowering a graph to MLIR or running the emitted module. */
export class LowerError extends StageError<LowerErrorCode> {}
