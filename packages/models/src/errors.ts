import { StageError, registerErrorCodes } from '@stageml/ir';

/** Error codes of `@stageml/models`. */
export const ModelCode = registerErrorCodes({
  /** The checkpoint's architecture (`model_type` / `architectures`) is not supported. */
  UNSUPPORTED_ARCH: 'MODEL_UNSUPPORTED_ARCH',
  /** A config field is missing, of the wrong type, or has a value StageML does not run (named). */
  BAD_CONFIG: 'MODEL_BAD_CONFIG',
  /** A file of the model directory is missing or unreadable. */
  IO: 'MODEL_IO',
  /** A checkpoint tensor is missing or has the wrong shape or dtype (the message names file and key). */
  BAD_WEIGHT: 'MODEL_BAD_WEIGHT',
  /** A token id is outside the vocabulary. */
  BAD_TOKEN: 'MODEL_BAD_TOKEN',
  /** An adapter does not fit this model or is not loaded. */
  BAD_ADAPTER: 'MODEL_BAD_ADAPTER',
  /** Generation options are invalid (temperature, top-p, top-k, max tokens, …). */
  BAD_OPTIONS: 'MODEL_BAD_OPTIONS',
}, {
  // Error classes (input / io / unavailable / internal): the CLI exit code and HTTP status derive from them.
  UNSUPPORTED_ARCH: 'input',
  BAD_CONFIG: 'input',
  IO: { class: 'io', httpStatus: 400 },
  BAD_WEIGHT: 'input',
  BAD_TOKEN: 'input',
  BAD_ADAPTER: 'input',
  BAD_OPTIONS: 'input',
});

/** Union of `@stageml/models` error codes. */
export type ModelErrorCode = (typeof ModelCode)[keyof typeof ModelCode];

/** An error raised while loading or running a model. */
export class ModelError extends StageError<ModelErrorCode> {}
