import { type Dim, type DimBindings, type Graph, dimAsSymbol, dimSum, dimSymbols, dimToString, evalDim, opDef } from '@stageml/ir';
import type { Annotations } from './annotate.js';
import type { StageIndex, StageLattice } from './lattice.js';

/** The result of binding-time analysis: the earliest stage at which each value is known. */
export interface BindingTimes {
  /** The lattice the stages index. */
  readonly lattice: StageLattice;
  /** Stage of every value, indexed by value id. */
  readonly valueStage: Int32Array;
  /** Stage of every node, indexed by node index. */
  readonly nodeStage: Int32Array;
  /** Stage at which each dimension symbol becomes known (from the leaves whose shapes bind it). */
  readonly symbolStage: ReadonlyMap<string, StageIndex>;
}

/**
 * Binding-time analysis in one forward pass over the graph:
 *
 * - an input or parameter is at its annotated stage;
 * - a pure op is at the join (latest) of its operands' stages and of the stages of every dimension
 *   symbol its result types or attributes mention — shapes are data too, so `iota [seq]` is known
 *   only once `seq` is;
 * - a random or stateful op is at the top stage: never folded ahead of time.
 *
 * A symbol is known at the earliest stage of any leaf whose declared shape has it as a dim on its
 * own; a symbol no leaf binds is known only at the top stage.
 */
export function analyzeBindingTimes(graph: Graph, ann: Annotations): BindingTimes {
  const { lattice } = ann;
  const valueStage = new Int32Array(graph.values.length);
  const nodeStage = new Int32Array(graph.nodes.length);
  const symbolStage = new Map<string, StageIndex>();
  for (const n of graph.nodes) {
    if (n.kind === 'op') continue;
    const stage = ann.stages.get(n.name) ?? (n.kind === 'input' ? lattice.top : lattice.bottom);
    for (const d of graph.values[n.results[0]!]!.type.shape) {
      const s = dimAsSymbol(d);
      if (s !== undefined) symbolStage.set(s, Math.min(symbolStage.get(s) ?? lattice.top, stage));
    }
  }
  const symStage = (d: Dim): StageIndex => {
    let st = lattice.bottom;
    for (const s of dimSymbols(d)) st = lattice.join(st, symbolStage.get(s) ?? lattice.top);
    return st;
  };
  graph.nodes.forEach((n, i) => {
    let stage: StageIndex;
    if (n.kind !== 'op') stage = ann.stages.get(n.name) ?? (n.kind === 'input' ? lattice.top : lattice.bottom);
    else if (opDef(n.op).effect !== 'pure') stage = lattice.top;
    else {
      stage = lattice.bottom;
      for (const v of n.operands) stage = lattice.join(stage, valueStage[v]!);
      for (const r of n.results) for (const d of graph.values[r]!.type.shape) stage = lattice.join(stage, symStage(d));
      for (const [name, spec] of Object.entries(opDef(n.op).attrs)) {
        const v = n.attrs[name];
        if (v === undefined) continue;
        if (spec.kind === 'dim') stage = lattice.join(stage, symStage(v as Dim));
        else if (spec.kind === 'dims') for (const d of v as readonly Dim[]) stage = lattice.join(stage, symStage(d));
      }
    }
    nodeStage[i] = stage;
    for (const r of n.results) valueStage[r] = stage;
  });
  return { lattice, valueStage, nodeStage, symbolStage };
}

/** Per-stage totals of a binding-time analysis. */
export interface StageSummary {
  /** Stage name. */
  readonly stage: string;
  /** Op nodes first computable at this stage. */
  readonly ops: number;
  /** Inputs and parameters bound at this stage. */
  readonly leaves: number;
  /** FLOPs of those ops (symbolic text, e.g. `8192*batch`). */
  readonly flops: string;
  /** Bytes those ops read and write (symbolic text). */
  readonly bytes: string;
  /** FLOPs and bytes evaluated at the given sizes, when sizes were given. */
  readonly at?: { readonly flops: number; readonly bytes: number };
}

/**
 * Summarizes a binding-time analysis by stage: how many nodes, FLOPs and bytes become computable
 * at each stage (evaluated at `sizes` when given, e.g. `{ batch: 1, seq: 128 }`).
 */
export function stageReport(graph: Graph, bt: BindingTimes, sizes?: DimBindings): StageSummary[] {
  return bt.lattice.names.map((stage, s) => {
    let ops = 0;
    let leaves = 0;
    const flops: Dim[] = [];
    const bytes: Dim[] = [];
    graph.nodes.forEach((n, i) => {
      if (bt.nodeStage[i] !== s) return;
      if (n.kind !== 'op') {
        leaves++;
        return;
      }
      ops++;
      const c = opDef(n.op).cost(
        n.operands.map((v) => graph.values[v]!.type),
        n.results.map((v) => graph.values[v]!.type),
        n.attrs,
      );
      flops.push(c.flops);
      bytes.push(c.bytes);
    });
    const f = dimSum(flops);
    const by = dimSum(bytes);
    const base = { stage, ops, leaves, flops: dimToString(f), bytes: dimToString(by) };
    return sizes === undefined ? base : { ...base, at: { flops: evalDim(f, sizes), bytes: evalDim(by, sizes) } };
  });
}
