import type { AttrValue } from './attrs.js';
import type { OpKey } from './ops/index.js';
import type { TensorType } from './types.js';

/** Index of a value in `Graph.values`. Values are numbered in definition order. */
export type ValueId = number;

/** An SSA value: one result of one node. */
export interface ValueInfo {
  /** Unique, readable name (`x`, `layers.0.attn.q`); printed as `%name`. */
  readonly name: string;
  /** Static type. */
  readonly type: TensorType;
  /** Index of the defining node in `Graph.nodes`. */
  readonly node: number;
  /** Which result of the defining node this is. */
  readonly index: number;
}

/** A graph input: a value supplied by the caller at run time. */
export interface InputNode {
  readonly kind: 'input';
  /** External name the caller binds (equals the value's name). */
  readonly name: string;
  readonly operands: readonly ValueId[];
  readonly results: readonly ValueId[];
}

/** A parameter: a named weight whose data lives outside the graph, in a weight store. */
export interface ParamNode {
  readonly kind: 'param';
  /** Weight-store key (equals the value's name). */
  readonly name: string;
  readonly operands: readonly ValueId[];
  readonly results: readonly ValueId[];
}

/** An application of a registry op. */
export interface OpNode {
  readonly kind: 'op';
  /** Registry key of the op. */
  readonly op: OpKey;
  /** Operand values, in the op's operand order. */
  readonly operands: readonly ValueId[];
  /** Normalized attributes (defaults filled in). */
  readonly attrs: Readonly<Record<string, AttrValue>>;
  readonly results: readonly ValueId[];
}

/** Any node. */
export type GraphNode = InputNode | ParamNode | OpNode;

/** A named graph output. */
export interface GraphOutput {
  /** External name of the output (stable across rewrites of the value behind it). */
  readonly name: string;
  /** The value returned. */
  readonly value: ValueId;
}

/** Source position of a parsed node (1-based). */
export interface SourceSpan {
  readonly line: number;
  readonly column: number;
}

/**
 * A dataflow graph of SSA values in topological order: inputs, parameters and op applications,
 * plus named outputs. Plain immutable data: passes return new graphs, and JSON and text forms are
 * exact images of it.
 */
export interface Graph {
  /** Graph name (`@name` in text). */
  readonly name: string;
  /** Nodes in topological order: every operand is defined by an earlier node. */
  readonly nodes: readonly GraphNode[];
  /** Values, indexed by `ValueId`, in definition order. */
  readonly values: readonly ValueInfo[];
  /** Named outputs. */
  readonly outputs: readonly GraphOutput[];
  /** Source positions of nodes (index-aligned with `nodes`) when parsed from text. */
  readonly spans?: readonly (SourceSpan | undefined)[] | undefined;
}

/** The value a single-result node defines. */
export function resultOf(node: GraphNode): ValueId {
  return node.results[0]!;
}

/** Input nodes, in order. */
export function graphInputs(g: Graph): InputNode[] {
  return g.nodes.filter((n): n is InputNode => n.kind === 'input');
}

/** Parameter nodes, in order. */
export function graphParams(g: Graph): ParamNode[] {
  return g.nodes.filter((n): n is ParamNode => n.kind === 'param');
}

/** Op nodes, in order. */
export function graphOps(g: Graph): OpNode[] {
  return g.nodes.filter((n): n is OpNode => n.kind === 'op');
}

/** For each value, the indices of the nodes that use it (graph outputs not included). */
export function valueUsers(g: Graph): number[][] {
  const users = g.values.map(() => [] as number[]);
  g.nodes.forEach((n, i) => {
    for (const v of n.operands) users[v]?.push(i);
  });
  return users;
}

/** The type of a value. */
export function valueType(g: Graph, v: ValueId): TensorType {
  return g.values[v]!.type;
}

/** Counts of nodes by kind and of ops by key. */
export function graphStats(g: Graph): { inputs: number; params: number; ops: number; byOp: Record<string, number> } {
  const byOp: Record<string, number> = {};
  let inputs = 0;
  let params = 0;
  let ops = 0;
  for (const n of g.nodes) {
    if (n.kind === 'input') inputs++;
    else if (n.kind === 'param') params++;
    else {
      ops++;
      byOp[n.op] = (byOp[n.op] ?? 0) + 1;
    }
  }
  return { inputs, params, ops, byOp };
}
