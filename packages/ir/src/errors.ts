/** Where in a graph (or in parsed text) an error points. */
export interface NodeRef {
  /** Name of the graph the node belongs to, when known. */
  readonly graph?: string | undefined;
  /** Index of the node in the graph's topological order. */
  readonly node?: number | undefined;
  /** Name of the value involved, when one is. */
  readonly value?: string | undefined;
  /** 1-based source position when the graph was parsed from text. */
  readonly line?: number | undefined;
  /** 1-based column of the source position. */
  readonly column?: number | undefined;
}

/** Options every coded error accepts. */
export interface StageErrorOptions {
  /** The IR node (or source position) the error points at. */
  readonly at?: NodeRef | undefined;
  /** A suggestion for the user. */
  readonly hint?: string | undefined;
  /** The foreign error this one wraps. */
  readonly cause?: unknown;
}

/**
 * Base class of every coded error in StageML. The code is public API: tests and tools match on it,
 * never on the message.
 */
export class StageError<C extends string = string> extends Error {
  /** Stable error code, e.g. `IR_SHAPE_MISMATCH`. */
  readonly code: C;
  /** The node or source position the error points at. */
  readonly at: NodeRef | undefined;
  /** A suggestion for the user. */
  readonly hint: string | undefined;

  /** Creates an error with a stable code, a message and optional location, hint and cause. */
  constructor(code: C, message: string, opts: StageErrorOptions = {}) {
    super(formatMessage(message, opts.at), opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = new.target.name;
    this.code = code;
    this.at = opts.at;
    this.hint = opts.hint;
  }
}

function formatMessage(message: string, at: NodeRef | undefined): string {
  if (at === undefined) return message;
  const parts: string[] = [];
  if (at.line !== undefined) parts.push(`${String(at.line)}:${String(at.column ?? 1)}`);
  if (at.graph !== undefined) parts.push(`@${at.graph}`);
  if (at.value !== undefined) parts.push(`%${at.value}`);
  else if (at.node !== undefined) parts.push(`node ${String(at.node)}`);
  return parts.length === 0 ? message : `${parts.join(' ')}: ${message}`;
}

/** Error codes of `@stageml/ir`. */
export const IrCode = {
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
} as const;

/** Union of `@stageml/ir` error codes. */
export type IrErrorCode = (typeof IrCode)[keyof typeof IrCode];

/** An error raised by `@stageml/ir` (verification, parsing, interpretation). */
export class IrError extends StageError<IrErrorCode> {}
