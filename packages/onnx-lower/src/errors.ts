import { StageError, registerErrorCodes } from '@stageml/ir';

/** Error codes of `@stageml/onnx-lower`. */
export const OnnxCode = registerErrorCodes({
  /** An op has no ONNX lowering (its rule is `unsupported(reason)`); the message names the op and the reason. */
  UNSUPPORTED_OP: 'ONNX_UNSUPPORTED_OP',
  /** A symbolic dim mentions a symbol no graph input carries as a plain axis, so it cannot be computed at run time. */
  UNBOUND_SYMBOL: 'ONNX_UNBOUND_SYMBOL',
  /** A parameter's data was not supplied, or does not match its declared type. */
  BAD_WEIGHT: 'ONNX_BAD_WEIGHT',
  /** The graph cannot be expressed as an ONNX model (e.g. an output name collides with an input name). */
  BAD_GRAPH: 'ONNX_BAD_GRAPH',
  /** Writing a model or its external data failed. */
  IO: 'ONNX_IO',
}, {
  // Error classes (input / io / unavailable / internal): the CLI exit code and HTTP status derive from them.
  UNSUPPORTED_OP: 'input',
  UNBOUND_SYMBOL: 'input',
  BAD_WEIGHT: 'input',
  BAD_GRAPH: 'input',
  IO: 'io',
});

/** Union of `@stageml/onnx-lower` error codes. */
export type OnnxErrorCode = (typeof OnnxCode)[keyof typeof OnnxCode];

/** An error raised while lowering a graph to ONNX or writing the model. */
export class OnnxLowerError extends StageError<OnnxErrorCode> {}
