import { StageError, classifyError, errorCodeInfo, registerErrorCodes } from '@stageml/ir';

/** Error codes of the reference server itself. */
export const ServerCode = registerErrorCodes({
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
  /** A `lora_path` is outside every allowed adapter root, or not a regular adapter directory. */
  ADAPTER_PATH: 'SERVER_ADAPTER_PATH',
  /** An adapter load did not finish within the load timeout (nothing was changed). */
  ADAPTER_TIMEOUT: 'SERVER_ADAPTER_TIMEOUT',
  /** The request body did not arrive within the body timeout. */
  BODY_TIMEOUT: 'SERVER_BODY_TIMEOUT',
}, {
  // Error classes (input / io / unavailable / internal): the CLI exit code and HTTP status derive from them.
  BAD_REQUEST: 'input',
  BODY_TOO_LARGE: { class: 'input', httpStatus: 413 },
  TOO_MANY_TOKENS: 'input',
  ADAPTER_BUSY: { class: 'unavailable', httpStatus: 409 },
  ADAPTER_EXISTS: { class: 'input', httpStatus: 409 },
  NOT_FOUND: { class: 'input', httpStatus: 404 },
  ADAPTER_PATH: 'input',
  ADAPTER_TIMEOUT: { class: 'unavailable', httpStatus: 504 },
  BODY_TIMEOUT: { class: 'input', httpStatus: 408 },
});

/** Union of server error codes. */
export type ServerErrorCode = (typeof ServerCode)[keyof typeof ServerCode];

/** An error raised by the server (validation, limits, adapter management). */
export class ServerError extends StageError<ServerErrorCode> {}

/**
 * HTTP status of an error code, derived from the class its package registered it with
 * (`registerErrorCodes` in `@stageml/ir`): input errors are 4xx, failures of the server's own
 * machinery 5xx. Unregistered codes are 500.
 */
export function httpStatusOf(code: string): number {
  return errorCodeInfo(code)?.httpStatus ?? 500;
}

/** OpenAI-style error type for a status. */
export function errorType(status: number): string {
  if (status === 401) return 'authentication_error';
  if (status === 403) return 'permission_error';
  if (status === 404) return 'not_found_error';
  if (status === 429) return 'rate_limit_error';
  if (status >= 500) return 'server_error';
  return 'invalid_request_error';
}

/** Status for any thrown value: coded errors by their registered class, anything else 500. */
export function statusOf(e: unknown): number {
  return classifyError(e).httpStatus;
}
