import { type IrErrorCode, StageError } from '@stageml/ir';
import type { ModelErrorCode } from '@stageml/models';
import type { PeftErrorCode } from '@stageml/peft';
import type { RouterErrorCode } from '@stageml/router';
import type { RuntimeErrorCode } from '@stageml/runtime';
import type { SafetensorsErrorCode } from '@stageml/safetensors';

/** Error codes of the reference server itself. */
export const ServerCode = {
  /** The request body failed validation (the message names the field). */
  BAD_REQUEST: 'SERVER_BAD_REQUEST',
  /** The body exceeds the size limit. */
  BODY_TOO_LARGE: 'SERVER_BODY_TOO_LARGE',
  /** The prompt or requested tokens exceed the server's token limits. */
  TOO_MANY_TOKENS: 'SERVER_TOO_MANY_TOKENS',
  /** An adapter cannot be unloaded while requests use it. */
  ADAPTER_BUSY: 'SERVER_ADAPTER_BUSY',
  /** An adapter with that name is already loaded. */
  ADAPTER_EXISTS: 'SERVER_ADAPTER_EXISTS',
  /** No route matches. */
  NOT_FOUND: 'SERVER_NOT_FOUND',
} as const;

/** Union of server error codes. */
export type ServerErrorCode = (typeof ServerCode)[keyof typeof ServerCode];

/** An error raised by the server (validation, limits, adapter management). */
export class ServerError extends StageError<ServerErrorCode> {}

type Code = ServerErrorCode | RouterErrorCode | ModelErrorCode | PeftErrorCode | RuntimeErrorCode | IrErrorCode | SafetensorsErrorCode;

const ST = 400;

/**
 * HTTP status of every error code the server can meet, in one table (STYLE §6.5): input errors
 * are 4xx, failures of the server's own machinery 5xx.
 */
export const HTTP_STATUS = {
  SERVER_BAD_REQUEST: 400,
  SERVER_BODY_TOO_LARGE: 413,
  SERVER_TOO_MANY_TOKENS: 400,
  SERVER_ADAPTER_BUSY: 409,
  SERVER_ADAPTER_EXISTS: 409,
  SERVER_NOT_FOUND: 404,
  ROUTER_UNAUTHORIZED: 401,
  ROUTER_FORBIDDEN: 403,
  ROUTER_UNKNOWN_MODEL: 404,
  ROUTER_QUEUE_FULL: 429,
  ROUTER_DRAINING: 503,
  ROUTER_BAD_CONFIG: 500,
  ROUTER_BAD_REQUEST: 400,
  ROUTER_CANCELLED: 499,
  MODEL_UNSUPPORTED_ARCH: 400,
  MODEL_BAD_CONFIG: 400,
  MODEL_IO: 400,
  MODEL_BAD_WEIGHT: 400,
  MODEL_BAD_TOKEN: 400,
  MODEL_BAD_ADAPTER: 400,
  MODEL_BAD_OPTIONS: 400,
  PEFT_BAD_CONFIG: 400,
  PEFT_UNSUPPORTED: 400,
  PEFT_IO: 400,
  PEFT_UNKNOWN_MODULE: 400,
  PEFT_SHAPE_MISMATCH: 400,
  PEFT_BAD_TENSORS: 400,
  PEFT_CACHE_FULL: 507,
  PEFT_IN_USE: 409,
  PEFT_BAD_ARGUMENT: 400,
  PEFT_UNKNOWN_ADAPTER: 404,
  RT_MISSING_VALUE: 500,
  RT_BAD_VALUE: 400,
  RT_EVAL_FAILED: 500,
  RT_MISSING_INPUT: 500,
  RT_UNKNOWN_INPUT: 500,
  RT_MISSING_WEIGHT: 500,
  RT_BAD_BUNDLE: 500,
  RT_BACKEND_UNAVAILABLE: 500,
  RT_UNSUPPORTED_OP: 500,
  RT_DISPOSED: 500,
  RT_IO: 500,
  RT_BAD_QUANT: 400,
  IR_SHAPE_MISMATCH: 500,
  IR_DTYPE_MISMATCH: 500,
  IR_TYPE_MISMATCH: 500,
  IR_UNDEFINED_VALUE: 500,
  IR_UNKNOWN_OP: 500,
  IR_OPERAND_COUNT: 500,
  IR_BAD_ATTR: 500,
  IR_DUPLICATE_NAME: 500,
  IR_MALFORMED_GRAPH: 500,
  IR_INVALID_DIM: 500,
  IR_UNKNOWN_DTYPE: 500,
  IR_PARSE_ERROR: 500,
  IR_BAD_JSON: 500,
  IR_JSON_VERSION: 500,
  IR_MISSING_INPUT: 500,
  IR_MISSING_WEIGHT: 500,
  IR_BINDING_MISMATCH: 500,
  IR_EVAL_ERROR: 500,
  IR_PASS_FAILED: 500,
  ST_HEADER_TOO_LARGE: ST,
  ST_BAD_JSON: ST,
  ST_DUPLICATE_KEY: ST,
  ST_BAD_HEADER: ST,
  ST_BAD_DTYPE: ST,
  ST_BAD_SHAPE: ST,
  ST_OFFSETS: ST,
  ST_OVERLAP: ST,
  ST_GAP: ST,
  ST_SIZE_MISMATCH: ST,
  ST_TRUNCATED: ST,
  ST_BAD_METADATA: ST,
  ST_INT_RANGE: ST,
  ST_BAD_TENSOR: ST,
  ST_MISSING_TENSOR: ST,
  ST_MISSING_SHARD: ST,
  ST_NO_CHECKPOINT: ST,
  ST_BAD_INDEX: ST,
  ST_CLOSED: 500,
  ST_IO: ST,
} as const satisfies Record<Code, number>;

/** OpenAI-style error type for a status. */
export function errorType(status: number): string {
  if (status === 401) return 'authentication_error';
  if (status === 403) return 'permission_error';
  if (status === 404) return 'not_found_error';
  if (status === 429) return 'rate_limit_error';
  if (status >= 500) return 'server_error';
  return 'invalid_request_error';
}

/** Status for any thrown value: coded errors by table, anything else 500. */
export function statusOf(e: unknown): number {
  if (e instanceof StageError) return (HTTP_STATUS as Record<string, number>)[String(e.code)] ?? 500;
  return 500;
}
