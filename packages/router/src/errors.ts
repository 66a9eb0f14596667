import { StageError, registerErrorCodes } from '@stageml/ir';

/** Error codes of `@stageml/router`. */
export const RouterCode = registerErrorCodes({
  /** No API key was given where one is required. */
  UNAUTHORIZED: 'ROUTER_UNAUTHORIZED',
  /** The API key is valid but its tenant may not use the requested model or adapter. */
  FORBIDDEN: 'ROUTER_FORBIDDEN',
  /** The requested model or adapter is not known. */
  UNKNOWN_MODEL: 'ROUTER_UNKNOWN_MODEL',
  /** The queue is full: try again later. */
  QUEUE_FULL: 'ROUTER_QUEUE_FULL',
  /** The router is draining and accepts no new requests. */
  DRAINING: 'ROUTER_DRAINING',
  /** The tenant configuration is malformed (named field). */
  BAD_CONFIG: 'ROUTER_BAD_CONFIG',
  /** A request is invalid (named field). */
  BAD_REQUEST: 'ROUTER_BAD_REQUEST',
  /** A request was cancelled (client gone) before it finished. */
  CANCELLED: 'ROUTER_CANCELLED',
}, {
  // Error classes (input / io / unavailable / internal): the CLI exit code and HTTP status derive from them.
  UNAUTHORIZED: { class: 'input', httpStatus: 401 },
  FORBIDDEN: { class: 'input', httpStatus: 403 },
  UNKNOWN_MODEL: { class: 'input', httpStatus: 404 },
  QUEUE_FULL: { class: 'unavailable', httpStatus: 429 },
  DRAINING: 'unavailable',
  BAD_CONFIG: 'input',
  BAD_REQUEST: 'input',
  CANCELLED: { class: 'input', httpStatus: 499 },
});

/** Union of `@stageml/router` error codes. */
export type RouterErrorCode = (typeof RouterCode)[keyof typeof RouterCode];

/** An error raised by the router: authorization, admission, configuration. */
export class RouterError extends StageError<RouterErrorCode> {}
