import { StageError, registerErrorCodes } from '@stageml/ir';

/** Error codes of `@stageml/sm90-native`. */
export const Sm90Code = registerErrorCodes({
  /** An op of the residual has no CUDA kernel (strict mode): the reason comes from the rule table. */
  UNSUPPORTED_OP: 'SM90_UNSUPPORTED_OP',
  /** A recognized pattern computes in a dtype the tensor-core kernels do not take (only f16, bf16). */
  UNSUPPORTED_DTYPE: 'SM90_UNSUPPORTED_DTYPE',
  /** A recognized pattern uses a feature the kernels lack (LoRA bias of B, rank above 64, [E, in, out] expert weights). */
  UNSUPPORTED_PATTERN: 'SM90_UNSUPPORTED_PATTERN',
  /** A dim breaks the kernels' 16-byte access rule: in, out and every rank must be multiples of 8. */
  BAD_SHAPE: 'SM90_BAD_SHAPE',
  /** A dim the kernels specialize on (in, out, rank, adapters, experts) is symbolic. */
  DYNAMIC_DIM: 'SM90_DYNAMIC_DIM',
  /** The residual holds no pattern the generator emits kernels for. */
  NO_KERNELS: 'SM90_NO_KERNELS',
  /** The output directory could not be written. */
  IO: 'SM90_IO',
}, {
  // Error classes (input / io / unavailable / internal): the CLI exit code and HTTP status derive from them.
  UNSUPPORTED_OP: 'input',
  UNSUPPORTED_DTYPE: 'input',
  UNSUPPORTED_PATTERN: 'input',
  BAD_SHAPE: 'input',
  DYNAMIC_DIM: 'input',
  NO_KERNELS: 'input',
  IO: 'io',
});

/** Union of `@stageml/sm90-native` error codes. */
export type Sm90ErrorCode = (typeof Sm90Code)[keyof typeof Sm90Code];

/** An error raised while generating CUDA kernels. */
export class Sm90Error extends StageError<Sm90ErrorCode> {}
