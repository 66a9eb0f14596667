import { StageError } from '@stageml/ir';

/** Error codes of `@stageml/runtime`. */
export const RuntimeCode = {
  /** A value needed at or before the cutoff (input or parameter) was not supplied. */
  MISSING_VALUE: 'RT_MISSING_VALUE',
  /** A supplied value has the wrong dtype or shape for its declared type. */
  BAD_VALUE: 'RT_BAD_VALUE',
  /** Evaluating a static node during specialization failed. */
  EVAL_FAILED: 'RT_EVAL_FAILED',
  /** A graph input was not supplied at run time. */
  MISSING_INPUT: 'RT_MISSING_INPUT',
  /** A run supplied an input the graph does not have. */
  UNKNOWN_INPUT: 'RT_UNKNOWN_INPUT',
  /** A parameter's data is in neither the constants nor the weight store. */
  MISSING_WEIGHT: 'RT_MISSING_WEIGHT',
  /** A residual bundle is missing, corrupt, or of another version. */
  BAD_BUNDLE: 'RT_BAD_BUNDLE',
  /** A requested executor backend is unknown or failed to load. */
  BACKEND_UNAVAILABLE: 'RT_BACKEND_UNAVAILABLE',
  /** An executor cannot run an op of the graph. */
  UNSUPPORTED_OP: 'RT_UNSUPPORTED_OP',
  /** A prepared program was used after `dispose()`. */
  DISPOSED: 'RT_DISPOSED',
  /** A file or directory could not be read or written. */
  IO: 'RT_IO',
  /** A weight quantization spec or request is invalid. */
  BAD_QUANT: 'RT_BAD_QUANT',
} as const;

/** Union of `@stageml/runtime` error codes. */
export type RuntimeErrorCode = (typeof RuntimeCode)[keyof typeof RuntimeCode];

/** An error raised by specialization, bundles or executors. */
export class RuntimeError extends StageError<RuntimeErrorCode> {}
