import type { AttrSchema, AttrValues } from './attrs.js';
import type { GraphBuilder, Value } from './builder.js';
import { type Dim, dimAdd, dimSum } from './dim.js';
import { IrCode, IrError } from './errors.js';
import type { HostTensor } from './tensor.js';
import { type TensorType, typeBytes } from './types.js';

/**
 * What an op does besides computing its results. `pure` ops may be folded, reordered, CSE'd and
 * evaluated ahead of time; `random` and `stateful` ops never are.
 */
export type Effect = 'pure' | 'random' | 'stateful';

/** Facts generic passes query instead of op names. */
export type Trait =
  | 'elementwise'
  | 'broadcasting'
  | 'commutative'
  | 'associative'
  | 'reduction'
  | 'shape-only'
  | 'constant-like'
  | 'contraction';

/** FLOPs and bytes moved by one execution of a node, symbolic in the graph's dims. */
export interface OpCost {
  /** Floating-point (or integer) operations. */
  readonly flops: Dim;
  /** Bytes read from operands plus bytes written to results. */
  readonly bytes: Dim;
}

/** Context the interpreter hands to `evaluate`. */
export interface EvalContext {
  /** A deterministic source of uniform [0, 1) numbers for random ops. */
  readonly random: () => number;
}

/** The definition of one op: everything every consumer needs to know about it. */
export interface OpDef<K extends string = string, A extends AttrSchema = AttrSchema> {
  /** camelCase registry key (`loraResidual`). */
  readonly key: K;
  /** Printed name, `sml.<snake_case key>`. */
  readonly name: string;
  /** One-sentence summary. */
  readonly summary: string;
  /** The op's semantics in math notation, one line. */
  readonly semantics: string;
  /**
   * Operand names; a trailing `?` marks an optional trailing operand, a trailing `...` a variadic
   * last operand (at least one).
   */
  readonly operands: readonly string[];
  /** Attribute schema. */
  readonly attrs: A;
  /** Number of results. */
  readonly results: number;
  /** Side effects. */
  readonly effect: Effect;
  /** Traits generic passes query. */
  readonly traits: readonly Trait[];
  /** Result types from operand types; throws `IR_SHAPE_MISMATCH`/`IR_DTYPE_MISMATCH`/`IR_BAD_ATTR`. */
  readonly infer: (operands: readonly TensorType[], attrs: AttrValues<A>) => TensorType[];
  /** FLOPs and bytes of one execution. */
  readonly cost: (operands: readonly TensorType[], results: readonly TensorType[], attrs: AttrValues<A>) => OpCost;
  /** Reference semantics over host tensors, with symbolic attributes already made concrete. */
  readonly evaluate: (operands: readonly HostTensor[], attrs: AttrValues<A>, ctx: EvalContext) => HostTensor[];
  /**
   * For a composite op: the same computation in primitive ops, built with `b` (absent operands
   * left out). A backend needs the primitives plus, optionally, a fused rule; `expandComposites`
   * rewrites a graph into the decomposition.
   */
  readonly decompose?: Decomposition<A> | undefined;
}

/** How a composite op is built from primitive ops: one value per result. */
export type Decomposition<A extends AttrSchema = AttrSchema> = (b: GraphBuilder, operands: readonly Value[], attrs: AttrValues<A>) => Value[];

/** The fields `defineOp` takes (key given, name derived, defaults for the rest). */
export interface OpSpec<K extends string, A extends AttrSchema> {
  readonly key: K;
  readonly summary: string;
  readonly semantics: string;
  readonly operands: readonly string[];
  readonly attrs?: A;
  readonly results?: number;
  readonly effect?: Effect;
  readonly traits?: readonly Trait[];
  readonly infer: (operands: readonly TensorType[], attrs: AttrValues<A>) => TensorType[];
  /** FLOPs per execution; bytes default to operand plus result bytes. */
  readonly flops?: (operands: readonly TensorType[], results: readonly TensorType[], attrs: AttrValues<A>) => Dim;
  readonly evaluate: (operands: readonly HostTensor[], attrs: AttrValues<A>, ctx: EvalContext) => HostTensor[];
  /** Composite ops: the computation in primitive ops (see `OpDef.decompose`). */
  readonly decompose?: Decomposition<A>;
}

/** `loraResidual` → `lora_residual`. */
export function snakeCase(key: string): string {
  return key.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
}

/** Total bytes of a list of types. */
export function bytesOf(types: readonly TensorType[]): Dim {
  return dimSum(types.map(typeBytes));
}

/** Defines an op; the printed name is derived from the key (`matmul` → `sml.matmul`). */
export function defineOp<const K extends string, const A extends AttrSchema = Readonly<Record<string, never>>>(
  spec: OpSpec<K, A>,
): OpDef<K, A> {
  const flops = spec.flops;
  return {
    key: spec.key,
    name: `sml.${snakeCase(spec.key)}`,
    summary: spec.summary,
    semantics: spec.semantics,
    operands: spec.operands,
    attrs: spec.attrs ?? ({} as A),
    results: spec.results ?? 1,
    effect: spec.effect ?? 'pure',
    traits: spec.traits ?? [],
    infer: spec.infer,
    cost: (ops, res, attrs) => ({
      flops: flops === undefined ? 0 : flops(ops, res, attrs),
      bytes: dimAdd(bytesOf(ops), bytesOf(res)),
    }),
    evaluate: spec.evaluate,
    ...(spec.decompose === undefined ? {} : { decompose: spec.decompose }),
  };
}

/** Throws `IR_SHAPE_MISMATCH` with `msg`. */
export function shapeError(op: string, msg: string): never {
  throw new IrError(IrCode.SHAPE_MISMATCH, `${op}: ${msg}`);
}

/** Throws `IR_DTYPE_MISMATCH` with `msg`. */
export function dtypeError(op: string, msg: string): never {
  throw new IrError(IrCode.DTYPE_MISMATCH, `${op}: ${msg}`);
}

/** Throws `IR_EVAL_ERROR` with `msg`. */
export function evalError(op: string, msg: string): never {
  throw new IrError(IrCode.EVAL_ERROR, `${op}: ${msg}`);
}

/** Arity of an operand list: minimum and maximum counts (`Infinity` for variadic). */
export function operandArity(names: readonly string[]): { min: number; max: number } {
  const last = names[names.length - 1];
  if (last?.endsWith('...') === true) return { min: names.length, max: Number.POSITIVE_INFINITY };
  const optional = names.filter((n) => n.endsWith('?')).length;
  return { min: names.length - optional, max: names.length };
}
