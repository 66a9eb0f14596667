import { StageError, registerErrorCodes } from '@stageml/ir';

/** Error codes of `@stageml/triton-gen`. */
export const TritonCode = registerErrorCodes({
  /** An op of the residual has no Triton kernel (strict mode): the reason comes from the rule table. */
  UNSUPPORTED_OP: 'TRITON_UNSUPPORTED_OP',
  /** A recognized pattern computes in a dtype the kernels do not take (only f16, bf16, f32). */
  UNSUPPORTED_DTYPE: 'TRITON_UNSUPPORTED_DTYPE',
  /** A dim the kernels specialize on (in, out, rank, adapters, experts) is symbolic. */
  DYNAMIC_DIM: 'TRITON_DYNAMIC_DIM',
  /** The residual holds no pattern the generator emits kernels for. */
  NO_KERNELS: 'TRITON_NO_KERNELS',
  /** The output directory could not be written. */
  IO: 'TRITON_IO',
}, {
  // Error classes (input / io / unavailable / internal): the CLI exit code and HTTP status derive from them.
  UNSUPPORTED_OP: 'input',
  UNSUPPORTED_DTYPE: 'input',
  DYNAMIC_DIM: 'input',
  NO_KERNELS: 'input',
  IO: 'io',
});

/** Union of `@stageml/triton-gen` error codes. */
export type TritonErrorCode = (typeof TritonCode)[keyof typeof TritonCode];

/** An error raised while generating Triton kernels. */
export class TritonError extends StageError<TritonErrorCode> {}
