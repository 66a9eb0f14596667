import { StageError, registerErrorCodes } from '@stageml/ir';

/** Error codes of `@stageml/structured`. */
export const StructuredCode = registerErrorCodes({
  /** A JSON schema uses a keyword or shape the compiler does not support (named). */
  UNSUPPORTED_SCHEMA: 'STRUCT_UNSUPPORTED_SCHEMA',
  /** A JSON schema is malformed (named field). */
  BAD_SCHEMA: 'STRUCT_BAD_SCHEMA',
  /** A regular expression does not parse or uses an unsupported construct (named). */
  BAD_REGEX: 'STRUCT_BAD_REGEX',
  /** A GBNF grammar does not parse, references an undefined rule, or is left-recursive (named). */
  BAD_GRAMMAR: 'STRUCT_BAD_GRAMMAR',
  /** A constraint spec is malformed (empty choice list, unknown kind). */
  BAD_SPEC: 'STRUCT_BAD_SPEC',
  /** A token was accepted that the constraint does not allow at that point. */
  REJECTED_TOKEN: 'STRUCT_REJECTED_TOKEN',
}, {
  UNSUPPORTED_SCHEMA: 'input',
  BAD_SCHEMA: 'input',
  BAD_REGEX: 'input',
  BAD_GRAMMAR: 'input',
  BAD_SPEC: 'input',
  REJECTED_TOKEN: 'internal',
});

/** Union of `@stageml/structured` error codes. */
export type StructuredErrorCode = (typeof StructuredCode)[keyof typeof StructuredCode];

/** An error raised while compiling or applying a decoding constraint. */
export class StructuredError extends StageError<StructuredErrorCode> {}
