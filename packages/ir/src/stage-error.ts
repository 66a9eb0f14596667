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
