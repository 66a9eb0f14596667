import { StageError, type StageErrorOptions, registerErrorCodes } from '@stageml/ir';

/** Error codes of `@stageml/moe`. */
export const MoeCode = registerErrorCodes({
  /** Expert factors or weights do not fit the MoE block's shapes (named). */
  SHAPE_MISMATCH: 'MOE_SHAPE_MISMATCH',
  /** A MoE plan is malformed, of another version, or inconsistent with the model (named). */
  BAD_PLAN: 'MOE_BAD_PLAN',
  /** An adapter's parameter-targeted factors cannot be matched to expert tensors. */
  BAD_ADAPTER: 'MOE_BAD_ADAPTER',
}, {
  // Error classes (input / io / unavailable / internal): the CLI exit code and HTTP status derive from them.
  SHAPE_MISMATCH: 'input',
  BAD_PLAN: 'input',
  BAD_ADAPTER: 'input',
});

/** Union of `@stageml/moe` error codes. */
export type MoeErrorCode = (typeof MoeCode)[keyof typeof MoeCode];

/** An error raised by MoE blocks, expert adapters or plans. */
export class MoeError extends StageError<MoeErrorCode> {}

/**
 * A `MOE_BAD_PLAN` error about one entry of a plan document. `path` is the JSON path of the
 * offending entry (`$.units[3].expert`); the message starts with it.
 */
export class MoePlanError extends MoeError {
  /** JSON path of the offending entry, from the document root `$`. */
  readonly path: string;

  /** Creates a `MOE_BAD_PLAN` error pointing at `path`. */
  constructor(path: string, message: string, opts: StageErrorOptions = {}) {
    super(MoeCode.BAD_PLAN, `${path}: ${message}`, opts);
    this.path = path;
  }
}
