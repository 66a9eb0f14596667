import { type OpKey, type UnsupportedRule, unsupportedRule as irUnsupportedRule } from '@stageml/ir';
import type { ResidualKernelKind } from './kernel-types.js';

/**
 * How a GPU kernel backend handles one op: lowered inside some kernel patterns (and left to the
 * host executor elsewhere, for the reason `outside`), or never (`unsupported`, with a reason).
 */
export type KernelRule =
  | {
      readonly kind: 'kernel';
      /** Patterns the op is lowered inside. */
      readonly patterns: readonly ResidualKernelKind[];
      /** Why an occurrence outside those patterns is left to the host executor. */
      readonly outside: string;
    }
  | UnsupportedRule;

/** A backend's exhaustive rule table (adding an op to `OPS` fails its build until handled). */
export type KernelRuleTable = Readonly<Record<OpKey, KernelRule>>;

/** An op lowered inside `patterns`; `outside` says why other occurrences run on the host. */
export function kernelRule(patterns: readonly ResidualKernelKind[], outside: string): KernelRule {
  return { kind: 'kernel', patterns, outside };
}

/** An op the backend emits no kernel for, with the reason. */
export function unsupportedRule(reason: string): KernelRule {
  return irUnsupportedRule(reason);
}

/** Why a backend with rule table `rules` leaves an op node of kind `op` to the host executor. */
export function hostReasonOf(rules: KernelRuleTable, op: OpKey): string {
  const r = rules[op];
  return r.kind === 'kernel' ? r.outside : r.reason;
}
