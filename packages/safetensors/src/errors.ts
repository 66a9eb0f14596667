import { StageError, type StageErrorOptions, registerErrorCodes } from '@stageml/ir';

/**
 * Error codes of `@stageml/safetensors`. Codes are public API: they are never renamed or reused,
 * and tests match on them, never on messages.
 */
export const SafetensorsCode = registerErrorCodes({
  /** The 8-byte header length exceeds the 100 MB limit (or does not fit in 53 bits). */
  HEADER_TOO_LARGE: 'ST_HEADER_TOO_LARGE',
  /** The header is not valid UTF-8, does not start with `{`, or is not well-formed JSON. */
  BAD_JSON: 'ST_BAD_JSON',
  /** A JSON object in the header repeats a key (JSON.parse would silently keep the last one). */
  DUPLICATE_KEY: 'ST_DUPLICATE_KEY',
  /** The header JSON is well formed but not the safetensors shape (an entry is not an object, a field is missing). */
  BAD_HEADER: 'ST_BAD_HEADER',
  /** A dtype is not a string naming a dtype this package decodes. */
  BAD_DTYPE: 'ST_BAD_DTYPE',
  /** A shape is not an array of non-negative safe integers, or its element count exceeds 2^53. */
  BAD_SHAPE: 'ST_BAD_SHAPE',
  /** `data_offsets` is not a pair of non-negative safe integers `[begin, end]` with `begin ≤ end`. */
  OFFSETS: 'ST_OFFSETS',
  /** Two tensors' byte ranges overlap. */
  OVERLAP: 'ST_OVERLAP',
  /** The tensors leave bytes of the data section unused (between tensors or after the last one). */
  GAP: 'ST_GAP',
  /** A tensor's byte length differs from its element count times its dtype's size. */
  SIZE_MISMATCH: 'ST_SIZE_MISMATCH',
  /** The file or buffer ends before the header or a tensor's data does. */
  TRUNCATED: 'ST_TRUNCATED',
  /** `__metadata__` is not an object whose values are all strings. */
  BAD_METADATA: 'ST_BAD_METADATA',
  /** An integer does not fit the host representation (an I64/U64 element beyond ±2^53, a value out of its dtype's range). */
  INT_RANGE: 'ST_INT_RANGE',
  /** A tensor given to the writer is malformed (reserved name, wrong storage, not a tensor at all). */
  BAD_TENSOR: 'ST_BAD_TENSOR',
  /** A tensor name is not in the file or checkpoint, or not in the shard the index points to. */
  MISSING_TENSOR: 'ST_MISSING_TENSOR',
  /** A shard file named by a checkpoint index does not exist. */
  MISSING_SHARD: 'ST_MISSING_SHARD',
  /** A directory holds neither `model.safetensors` nor `model.safetensors.index.json`. */
  NO_CHECKPOINT: 'ST_NO_CHECKPOINT',
  /** A checkpoint index (`*.safetensors.index.json`) is malformed. */
  BAD_INDEX: 'ST_BAD_INDEX',
  /** The file or checkpoint was read after `close()`. */
  CLOSED: 'ST_CLOSED',
  /** A file-system operation failed (open, read, write, rename); `cause` holds the system error. */
  IO: 'ST_IO',
}, {
  // Error classes (input / io / unavailable / internal): the CLI exit code and HTTP status derive from them.
  HEADER_TOO_LARGE: 'input',
  BAD_JSON: 'input',
  DUPLICATE_KEY: 'input',
  BAD_HEADER: 'input',
  BAD_DTYPE: 'input',
  BAD_SHAPE: 'input',
  OFFSETS: 'input',
  OVERLAP: 'input',
  GAP: 'input',
  SIZE_MISMATCH: 'input',
  TRUNCATED: 'input',
  BAD_METADATA: 'input',
  INT_RANGE: 'input',
  BAD_TENSOR: 'input',
  MISSING_TENSOR: 'input',
  MISSING_SHARD: 'input',
  NO_CHECKPOINT: 'input',
  BAD_INDEX: 'input',
  CLOSED: 'internal',
  IO: { class: 'io', httpStatus: 400 },
});

/** Union of `@stageml/safetensors` error codes. */
export type SafetensorsErrorCode = (typeof SafetensorsCode)[keyof typeof SafetensorsCode];

/** Options of a {@link SafetensorsError}: the base options plus the file and tensor involved. */
export interface SafetensorsErrorOptions extends StageErrorOptions {
  /** Path (or label, for in-memory buffers) of the file involved. */
  readonly file?: string | undefined;
  /** Name of the tensor involved. */
  readonly tensor?: string | undefined;
}

/** An error raised while reading, validating or writing safetensors data. */
export class SafetensorsError extends StageError<SafetensorsErrorCode> {
  /** Path (or label) of the file involved, when one is. */
  readonly file: string | undefined;
  /** Name of the tensor involved, when one is. */
  readonly tensor: string | undefined;

  /** Creates an error with a stable code; the message is prefixed with the file label when given. */
  constructor(code: SafetensorsErrorCode, message: string, opts: SafetensorsErrorOptions = {}) {
    super(code, opts.file === undefined ? message : `${opts.file}: ${message}`, opts);
    this.file = opts.file;
    this.tensor = opts.tensor;
  }
}

/** Whether `e` is a {@link SafetensorsError} (optionally with the given code). */
export function isSafetensorsError(e: unknown, code?: SafetensorsErrorCode): e is SafetensorsError {
  return e instanceof SafetensorsError && (code === undefined || e.code === code);
}
