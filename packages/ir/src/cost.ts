import { type Dim, type DimBindings, dimSum, evalDim } from './dim.js';
import type { Graph } from './graph.js';
import { opDef } from './ops/index.js';

/** Symbolic FLOPs and bytes of a whole graph (or a subset of its nodes). */
export interface GraphCost {
  /** Total FLOPs, a polynomial in the graph's symbolic dims. */
  readonly flops: Dim;
  /** Total bytes read and written by op nodes. */
  readonly bytes: Dim;
}

/**
 * Sums each op node's registry cost. `include` restricts the sum to some node indices (e.g. the
 * nodes of one stage).
 */
export function graphCost(g: Graph, include?: (nodeIndex: number) => boolean): GraphCost {
  const flops: Dim[] = [];
  const bytes: Dim[] = [];
  g.nodes.forEach((n, i) => {
    if (n.kind !== 'op' || (include !== undefined && !include(i))) return;
    const def = opDef(n.op);
    const c = def.cost(
      n.operands.map((v) => g.values[v]!.type),
      n.results.map((v) => g.values[v]!.type),
      n.attrs,
    );
    flops.push(c.flops);
    bytes.push(c.bytes);
  });
  return { flops: dimSum(flops), bytes: dimSum(bytes) };
}

/** Evaluates a symbolic cost at concrete sizes (e.g. `{ batch: 1, seq: 128 }`). */
export function evalCost(c: GraphCost, bindings: DimBindings): { flops: number; bytes: number } {
  return { flops: evalDim(c.flops, bindings), bytes: evalDim(c.bytes, bindings) };
}
