import { isDecomposedRule } from './backend-rule.js';
import { GraphBuilder, type Value } from './builder.js';
import type { Graph, OpNode, ValueId } from './graph.js';
import type { TensorType } from './types.js';
import { OP_KEYS, type OpKey, opDef } from './ops/index.js';

/** The ops of the registry that have a decomposition into primitive ops (composites). */
export const COMPOSITE_OPS: readonly OpKey[] = OP_KEYS.filter((k) => opDef(k).decompose !== undefined);

/**
 * Rewrites `g` with every composite op for which `expand(op, attrs, operandTypes)` holds (default: all) replaced
 * by its decomposition into primitive ops (a backend may fuse one form of an op and expand others),
 * and so on for the composites those decompositions emit;
 * `g` itself when there is none to expand. Inputs, parameters and outputs keep their names and order; the
 * input graph is not modified. A backend with no fused rule for a composite lowers this instead.
 */
export function expandComposites(g: Graph, expand: (op: OpKey, attrs: OpNode['attrs'], operands: readonly TensorType[]) => boolean = () => true): Graph {
  // Nothing to expand: the graph itself (no copy).
  const wants = (n: OpNode): boolean => opDef(n.op).decompose !== undefined && expand(n.op, n.attrs, n.operands.map((v) => g.values[v]!.type));
  if (!g.nodes.some((n) => n.kind === 'op' && wants(n))) return g;
  const b = new GraphBuilder(g.name);
  const env = new Map<ValueId, Value>();
  // Leaves first (in their order): their names are fixed, so no name a decomposition generates for
  // its values may take one of them (a graph may declare a parameter after ops, e.g. a folded value).
  for (const n of g.nodes) {
    if (n.kind === 'input') env.set(n.results[0]!, b.input(n.name, g.values[n.results[0]!]!.type));
    else if (n.kind === 'param') env.set(n.results[0]!, b.param(n.name, g.values[n.results[0]!]!.type));
  }
  for (const n of g.nodes) {
    if (n.kind === 'input' || n.kind === 'param') continue;
    const operands = n.operands.map((v) => env.get(v)!);
    const decompose = opDef(n.op).decompose as ((b: GraphBuilder, operands: readonly Value[], attrs: unknown) => Value[]) | undefined;
    const names = n.results.map((r) => g.values[r]!.name);
    const out =
      decompose !== undefined && wants(n) ? decompose(b, operands, n.attrs) : b.apply(n.op, operands, n.attrs, names.length === 1 ? { name: names[0]! } : { names });
    n.results.forEach((r, i) => env.set(r, out[i]!));
  }
  for (const o of g.outputs) b.output(o.name, env.get(o.value)!);
  // A decomposition may emit composites itself (`loraBankLinear` → `linear` + `loraBank`): expand
  // those the predicate wants too. Decompositions only ever go down to lower-level ops, so this ends.
  return expandComposites(b.build(), expand);
}

/**
 * Expands the composite ops whose entry in a backend's exhaustive rule table is `decomposed`
 * (`decomposedRule`), and ops the table does not name (added with `registerOp`); other nodes are
 * kept. What a backend driver runs before lowering `g`.
 */
export function expandDecomposed(g: Graph, rules: Readonly<Record<OpKey, unknown>>): Graph {
  return expandComposites(g, (op) => !Object.hasOwn(rules, op) || isDecomposedRule(rules[op]));
}
