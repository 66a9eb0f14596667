import { registerErrorCodes } from './error-classes.js';
import { StageError } from './stage-error.js';

// The base class lives in its own module so the error-class registry can use it without a cycle.
export { StageError } from './stage-error.js';
export type { NodeRef, StageErrorOptions } from './stage-error.js';

/** Error codes of `@stageml/ir`. */
export const IrCode = registerErrorCodes({
  /** Operand types violate the op's shape rule. */
  SHAPE_MISMATCH: 'IR_SHAPE_MISMATCH',
  /** Operand dtypes violate the op's dtype rule. */
  DTYPE_MISMATCH: 'IR_DTYPE_MISMATCH',
  /** A node's recorded result type differs from what its op infers. */
  TYPE_MISMATCH: 'IR_TYPE_MISMATCH',
  /** A value is used before it is defined, or is not defined at all. */
  UNDEFINED_VALUE: 'IR_UNDEFINED_VALUE',
  /** The op key or printed op name is not in the registry. */
  UNKNOWN_OP: 'IR_UNKNOWN_OP',
  /** An op got the wrong number of operands. */
  OPERAND_COUNT: 'IR_OPERAND_COUNT',
  /** An attribute is missing, unknown, or of the wrong kind or range. */
  BAD_ATTR: 'IR_BAD_ATTR',
  /** Two inputs, two parameters, two outputs or two values share a name. */
  DUPLICATE_NAME: 'IR_DUPLICATE_NAME',
  /** The graph's structure is malformed (ids out of order, results not owned by their node, …). */
  MALFORMED_GRAPH: 'IR_MALFORMED_GRAPH',
  /** A dimension is invalid (negative, non-integer, or a symbolic expression that cannot be formed). */
  INVALID_DIM: 'IR_INVALID_DIM',
  /** A dtype name is unknown. */
  UNKNOWN_DTYPE: 'IR_UNKNOWN_DTYPE',
  /** The text form could not be parsed. */
  PARSE_ERROR: 'IR_PARSE_ERROR',
  /** The JSON form is malformed. */
  BAD_JSON: 'IR_BAD_JSON',
  /** The JSON form has a version this build does not read. */
  JSON_VERSION: 'IR_JSON_VERSION',
  /** A graph input was not supplied to the interpreter. */
  MISSING_INPUT: 'IR_MISSING_INPUT',
  /** A parameter's data is missing from the weight store. */
  MISSING_WEIGHT: 'IR_MISSING_WEIGHT',
  /** A runtime value's dtype or shape does not fit the declared type (or binds a symbol two ways). */
  BINDING_MISMATCH: 'IR_BINDING_MISMATCH',
  /** Evaluating an op failed at run time (an index out of range, a symbol with no binding, …). */
  EVAL_ERROR: 'IR_EVAL_ERROR',
  /** A pass failed, or produced a graph that does not verify. */
  PASS_FAILED: 'IR_PASS_FAILED',
  /** An error code was registered twice with different classes, or with a status outside its class. */
  ERROR_REGISTRY: 'IR_ERROR_REGISTRY',
}, {
  // A graph, its text or JSON form, or the values bound to it were rejected: the caller's input.
  SHAPE_MISMATCH: 'input',
  DTYPE_MISMATCH: 'input',
  TYPE_MISMATCH: 'input',
  UNDEFINED_VALUE: 'input',
  UNKNOWN_OP: 'input',
  OPERAND_COUNT: 'input',
  BAD_ATTR: 'input',
  DUPLICATE_NAME: 'input',
  MALFORMED_GRAPH: 'input',
  INVALID_DIM: 'input',
  UNKNOWN_DTYPE: 'input',
  PARSE_ERROR: 'input',
  BAD_JSON: 'input',
  JSON_VERSION: 'input',
  MISSING_INPUT: 'input',
  MISSING_WEIGHT: 'input',
  BINDING_MISMATCH: 'input',
  EVAL_ERROR: 'input',
  // A pass that breaks the graph is a bug in the pass.
  PASS_FAILED: 'internal',
  ERROR_REGISTRY: 'internal',
});

/** Union of `@stageml/ir` error codes. */
export type IrErrorCode = (typeof IrCode)[keyof typeof IrCode];

/** An error raised by `@stageml/ir` (verification, parsing, interpretation). */
export class IrError extends StageError<IrErrorCode> {}
