import { StageError, registerErrorCodes } from '@stageml/ir';

/** Error codes of `@stageml/engine`. */
export const EngineCode = registerErrorCodes({
  /** An option is invalid (named option and value). */
  BAD_OPTIONS: 'ENGINE_BAD_OPTIONS',
  /** An adapter cannot be served by this engine (whole-tensor overrides, rank above the slot rank, …). */
  BAD_ADAPTER: 'ENGINE_BAD_ADAPTER',
  /** The adapter is not loaded. */
  UNKNOWN_ADAPTER: 'ENGINE_UNKNOWN_ADAPTER',
  /** The sequence was released (or never attached) and cannot run. */
  BAD_SEQUENCE: 'ENGINE_BAD_SEQUENCE',
  /** Running the program failed. */
  RUN_FAILED: 'ENGINE_RUN_FAILED',
  /** The executor cannot run the engine's compute dtype (named executor and dtype). */
  UNSUPPORTED_DTYPE: 'ENGINE_UNSUPPORTED_DTYPE',
  /** What the engine must hold on the device does not fit the share of its memory it may use (`checkDeviceMemory`; the sizes named). */
  DEVICE_MEMORY: 'ENGINE_DEVICE_MEMORY',
}, {
  // Error classes (input / io / unavailable / internal): the CLI exit code and HTTP status derive from them.
  BAD_OPTIONS: 'input',
  BAD_ADAPTER: 'input',
  UNKNOWN_ADAPTER: { class: 'input', httpStatus: 404 },
  BAD_SEQUENCE: 'internal',
  RUN_FAILED: 'internal',
  UNSUPPORTED_DTYPE: 'input',
  DEVICE_MEMORY: 'input',
});

/** Union of `@stageml/engine` error codes. */
export type EngineErrorCode = (typeof EngineCode)[keyof typeof EngineCode];

/** An error raised by the serving engine. */
export class EngineError extends StageError<EngineErrorCode> {}
