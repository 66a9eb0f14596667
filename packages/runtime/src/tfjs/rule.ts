import type * as tf from '@tensorflow/tfjs-core';
import { type AttrsOf, type DecomposedRule, type OpKey, type TensorType, type UnsupportedRule, decomposedRule, unsupportedRule } from '@stageml/ir';

import type { TfjsBackend } from './backend.js';

/** The device dtypes IR values map to (`f32`/`f16`/`bf16`/`f64` → float32, integers → int32). */
export type TfDType = 'float32' | 'int32' | 'bool';

/** What a lowering sees when it compiles one node. */
export interface LowerContext {
  /** The backend the node will run on (for backend-specific workarounds). */
  readonly backend: TfjsBackend;
  /** IR types of the operands (dims may be symbolic). */
  readonly operands: readonly TensorType[];
  /** IR types of the results (dims may be symbolic). */
  readonly results: readonly TensorType[];
  /**
   * A scalar of `dtype` (default float32) that lives as long as the lowered kernel: resident for the
   * prepared graph when the node is lowered at prepare time, freed with the run otherwise. Binary
   * tfjs ops need operands of one dtype, so integer constants must be int32 scalars.
   */
  scalar(value: number, dtype?: TfDType): tf.Scalar;
  /** Keeps a tensor the kernel reuses across runs (a precomputed mask or index list). */
  keep<T extends tf.Tensor>(t: T): T;
}

/**
 * A compiled node: maps the operand tensors to the result tensors. Called inside `tf.tidy`, so
 * intermediates need no disposal; it must not dispose its operands.
 */
export type Kernel = (xs: readonly tf.Tensor[]) => tf.Tensor[];

/** A lowering of op `K`: compiles a node from its concrete attributes. */
export interface Lowering<K extends OpKey> {
  readonly kind: 'lower';
  /** Compiles the node (attributes with every symbolic dim already evaluated). */
  readonly lower: (attrs: AttrsOf<K>, ctx: LowerContext) => Kernel;
  /**
   * Whether results always hold values representable in their IR dtype (selections, copies,
   * comparisons), so the executor skips rounding to f16/bf16 and wrapping to i8/u8 after the node.
   */
  readonly exact: boolean;
}

/** An op the tfjs executor cannot run faithfully, and why (`reason` becomes the `RT_UNSUPPORTED_OP` message at prepare time). */
export type Unsupported = UnsupportedRule;

/** How the tfjs executor handles op `K`: a lowering or an `unsupported` entry. */
export type TfRule<K extends OpKey> = Lowering<K> | Unsupported | DecomposedRule;

/** The complete rule table type: adding an op to `OPS` fails the build of every table until handled. */
export type TfRuleTable = { readonly [K in OpKey]: TfRule<K> };

/** A lowering whose results the executor conforms to narrow IR dtypes (f16/bf16 rounding, i8/u8 wrap). */
export function lowering<K extends OpKey>(lower: (attrs: AttrsOf<K>, ctx: LowerContext) => Kernel): Lowering<K> {
  return { kind: 'lower', lower, exact: false };
}

/** A lowering whose results are always representable in their IR dtype (see `Lowering.exact`). */
export function exactLowering<K extends OpKey>(lower: (attrs: AttrsOf<K>, ctx: LowerContext) => Kernel): Lowering<K> {
  return { kind: 'lower', lower, exact: true };
}

/** Runs a composite op by its registry decomposition: `prepareOnTfjs` expands such nodes into primitive ops first. */
export function decomposed(): DecomposedRule {
  return decomposedRule();
}

/** Marks an op as not runnable on tfjs; preparing a graph that uses it fails with `RT_UNSUPPORTED_OP`. */
export function unsupported(reason: string): Unsupported {
  return unsupportedRule(reason);
}
