import { StageError, registerErrorCodes } from '@stageml/ir';

/** Error codes of `@stageml/peft`. */
export const PeftCode = registerErrorCodes({
  /** `adapter_config.json` is missing a field, has a wrong type, or is not JSON. */
  BAD_CONFIG: 'PEFT_BAD_CONFIG',
  /** The adapter uses a feature StageML does not run (DoRA, a non-LoRA PEFT type, …), named in the message. */
  UNSUPPORTED: 'PEFT_UNSUPPORTED',
  /** A file of the adapter directory is missing or unreadable. */
  IO: 'PEFT_IO',
  /** An adapter tensor names a module the base model does not have. */
  UNKNOWN_MODULE: 'PEFT_UNKNOWN_MODULE',
  /** An adapter tensor's shape does not fit its base module (the message names the key and both shapes). */
  SHAPE_MISMATCH: 'PEFT_SHAPE_MISMATCH',
  /** A module has `lora_A` without `lora_B` (or the reverse), or an unrecognized tensor key. */
  BAD_TENSORS: 'PEFT_BAD_TENSORS',
  /** The adapter cache cannot hold an adapter within its byte budget. */
  CACHE_FULL: 'PEFT_CACHE_FULL',
  /** An adapter cannot be evicted: it is pinned or leased (in use). */
  IN_USE: 'PEFT_IN_USE',
  /** An argument is invalid (a negative budget, a loader reporting an invalid size). */
  BAD_ARGUMENT: 'PEFT_BAD_ARGUMENT',
  /** An adapter name is unknown to a bank or cache. */
  UNKNOWN_ADAPTER: 'PEFT_UNKNOWN_ADAPTER',
}, {
  // Error classes (input / io / unavailable / internal): the CLI exit code and HTTP status derive from them.
  BAD_CONFIG: 'input',
  UNSUPPORTED: 'input',
  IO: { class: 'io', httpStatus: 400 },
  UNKNOWN_MODULE: 'input',
  SHAPE_MISMATCH: 'input',
  BAD_TENSORS: 'input',
  CACHE_FULL: { class: 'unavailable', httpStatus: 507 },
  IN_USE: { class: 'unavailable', httpStatus: 409 },
  BAD_ARGUMENT: 'input',
  UNKNOWN_ADAPTER: { class: 'input', httpStatus: 404 },
});

/** Union of `@stageml/peft` error codes. */
export type PeftErrorCode = (typeof PeftCode)[keyof typeof PeftCode];

/** An error raised while loading, validating, attaching or caching adapters. */
export class PeftError extends StageError<PeftErrorCode> {}
