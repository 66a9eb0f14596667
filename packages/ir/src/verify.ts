import { normalizeAttrs } from './attrs.js';
import { checkDim } from './dim.js';
import { isDType } from './dtype.js';
import { IrCode, IrError, type NodeRef, StageError } from './errors.js';
import type { Graph, GraphNode, GraphOutput } from './graph.js';
import { operandArity } from './op-def.js';
import { isOpKey, opDef } from './ops/index.js';
import { type TensorType, typeEquals, typeToString } from './types.js';
import { errorMessage } from './error-classes.js';

const NAME_RE = /^[A-Za-z0-9_.$\-/:]+$/;

// NOTE: a plain boolean test, unlike Array.isArray, keeps the element type (no narrowing to any[]).
function isList(x: unknown): boolean {
  return Array.isArray(x);
}

function refOf(g: Graph, i: number, n: GraphNode | undefined): NodeRef {
  const span = g.spans?.[i];
  const first = isList(n?.results) ? n!.results[0] : undefined;
  return {
    graph: g.name,
    node: i,
    value: first === undefined ? undefined : g.values[first]?.name,
    line: span?.line,
    column: span?.column,
  };
}

function checkType(t: TensorType, at: NodeRef): void {
  const dtype: unknown = (t as { dtype?: unknown } | undefined)?.dtype;
  if (typeof dtype !== 'string' || !isDType(dtype)) {
    throw new IrError(IrCode.UNKNOWN_DTYPE, `unknown dtype '${String(dtype)}'`, { at });
  }
  if (!isList(t.shape)) throw new IrError(IrCode.INVALID_DIM, 'shape must be a list', { at });
  t.shape.forEach((d, i) => {
    try {
      checkDim(d, `dim ${String(i)}`);
    } catch (e) {
      throw new IrError(IrCode.INVALID_DIM, errorMessage(e), { at, cause: e });
    }
  });
}

/**
 * Checks a graph and returns every problem found, each a coded `IrError` pointing at its node:
 * structure (topological order, result ownership), names, op keys, operand counts, attributes,
 * and agreement of recorded result types with each op's inference.
 */
export function checkGraph(g: Graph): IrError[] {
  const shell = g as Partial<Graph> | null;
  if (typeof shell !== 'object' || shell === null || !isList(shell.nodes) || !isList(shell.values) || !isList(shell.outputs)) {
    return [new IrError(IrCode.MALFORMED_GRAPH, 'a graph needs nodes, values and outputs lists')];
  }
  const errors: IrError[] = [];
  const names = new Set<string>();
  const leafNames = new Set<string>();
  let nextValue = 0;
  g.nodes.forEach((n, i) => {
    const at = refOf(g, i, n);
    try {
      checkNode(g, n, i, at, nextValue, names, leafNames);
    } catch (e) {
      // Errors raised by an op's inference carry no location: attach this node's.
      if (e instanceof IrError && e.at !== undefined) errors.push(e);
      else if (e instanceof StageError) errors.push(new IrError(e.code as IrError['code'], e.message, { at, cause: e, hint: e.hint }));
      else errors.push(new IrError(IrCode.MALFORMED_GRAPH, `node ${String(i)} is malformed`, { at, cause: e }));
    }
    // NOTE: malformed input may hold anything where a node belongs, null included.
    const results: unknown = (n as GraphNode | null)?.results;
    nextValue += isList(results) ? (results as unknown[]).length : 0;
  });
  if (nextValue !== g.values.length) {
    errors.push(
      new IrError(IrCode.MALFORMED_GRAPH, `${String(g.values.length)} values but nodes define ${String(nextValue)}`, { at: { graph: g.name } }),
    );
  }
  const outNames = new Set<string>();
  for (const o of g.outputs) {
    if (typeof (o as unknown) !== 'object' || (o as GraphOutput | null) === null) {
      errors.push(new IrError(IrCode.MALFORMED_GRAPH, 'an output must be a { name, value } record', { at: { graph: g.name } }));
      continue;
    }
    if (outNames.has(o.name)) errors.push(new IrError(IrCode.DUPLICATE_NAME, `duplicate output name '${o.name}'`, { at: { graph: g.name } }));
    outNames.add(o.name);
    if (!Number.isInteger(o.value) || o.value < 0 || o.value >= g.values.length) {
      errors.push(new IrError(IrCode.UNDEFINED_VALUE, `output '${o.name}' returns an undefined value`, { at: { graph: g.name } }));
    }
  }
  return errors;
}

