import {
  type AnnotationSpec,
  type Annotations,
  type StageLattice,
  TWO_STAGE,
  analyzeBindingTimes,
  annotate,
} from '@stageml/annotations';
import type { SpecializeReport } from '@stageml/bundle';
import {
  type AttrsIn,
  dimAsSymbol,
  type Graph,
  GraphBuilder,
  type HostTensor,
  IrError,
  type OpKey,
  StageError,
  type Value,
  type Dim,
  type DimBindings,
  type OpNode,
  type TensorType,
  bindDims,
  dimProduct,
  dimSymbols,
  dimToString,
  substituteDim,
  evaluateNode,
  graphCost,
  opDef,
  seededRandom,
  typeToString,
  errorMessage,
} from '@stageml/ir';
import { RuntimeCode, RuntimeError } from './errors.js';
import { type ValueSource, toStore } from './values.js';

/** Options of `specialize`. */
export interface SpecializeOptions {
  /** The lattice stages refer to (default `static < dynamic`); ignored when `annotations` is resolved. */
  readonly lattice?: StageLattice;
  /** Stages of inputs and parameters: a spec (names or globs → stage names) or resolved annotations. */
  readonly annotations?: AnnotationSpec | Annotations;
  /** The last stage computed ahead of time: everything at or before it is folded. */
  readonly cutoff: string;
  /** Values of inputs and parameters at or before the cutoff. */
  readonly values?: ValueSource;
  /**
   * Frontier values defined by constant-like ops (`constant`, `iota`) with at most this many
   * elements are re-emitted as ops in the residual rather than stored as constants (default 16).
   */
  readonly maxInlineElements?: number;
  /**
   * Plan only: compute the residual graph and the constant table's types from shapes alone,
   * without values and without evaluating anything (`constants` is then empty). Symbols stay
   * symbolic. Used to stage 70B-shaped graphs in milliseconds.
   */
  readonly shapesOnly?: boolean;
}

// NOTE: the report is stored in bundle manifests, so its type lives with the bundle format.
export type { SpecializeReport } from '@stageml/bundle';

/** A residual program and the constants it runs with. */
export interface SpecializeResult {
  /** The residual graph: its inputs are only values later than the cutoff. */
  readonly residual: Graph;
  /** Frontier values the residual reads as parameters, by name (empty with `shapesOnly`). */
  readonly constants: Readonly<Record<string, HostTensor>>;
  /** Types of the constant table's entries (also when `shapesOnly`). */
  readonly constantTypes: Readonly<Record<string, TensorType>>;
  /** Stages of the residual's inputs and parameters, to specialize it again at a later cutoff. */
  readonly annotations: Annotations;
  /** What was done. */
  readonly report: SpecializeReport;
}

function resolveAnnotations(graph: Graph, opts: SpecializeOptions): Annotations {
  const a = opts.annotations;
  if (a !== undefined && 'stages' in a && 'lattice' in a) return a;
  return annotate(graph, opts.lattice ?? TWO_STAGE, a);
}

function dimAttrs(n: OpNode): Dim[] {
  const out: Dim[] = [];
  for (const [name, spec] of Object.entries(opDef(n.op).attrs)) {
    const v = n.attrs[name];
    if (v === undefined) continue;
    if (spec.kind === 'dim') out.push(v as Dim);
    else if (spec.kind === 'dims') out.push(...(v as readonly Dim[]));
  }
  return out;
}

function substType(t: TensorType, bindings: DimBindings): TensorType {
  return { dtype: t.dtype, shape: t.shape.map((d) => substituteDim(d, bindings)) };
}

function substAttrs(n: OpNode, bindings: DimBindings): AttrsIn<OpKey> {
  const out: Record<string, unknown> = { ...n.attrs };
  for (const [name, spec] of Object.entries(opDef(n.op).attrs)) {
    const v = n.attrs[name];
    if (v === undefined) continue;
    if (spec.kind === 'dim') out[name] = substituteDim(v as Dim, bindings);
    else if (spec.kind === 'dims') out[name] = (v as readonly Dim[]).map((d) => substituteDim(d, bindings));
  }
  return out;
}

function hostBytes(t: HostTensor): number {
  return t.data.byteLength;
}

/**
 * Partial evaluation. Computes every value known at or before `cutoff` that the rest of the graph
 * needs — once — and returns a residual graph whose inputs are only the later values, plus a
 * table of the frontier constants it reads. Only frontier values are kept; static work nothing
 * uses is skipped and dead dynamic nodes are dropped. The input graph is not modified.
 *
 * Errors: a missing value is `RT_MISSING_VALUE` naming it; a wrongly typed one `RT_BAD_VALUE`;
 * a failing static node `RT_EVAL_FAILED` naming the node (never swallowed).
 */
