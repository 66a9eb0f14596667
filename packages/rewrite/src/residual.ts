import { analyzeBindingTimes } from '@stageml/annotations';
import type { Graph } from '@stageml/ir';
import { type RewriteContextOptions, resolveContext } from './context.js';
import type { CostEstimate } from './cost.js';
import { RewriteSession } from './session.js';

/** Per-request cost and constant memory of the residual a graph specializes to. */
export interface ResidualCost extends CostEstimate {
  /** Bytes of the static values the residual reads (its constant table). */
  readonly constantBytes: number;
  /** Op nodes computed per request (dynamic and needed by an output). */
  readonly dynamicOps: number;
}

/**
 * Estimates the residual of `graph` at the context's cutoff without specializing it: the cost of
 * every op an output needs that is later than the cutoff (per the context's cost model, at its
 * sizes), and the bytes of the static values those ops or the outputs read. The same accounting
 * the rewrite driver's cost checks use.
 */
export function residualCost(graph: Graph, context: RewriteContextOptions = {}): ResidualCost {
  const ctx = resolveContext(graph, context);
  const session = new RewriteSession(graph, analyzeBindingTimes(graph, ctx.annotations), ctx);
  const wg = session.wg;
  const dynamic = (i: number): boolean => wg.nodes[i]!.alive && wg.stages[wg.nodes[i]!.results[0]!]! > ctx.cutoff;
  const c = ctx.costModel.requestCost(graph, ctx.sizes, (i) => graph.nodes[i]!.kind === 'op' && dynamic(i));
  const dynamicOps = graph.nodes.filter((n, i) => n.kind === 'op' && dynamic(i)).length;
  return { ...c, constantBytes: session.estimate().constantBytes, dynamicOps };
}
