/**
 * A backend rule-table entry saying the backend cannot handle an op, and why. Every backend's
 * exhaustive rule table (ONNX, MLIR, tfjs, the GPU kernel backends) uses this one shape for its
 * `unsupported` entries; the backend turns `reason` into its own coded error.
 */
export interface UnsupportedRule {
  readonly kind: 'unsupported';
  /** Why the backend has no rule for the op (becomes the backend's `*_UNSUPPORTED_OP` message). */
  readonly reason: string;
}

/** Builds an `unsupported` rule-table entry with `reason`. */
export function unsupportedRule(reason: string): UnsupportedRule {
  return { kind: 'unsupported', reason };
}

/** Whether a rule-table entry (a function, an object with a `kind`, …) is an `unsupported` entry. */
export function isUnsupportedRule(rule: unknown): rule is UnsupportedRule {
  return typeof rule === 'object' && rule !== null && (rule as { kind?: unknown }).kind === 'unsupported';
}

/**
 * A backend rule-table entry saying the backend runs a composite op through its decomposition
 * (`OpDef.decompose`): the driver expands such nodes into primitive ops (`expandDecomposed`) before
 * lowering, so the backend needs no rule of its own for the composite.
 */
export interface DecomposedRule {
  readonly kind: 'decomposed';
}

/** Builds a `decomposed` rule-table entry. */
export function decomposedRule(): DecomposedRule {
  return { kind: 'decomposed' };
}

/** Whether a rule-table entry is a `decomposed` entry. */
export function isDecomposedRule(rule: unknown): rule is DecomposedRule {
  return typeof rule === 'object' && rule !== null && (rule as { kind?: unknown }).kind === 'decomposed';
}