export function specialize(graph: Graph, opts: SpecializeOptions): SpecializeResult {
  const ann = resolveAnnotations(graph, opts);
  const { lattice } = ann;
  const cut = lattice.index(opts.cutoff);
  const bt = analyzeBindingTimes(graph, ann);
  const isStatic = (v: number): boolean => bt.valueStage[v]! <= cut;
  const maxInline = opts.maxInlineElements ?? 16;

  // Backward liveness from the outputs through dynamic nodes; static values reached are the frontier.
  const neededDynamic = new Uint8Array(graph.nodes.length);
  const frontier = new Uint8Array(graph.values.length);
  const liveValue = new Uint8Array(graph.values.length);
  for (const o of graph.outputs) liveValue[o.value] = 1;
  for (let i = graph.nodes.length - 1; i >= 0; i--) {
    const n = graph.nodes[i]!;
    if (!n.results.some((r) => liveValue[r] === 1)) continue;
    if (n.results.every((r) => isStatic(r))) {
      for (const r of n.results) if (liveValue[r] === 1) frontier[r] = 1;
      continue;
    }
    neededDynamic[i] = 1;
    for (const v of n.operands) liveValue[v] = 1;
  }
  // Static nodes needed to compute the frontier.
  const neededStatic = new Uint8Array(graph.nodes.length);
  const want = Uint8Array.from(frontier);
  for (let i = graph.nodes.length - 1; i >= 0; i--) {
    const n = graph.nodes[i]!;
    if (!n.results.some((r) => want[r] === 1) || !n.results.every((r) => isStatic(r))) continue;
    neededStatic[i] = 1;
    for (const v of n.operands) want[v] = 1;
  }

  // Symbols the static work mentions must be bound by static leaves: a leaf that only binds a
  // symbol (e.g. the shape of an early input that `iota [batch]` depends on) is needed too.
  // The residual substitutes every symbol known by the cutoff, so static leaves that bind a symbol
  // some live node mentions are needed even when their data is not (e.g. the early input whose
  // shape `iota [batch]` depends on).
  const isKeptInput = (i: number): boolean => graph.nodes[i]!.kind === 'input' && !isStatic(graph.nodes[i]!.results[0]!);
  const bound = new Set<string>();
  const mentioned = new Set<string>();
  graph.nodes.forEach((n, i) => {
    if (neededStatic[i] !== 1 && neededDynamic[i] !== 1 && !isKeptInput(i)) return;
    for (const r of n.results) for (const d of graph.values[r]!.type.shape) for (const name of dimSymbols(d)) mentioned.add(name);
    if (n.kind === 'op') for (const d of dimAttrs(n)) for (const name of dimSymbols(d)) mentioned.add(name);
    else if (neededStatic[i] === 1) for (const d of graph.values[n.results[0]!]!.type.shape) if (dimAsSymbol(d) !== undefined) bound.add(dimAsSymbol(d)!);
  });
  graph.nodes.forEach((n, i) => {
    if (n.kind === 'op' || neededStatic[i] === 1 || !isStatic(n.results[0]!)) return;
    for (const d of graph.values[n.results[0]!]!.type.shape) {
      const name = dimAsSymbol(d);
      if (name !== undefined && mentioned.has(name) && !bound.has(name)) {
        neededStatic[i] = 1;
        bound.add(name);
      }
    }
  });

  // Values of the static leaves, checked against their declared types.
  const store = toStore(opts.values);
  const env = new Map<number, HostTensor>();
  const leaves: { name: string; type: Graph['values'][number]['type']; value: HostTensor }[] = [];
  const shapesOnly = opts.shapesOnly === true;
  graph.nodes.forEach((n, i) => {
    if (shapesOnly || neededStatic[i] !== 1 || n.kind === 'op') return;
    const vid = n.results[0]!;
    const type = graph.values[vid]!.type;
    const value = store.get(n.name);
    if (value === undefined) {
      throw new RuntimeError(
        RuntimeCode.MISSING_VALUE,
        `${n.kind} '${n.name}' (${typeToString(type)}) is at stage '${lattice.name(bt.valueStage[vid]!)}', at or before the cutoff '${opts.cutoff}', but no value was supplied`,
        { at: { graph: graph.name, node: i, value: n.name } },
      );
    }
    leaves.push({ name: n.name, type, value });
    env.set(vid, value);
  });
  let bindings: Record<string, number>;
  try {
    bindings = bindDims(leaves, {}, { allowUnbound: true });
  } catch (e) {
    throw new RuntimeError(RuntimeCode.BAD_VALUE, errorMessage(e), { cause: e });
  }

  const ctx = { random: seededRandom(0) };
  let folded = 0;
  graph.nodes.forEach((n, i) => {
    if (shapesOnly || neededStatic[i] !== 1 || n.kind !== 'op') return;
    let out: HostTensor[];
    try {
      out = evaluateNode(graph, i, n.operands.map((v) => env.get(v)!), bindings, ctx);
    } catch (e) {
      const msg = e instanceof StageError ? `${String(e.code)}: ${e.message}` : String(e);
      throw new RuntimeError(RuntimeCode.EVAL_FAILED, `evaluating static node %${graph.values[n.results[0]!]!.name} (${opDef(n.op).name}) failed: ${msg}`, {
        cause: e,
        at: e instanceof IrError ? e.at : { graph: graph.name, node: i },
      });
    }
    folded++;
    n.results.forEach((r, k) => env.set(r, out[k]!));
  });

  // Emit the residual in the original order.
  const b = new GraphBuilder(graph.name, { intern: false });
  const map = new Map<number, Value>();
  const constants: Record<string, HostTensor> = {};
  const constantTypes: Record<string, TensorType> = {};
  const stages = new Map<string, number>();
  let residualOps = 0;
  graph.nodes.forEach((n, i) => {
    for (const r of n.results) {
      if (frontier[r] !== 1) continue;
      const info = graph.values[r]!;
      const type = substType(info.type, bindings);
      const elements = dimProduct(type.shape);
      if (n.kind === 'op' && n.operands.length === 0 && opDef(n.op).traits.includes('constant-like') && typeof elements === 'number' && elements <= maxInline && n.results.length === 1) {
        map.set(r, b.apply(n.op, [], substAttrs(n, bindings), { names: [info.name] })[0]!);
        residualOps++;
      } else {
        map.set(r, b.param(info.name, type));
        if (!shapesOnly) constants[info.name] = env.get(r)!;
        constantTypes[info.name] = type;
        stages.set(info.name, bt.valueStage[r]!);
      }
    }
    // NOTE: dynamic inputs stay in the signature even when no output uses them, so callers of a
    // residual pass the same late inputs whatever the cutoff; unused dynamic parameters are dropped.
    const keepInput = n.kind === 'input' && !isStatic(n.results[0]!);
    if (neededDynamic[i] !== 1 && !keepInput) return;
    if (n.kind === 'input' || n.kind === 'param') {
      const type = substType(graph.values[n.results[0]!]!.type, bindings);
      map.set(n.results[0]!, n.kind === 'input' ? b.input(n.name, type) : b.param(n.name, type));
      stages.set(n.name, bt.valueStage[n.results[0]!]!);
      return;
    }
    const results = b.apply(
      n.op,
      n.operands.map((v) => map.get(v)!),
      substAttrs(n, bindings),
      { names: n.results.map((r) => graph.values[r]!.name) },
    );
    residualOps++;
    n.results.forEach((r, k) => map.set(r, results[k]!));
  });
  for (const o of graph.outputs) b.output(o.name, map.get(o.value)!);
  const residual = b.build();

  const staticOps = graph.nodes.filter((n, i) => n.kind === 'op' && n.results.every((r) => isStatic(r)) && neededStatic[i] !== 1).length;
  const dynamicOps = graph.nodes.filter((n) => n.kind === 'op' && !n.results.every((r) => isStatic(r))).length;
  let flopsMemo: { original: string; residual: string } | undefined;
  const report: SpecializeReport = {
    cutoff: opts.cutoff,
    lattice: lattice.toString(),
    originalOps: graph.nodes.filter((n) => n.kind === 'op').length,
    foldedOps: folded,
    skippedStaticOps: staticOps,
    residualOps,
    deadOps: dynamicOps - graph.nodes.filter((n, i) => n.kind === 'op' && neededDynamic[i] === 1).length,
    constants: Object.keys(constantTypes).length,
    constantBytes: shapesOnly ? 0 : Object.values(constants).reduce((a, t) => a + hostBytes(t), 0),
    residualInputs: residual.nodes.filter((n) => n.kind === 'input').map((n) => (n as { name: string }).name),
    // NOTE: computed on first read: costing two graphs is most of the time of a shapes-only
    // specialization of a 7B-shaped graph, and most callers never look.
    get flops(): { original: string; residual: string } {
      flopsMemo ??= { original: dimToString(graphCost(graph).flops), residual: dimToString(graphCost(residual).flops) };
      return flopsMemo;
    },
  };
  return { residual, constants, constantTypes, annotations: { lattice, stages }, report };
}
