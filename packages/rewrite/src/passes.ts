import { TWO_STAGE } from '@stageml/annotations';
import type { Graph, GraphNode, GraphOutput, Pass, ValueInfo } from '@stageml/ir';
import { WorkGraph, opKey } from './work-graph.js';

/**
 * Emits the live part of a working graph as an IR graph: nodes in a topological order that keeps
 * the original order where it can (a node comes right after its last operand's definition at the
 * earliest), values renumbered, duplicate pure applications merged (CSE, commutative operands in
 * either order), inputs and parameters always kept.
 */
export function materialize(wg: WorkGraph): Graph {
  const order: number[] = [];
  const state = new Uint8Array(wg.nodes.length);
  for (let i = 0; i < wg.nodes.length; i++) {
    if (!wg.nodes[i]!.alive || state[i] !== 0) continue;
    state[i] = 1;
    const stack: [number, number][] = [[i, 0]];
    while (stack.length > 0) {
      const top = stack[stack.length - 1]!;
      const n = wg.nodes[top[0]]!;
      if (top[1] < n.operands.length) {
        const p = wg.nodeOf[n.operands[top[1]++]!]!;
        if (state[p] === 0) {
          state[p] = 1;
          stack.push([p, 0]);
        }
      } else {
        stack.pop();
        order.push(top[0]);
      }
    }
  }
  const map = new Int32Array(wg.names.length).fill(-1);
  const nodes: GraphNode[] = [];
  const values: ValueInfo[] = [];
  const used = new Set<string>();
  for (const i of order) {
    const n = wg.nodes[i]!;
    if (n.kind === 'op') continue;
    used.add(n.name);
  }
  const cse = new Map<string, readonly number[]>();
  for (const i of order) {
    const n = wg.nodes[i]!;
    if (n.kind !== 'op') {
      const id = values.length;
      values.push({ name: n.name, type: wg.types[n.results[0]!]!, node: nodes.length, index: 0 });
      nodes.push({ kind: n.kind, name: n.name, operands: [], results: [id] });
      map[n.results[0]!] = id;
      continue;
    }
    const operands = n.operands.map((o) => map[o]!);
    const key = opKey(n.op, operands, n.attrKey);
    const hit = key === undefined ? undefined : cse.get(key);
    if (hit !== undefined) {
      n.results.forEach((r, k) => (map[r] = hit[k]!));
      continue;
    }
    const results = n.results.map((r, k) => {
      const id = values.length;
      const base = wg.displayName(r);
      let name = base;
      for (let s = 1; used.has(name); s++) name = `${base}_${String(s)}`;
      used.add(name);
      values.push({ name, type: wg.types[r]!, node: nodes.length, index: k });
      map[r] = id;
      return id;
    });
    if (key !== undefined) cse.set(key, results);
    nodes.push({ kind: 'op', op: n.op, operands, attrs: n.attrs, results });
  }
  const outputs: GraphOutput[] = wg.outputs.map((o) => ({ name: o.name, value: map[o.value]! }));
  return { name: wg.name, nodes, values, outputs };
}

/**
 * Dead-code elimination: drops op nodes no output depends on. Inputs and parameters stay, so the
 * signature and the weight names a caller binds never change. Order and names are kept.
 */
export function eliminateDeadCode(g: Graph): Graph {
  const live = new Uint8Array(g.values.length);
  for (const o of g.outputs) live[o.value] = 1;
  const keep = new Uint8Array(g.nodes.length);
  for (let i = g.nodes.length - 1; i >= 0; i--) {
    const n = g.nodes[i]!;
    if (n.kind === 'op' && !n.results.some((r) => live[r] === 1)) continue;
    keep[i] = 1;
    for (const v of n.operands) live[v] = 1;
  }
  if (keep.every((k) => k === 1)) return g;
  const map = new Int32Array(g.values.length).fill(-1);
  const nodes: GraphNode[] = [];
  const values: ValueInfo[] = [];
  g.nodes.forEach((n, i) => {
    if (keep[i] !== 1) return;
    const results = n.results.map((r, k) => {
      map[r] = values.length;
      values.push({ ...g.values[r]!, node: nodes.length, index: k });
      return map[r];
    });
    const operands = n.operands.map((v) => map[v]!);
    nodes.push(n.kind === 'op' ? { ...n, operands, results } : { ...n, operands: [], results });
  });
  return { name: g.name, nodes, values, outputs: g.outputs.map((o) => ({ name: o.name, value: map[o.value]! })) };
}

/**
 * Common-subexpression elimination: a pure op applied to the same operands with the same
 * attributes as an earlier one (commutative ops in either operand order, per the registry's
 * traits) is replaced by it; random and stateful ops are never merged. Dead code goes too.
 */
export function eliminateCommonSubexpressions(g: Graph): Graph {
  const stages = new Int32Array(g.values.length);
  const wg = new WorkGraph(g, { lattice: TWO_STAGE, valueStage: stages, nodeStage: new Int32Array(g.nodes.length), symbolStage: new Map() });
  return materialize(wg);
}

/** `eliminateDeadCode` as a pass for the IR's `PassManager`. */
export const dcePass: Pass = { name: 'dce', run: eliminateDeadCode };

/** `eliminateCommonSubexpressions` as a pass for the IR's `PassManager`. */
export const csePass: Pass = { name: 'cse', run: eliminateCommonSubexpressions };
