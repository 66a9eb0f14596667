import { type AttrsOf, type DecomposedRule, type Graph, type OpKey, type OpNode, type TensorType, type UnsupportedRule, type ValueId, decomposedRule, unsupportedRule } from '@stageml/ir';

import type { OnnxGraphBuilder } from './builder.js';

// NOTE: shaped like the other backends' rule contexts on purpose (the duplicates report lists it): each
// backend's rule sees its own emitter and value kind; only the `unsupported` entry is shared (@stageml/ir).
/** What a lowering sees when it translates one IR node. */
export interface LowerContext<K extends OpKey> {
  /** The builder to emit nodes, constants and run-time dims with. */
  readonly b: OnnxGraphBuilder;
  /** Normalized attributes; dim attributes may be symbolic (use `b.dim`/`b.shape`). */
  readonly attrs: AttrsOf<K>;
  /** Tensor names of the operands, in their compute types (see `computeType`). */
  readonly inputs: readonly string[];
  /** IR types of the operands (statically known symbols substituted). */
  readonly operands: readonly TensorType[];
  /** IR types of the results (statically known symbols substituted). */
  readonly results: readonly TensorType[];
  /**
   * Per operand, true when it travels in its own narrow ONNX type rather than its compute type:
   * u8 parameters that only feed kernels reading them natively (MatMulNBits codes and zero points).
   */
  readonly native?: readonly boolean[];
  /**
   * The IR graph and the node being lowered, for rules whose fused form is only valid when the
   * operands were built a certain way (the rotary tables' equal halves, attention's past ‖ new keys):
   * they read producers here; `nameOf` is the tensor of an IR value lowered already (else undefined).
   */
  readonly source?: { readonly graph: Graph; readonly node: OpNode; readonly nameOf: (v: ValueId) => string | undefined };
}

/** A lowering of op `K`: emits ONNX nodes and returns the result tensors' names. */
export interface Lowering<K extends OpKey> {
  readonly kind: 'lower';
  /** Emits the node's computation; results are in their compute types. */
  readonly lower: (ctx: LowerContext<K>) => readonly string[];
  /**
   * Whether results always hold values representable in their IR dtype (selections, copies,
   * comparisons), so the driver skips rounding to f16/bf16 and wrapping to i8/u8 after the node.
   */
  readonly exact: boolean;
}

/** An op the ONNX lowering cannot express faithfully, and why (`reason` becomes the `ONNX_UNSUPPORTED_OP` message). */
export type Unsupported = UnsupportedRule;

/** How the ONNX lowering handles op `K`. */
export type OnnxRule<K extends OpKey> = Lowering<K> | Unsupported | DecomposedRule;

/** The complete rule table: adding an op to `OPS` fails the build of every table until handled. */
export type OnnxRuleTable = { readonly [K in OpKey]: OnnxRule<K> };

/** A lowering whose results the driver conforms to narrow IR dtypes (f16/bf16 rounding, i8/u8 wrap). */
export function lowering<K extends OpKey>(lower: (ctx: LowerContext<K>) => readonly string[]): Lowering<K> {
  return { kind: 'lower', lower, exact: false };
}

/** A lowering whose results are always representable in their IR dtype (see `Lowering.exact`). */
export function exactLowering<K extends OpKey>(lower: (ctx: LowerContext<K>) => readonly string[]): Lowering<K> {
  return { kind: 'lower', lower, exact: true };
}

/** Lowers a composite op by its registry decomposition: `lowerToOnnx` expands such nodes into primitive ops first. */
export function decomposed(): DecomposedRule {
  return decomposedRule();
}

/** Marks an op as not expressible in ONNX; lowering a graph that uses it fails with `ONNX_UNSUPPORTED_OP`. */
export function unsupported(reason: string): Unsupported {
  return unsupportedRule(reason);
}
