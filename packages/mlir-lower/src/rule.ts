import { type AttrsOf, type HostTensor, type OpKey, type TensorType, type UnsupportedRule, isUnsupportedRule, unsupportedRule } from '@stageml/ir';
import type { FunctionEmitter, ValueRef } from './emitter.js';

// NOTE: shaped like the other backends' rule contexts on purpose (the duplicates report lists it): each
// backend's rule sees its own emitter and value kind; only the `unsupported` entry is shared (@stageml/ir).
/** What a rule sees of the node it lowers. */
export interface RuleContext<K extends OpKey> {
  /** The function being written. */
  readonly e: FunctionEmitter;
  /** The node's normalized attributes. */
  readonly attrs: AttrsOf<K>;
  /** Operand values, in the op's operand order (absent optional operands are left out). */
  readonly operands: readonly ValueRef[];
  /** The node's result types. */
  readonly results: readonly TensorType[];
  /** IR names of the results (hints for SSA names). */
  readonly names: readonly string[];
  /**
   * Materializes a literal tensor under the module's constant policy: a `dense<…>` literal when
   * small, else a function argument or a `dense_resource` blob.
   */
  readonly literal: (value: HostTensor, name: string) => ValueRef;
}

/** Lowers one node: returns one SSA value per result. */
export type MlirRuleFn<K extends OpKey> = (ctx: RuleContext<K>) => readonly ValueRef[];

/** A rule table entry saying the op cannot be lowered, and why (the shared `@stageml/ir` shape). */
export type { UnsupportedRule } from '@stageml/ir';

/** How the MLIR lowering handles op `K`: a lowering function or an `unsupported` entry. */
export type MlirRule<K extends OpKey> = MlirRuleFn<K> | UnsupportedRule;

/** Marks an op as having no MLIR lowering; `reason` is reported in `LOWER_UNSUPPORTED_OP`. */
export function unsupported(reason: string): UnsupportedRule {
  return unsupportedRule(reason);
}

/** Whether a rule table entry is `unsupported(…)`. */
export function isUnsupported<K extends OpKey>(rule: MlirRule<K>): rule is UnsupportedRule {
  return isUnsupportedRule(rule);
}
