import { StageError, registerErrorCodes } from '@stageml/ir';

/** Error codes of `@stageml/rewrite`. */
export const RwCode = registerErrorCodes({
  /** A pattern is malformed: unknown op, wrong operand count, unknown attribute, `commutative` on an op without the trait. */
  BAD_PATTERN: 'RW_BAD_PATTERN',
  /** A rule is malformed (bad name) or misbehaved (its builder declared an input or parameter, returned a foreign value, or used the value it replaces). */
  BAD_RULE: 'RW_BAD_RULE',
  /** Two rules passed to one driver share a name. */
  DUPLICATE_RULE: 'RW_DUPLICATE_RULE',
  /** A rule's guard or builder threw; the cause is attached and the message names the rule and node. */
  RULE_FAILED: 'RW_RULE_FAILED',
  /** A rule's replacement has a different type from the value it replaces. */
  TYPE_CHANGED: 'RW_TYPE_CHANGED',
  /** With `verifyEach`, the graph did not verify after a rule fired; the message names the rule. */
  VERIFY_FAILED: 'RW_VERIFY_FAILED',
  /** A driver or context option is out of range (iterations, sizes, budget, cost-model parameters). */
  BAD_OPTION: 'RW_BAD_OPTION',
}, {
  // Error classes (input / io / unavailable / internal): the CLI exit code and HTTP status derive from them.
  BAD_PATTERN: 'input',
  BAD_RULE: 'input',
  DUPLICATE_RULE: 'input',
  RULE_FAILED: 'internal',
  TYPE_CHANGED: 'internal',
  VERIFY_FAILED: 'internal',
  BAD_OPTION: 'input',
});

/** Union of `@stageml/rewrite` error codes. */
export type RwErrorCode = (typeof RwCode)[keyof typeof RwCode];

/** An error raised by patterns, rules or rewrite drivers. */
export class RewriteError extends StageError<RwErrorCode> {}