function checkNode(
  g: Graph,
  n: GraphNode,
  i: number,
  at: NodeRef,
  firstResult: number,
  names: Set<string>,
  leafNames: Set<string>,
): void {
  if (!isList(n.results) || !isList(n.operands)) throw new IrError(IrCode.MALFORMED_GRAPH, 'node lacks operands or results', { at });
  n.results.forEach((id, k) => {
    const v = g.values[id];
    if (id !== firstResult + k || v?.node !== i || v.index !== k) {
      throw new IrError(IrCode.MALFORMED_GRAPH, `result #${String(k)} of node ${String(i)} is not numbered in definition order`, { at });
    }
    if (typeof v.name !== 'string' || !NAME_RE.test(v.name)) throw new IrError(IrCode.MALFORMED_GRAPH, `bad value name ${JSON.stringify(v.name)}`, { at });
    if (names.has(v.name)) throw new IrError(IrCode.DUPLICATE_NAME, `value name '${v.name}' is defined twice`, { at });
    names.add(v.name);
    checkType(v.type, at);
  });
  for (const [k, id] of n.operands.entries()) {
    if (!Number.isInteger(id) || id < 0 || id >= firstResult) {
      throw new IrError(IrCode.UNDEFINED_VALUE, `operand ${String(k)} refers to a value not defined before this node`, { at });
    }
  }
  if (n.kind === 'input' || n.kind === 'param') {
    if (n.operands.length !== 0 || n.results.length !== 1) throw new IrError(IrCode.MALFORMED_GRAPH, `${n.kind} must have no operands and one result`, { at });
    if (g.values[n.results[0]!]!.name !== n.name) throw new IrError(IrCode.MALFORMED_GRAPH, `${n.kind} '${n.name}' must name its value the same`, { at });
    if (leafNames.has(n.name)) throw new IrError(IrCode.DUPLICATE_NAME, `duplicate ${n.kind} name '${n.name}'`, { at });
    leafNames.add(n.name);
    return;
  }
  if ((n as { kind: unknown }).kind !== 'op') throw new IrError(IrCode.MALFORMED_GRAPH, `unknown node kind '${JSON.stringify((n as { kind: unknown }).kind)}'`, { at });
  if (!isOpKey(n.op)) throw new IrError(IrCode.UNKNOWN_OP, `unknown op '${String(n.op)}'`, { at });
  const def = opDef(n.op);
  const arity = operandArity(def.operands);
  if (n.operands.length < arity.min || n.operands.length > arity.max) {
    throw new IrError(IrCode.OPERAND_COUNT, `${def.name} takes ${def.operands.join(', ') || 'no operands'}, got ${String(n.operands.length)} operands`, { at });
  }
  if (n.results.length !== def.results) {
    throw new IrError(IrCode.MALFORMED_GRAPH, `${def.name} has ${String(def.results)} results, node has ${String(n.results.length)}`, { at });
  }
  const attrs = normalizeAttrs(def.name, def.attrs, n.attrs, at);
  const inferred = def.infer(
    n.operands.map((v) => g.values[v]!.type),
    attrs,
  );
  inferred.forEach((t, k) => {
    const rec = g.values[n.results[k]!]!.type;
    if (!typeEquals(t, rec)) {
      throw new IrError(IrCode.TYPE_MISMATCH, `${def.name} infers ${typeToString(t)} for result ${String(k)}, graph records ${typeToString(rec)}`, { at });
    }
  });
}

/** Throws the first problem `checkGraph` finds. */
export function verifyGraph(g: Graph): void {
  const [first] = checkGraph(g);
  if (first !== undefined) throw first;
}
