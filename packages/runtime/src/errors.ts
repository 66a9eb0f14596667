import { StageError, registerErrorCodes } from '@stageml/ir';

/** Error codes of `@stageml/runtime`. */
export const RuntimeCode = registerErrorCodes({
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
  /** A requested executor backend is unknown or failed to load. */
  BACKEND_UNAVAILABLE: 'RT_BACKEND_UNAVAILABLE',
  /** An executor cannot run an op of the graph. */
  UNSUPPORTED_OP: 'RT_UNSUPPORTED_OP',
  /** A prepared program was used after `dispose()`. */
  DISPOSED: 'RT_DISPOSED',
  /** A file or directory could not be read or written. */
  IO: 'RT_IO',
  /** The torch worker process died, could not start, or broke the frame protocol. */
  WORKER_FAILED: 'RT_WORKER_FAILED',
  /** A weight quantization spec or request is invalid. */
  BAD_QUANT: 'RT_BAD_QUANT',
  /** A run reads caches the executor no longer holds (a restarted worker) and the caller gave no copy to restore them from (`CacheLostError`). */
  CACHE_LOST: 'RT_CACHE_LOST',
  /** A tensor-parallel size the model or the machine cannot take: not an integer >= 1, more CUDA ranks than devices, attention heads it does not divide. */
  TENSOR_PARALLEL: 'RT_TENSOR_PARALLEL',
}, {
  // Error classes (input / io / unavailable / internal): the CLI exit code and HTTP status derive from them.
  MISSING_VALUE: 'input',
  BAD_VALUE: 'input',
  EVAL_FAILED: 'input',
  MISSING_INPUT: 'input',
  UNKNOWN_INPUT: 'input',
  MISSING_WEIGHT: 'input',
  BACKEND_UNAVAILABLE: 'unavailable',
  UNSUPPORTED_OP: 'input',
  DISPOSED: 'internal',
  IO: 'io',
  WORKER_FAILED: 'internal',
  BAD_QUANT: 'input',
  CACHE_LOST: 'unavailable',
  TENSOR_PARALLEL: 'input',
});

/** Union of `@stageml/runtime` error codes. */
export type RuntimeErrorCode = (typeof RuntimeCode)[keyof typeof RuntimeCode];

/** An error raised by specialization, bundles or executors. */
export class RuntimeError extends StageError<RuntimeErrorCode> {}

/**
 * `RT_CACHE_LOST`: a run named caches (`RunOptions.caches`) the executor does not hold at the
 * caller's length (its worker was restarted) and whose rows have no `restore`. Nothing was sent or
 * changed; `ids` are the lost caches, which the caller rebuilds (the engine prefills the
 * sequences' tokens again) before running again.
 */
export class CacheLostError extends RuntimeError {
  constructor(
    /** The caches the executor lacks. */
    readonly ids: readonly number[],
    message: string,
  ) {
    super(RuntimeCode.CACHE_LOST, message, { hint: 'rebuild those caches from length 0 (or give each row a restore), then run again' });
  }
}
