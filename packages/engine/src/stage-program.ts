import { type AnnotationSpec, type Annotations, SERVING_STAGES, annotate } from '@stageml/annotations';
import { type Graph, type HostTensor, type TensorType, type WeightStore, graphInputs, graphParams } from '@stageml/ir';
import { canonicalRules, rewriteGreedy } from '@stageml/rewrite';
import { type SpecializeReport, specialize } from '@stageml/runtime';
import { EngineCode, EngineError } from './errors.js';
import { GROUP_SLOT_INPUT, ONE_SLOT_INPUT, ROW_GROUP_INPUT, ROW_MASK_INPUT, ROW_SLOT_INPUT, TOKEN_SLOT_INPUT } from './slot-linear.js';

/**
 * The stage the engine's programs are specialized at: what is known when `Engine.load` prepares
 * them (the base weights). Adapters arrive later, as slot-table data, and so does everything after.
 */
export const ENGINE_CUTOFF = 'base';

/** Inputs that say which slot (adapter) each row or routed token reads: known once the batch is routed. */
const ROUTING_INPUTS: ReadonlySet<string> = new Set([ROW_SLOT_INPUT, GROUP_SLOT_INPUT, ROW_GROUP_INPUT, ONE_SLOT_INPUT, ROW_MASK_INPUT, TOKEN_SLOT_INPUT]);

/**
 * The binding times of an engine program on the serving lattice
 * (`base < adapter < tenant < request < routing < token`): every parameter (a checkpoint weight)
 * `base`; the slot tables (`slots.*`, adapter factors written when an adapter is loaded)
 * `adapter`; the slot indices and row masks `routing`; token ids, positions, the KV cache and the
 * attention mask `token`.
 */
export function servingAnnotations(graph: Graph): AnnotationSpec {
  const inputs: Record<string, string> = {};
  for (const n of graphInputs(graph)) inputs[n.name] = n.name.startsWith('slots.') ? 'adapter' : ROUTING_INPUTS.has(n.name) ? 'routing' : 'token';
  return { inputs, defaultParam: 'base' };
}

/** Where an engine program came from: the staging pipeline's record for one prepared program. */
export interface ProgramReport {
  /** The program form (`gathered`, `grouped`, `single`, `base`, or `scoring`). */
  readonly form: string;
  /** The lattice, as text (`base < adapter < … < token`). */
  readonly lattice: string;
  /** The cutoff the program was specialized at (`ENGINE_CUTOFF`). */
  readonly cutoff: string;
  /** How many inputs and parameters of the annotated model graph are bound at each stage. */
  readonly stages: Readonly<Record<string, number>>;
  /** Rewrite rules applied before specialization, by name (only those that fired). */
  readonly rewrites: Readonly<Record<string, number>>;
  /** What `specialize` did (ops folded, residual ops, constants). */
  readonly specialize: Omit<SpecializeReport, 'flops'>;
  /** Ops of the residual (the prepared program), by op key. */
  readonly residualOps: Readonly<Record<string, number>>;
  /** Residual parameters that are checkpoint weights (fed per run or packed at preparation). */
  readonly weights: number;
  /** Residual parameters computed by partial evaluation (folded from constants and weights). */
  readonly folded: readonly string[];
}

/** An engine program as the staging pipeline leaves it, before its folded constants are computed. */
export interface StagedProgram {
  /** The residual graph: inputs are the slot tables, routing and token inputs; parameters the weights and folded constants. */
  readonly residual: Graph;
  /** The annotated model graph after rewriting (what was specialized). */
  readonly annotated: Graph;
  /** Its binding times. */
  readonly annotations: Annotations;
  /** Types of the residual parameters computed by partial evaluation, by name. */
  readonly foldedTypes: Readonly<Record<string, TensorType>>;
  /** Checkpoint weights the folded values are computed from (their host values are needed to fold). */
  readonly foldInputs: readonly string[];
  /** Provenance. */
  readonly report: ProgramReport;
}

function countBy(items: Iterable<string>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const k of items) out[k] = (out[k] ?? 0) + 1;
  return out;
}

/**
 * Runs the staging pipeline on one engine program graph: annotates it on the serving lattice
 * (`servingAnnotations`), rewrites it with the canonicalization rules, and specializes it at
 * `ENGINE_CUTOFF` from shapes alone (no weight is read or copied: the base weights stay residual
 * parameters, fed per run, possibly from the device). Values that depend only on the cutoff's
 * stage and are not weights themselves (rotary tables, Gemma's `1 + w` norm scales, literals the
 * dtype cast introduces) become parameters of the residual whose values `foldProgram` computes.
 */
export function stageProgram(graph: Graph, form: string): StagedProgram {
  const spec = servingAnnotations(graph);
  const pre = annotate(graph, SERVING_STAGES, spec);
  const rewritten = rewriteGreedy(graph, [canonicalRules], { context: { annotations: pre, cutoff: ENGINE_CUTOFF } });
  const annotated = rewritten.graph;
  const annotations = annotate(annotated, SERVING_STAGES, servingAnnotations(annotated));
  const s = specialize(annotated, { annotations, cutoff: ENGINE_CUTOFF, shapesOnly: true });
  const weights = new Set(graphParams(annotated).map((p) => p.name));
  const foldedTypes: Record<string, TensorType> = {};
  const sourceOf: Record<string, string> = {};
  for (const [name, type] of Object.entries(s.constantTypes)) {
    if (weights.has(name)) continue;
    foldedTypes[FOLDED_PREFIX + name] = type;
    sourceOf[FOLDED_PREFIX + name] = name;
  }
  const foldInputs = ancestorParams(annotated, Object.values(sourceOf));
  // NOTE: folded parameters get a prefix of their own: specialize names them after the value they
  // replace (`add`), a name an executor's decomposition of a composite op may mint again.
  const residual = renameParams(s.residual, sourceOf);
  // NOTE: fields picked one by one: the report's `flops` is a getter that costs both graphs.
  const r = s.report;
  const spec2: Omit<SpecializeReport, 'flops'> = { cutoff: r.cutoff, lattice: r.lattice, originalOps: r.originalOps, foldedOps: r.foldedOps, skippedStaticOps: r.skippedStaticOps, residualOps: r.residualOps, deadOps: r.deadOps, constants: r.constants, constantBytes: r.constantBytes, residualInputs: r.residualInputs };
  const stageCounts = countBy([...annotations.stages.values()].map((i) => annotations.lattice.name(i)));
  const report: ProgramReport = {
    form,
    lattice: annotations.lattice.toString(),
    cutoff: ENGINE_CUTOFF,
    stages: stageCounts,
    rewrites: Object.fromEntries(Object.entries(rewritten.applied).filter(([, k]) => k > 0)),
    specialize: spec2,
    residualOps: countBy(residual.nodes.flatMap((n) => (n.kind === 'op' ? [n.op] : []))),
    weights: graphParams(residual).filter((p) => weights.has(p.name)).length,
    folded: Object.keys(foldedTypes),
  };
  return { residual, annotated, annotations, foldedTypes, foldInputs, report };
}

/** Prefix of the residual parameters partial evaluation computed (`folded.<value>`). */
export const FOLDED_PREFIX = 'folded.';

/** `g` with the parameters named in `sourceOf`'s values renamed to its keys. */
function renameParams(g: Graph, sourceOf: Readonly<Record<string, string>>): Graph {
  const to = new Map(Object.entries(sourceOf).map(([k, v]) => [v, k]));
  if (to.size === 0) return g;
  return {
    ...g,
    nodes: g.nodes.map((n) => (n.kind === 'param' && to.has(n.name) ? { ...n, name: to.get(n.name)! } : n)),
    values: g.values.map((v) => (to.has(v.name) ? { ...v, name: to.get(v.name)! } : v)),
  };
}

/** Names of the parameters that the values named `names` are computed from. */
function ancestorParams(g: Graph, names: readonly string[]): string[] {
  if (names.length === 0) return [];
  const want = new Uint8Array(g.values.length);
  const byName = new Map(g.values.map((v, i) => [v.name, i]));
  for (const n of names) want[byName.get(n)!] = 1;
  const out: string[] = [];
  for (let i = g.nodes.length - 1; i >= 0; i--) {
    const n = g.nodes[i]!;
    if (!n.results.some((r) => want[r] === 1)) continue;
    if (n.kind === 'param') out.push(n.name);
    for (const v of n.operands) want[v] = 1;
  }
  return out;
}

/**
 * The values of a staged program's folded parameters: `specialize` at the cutoff again, with the
 * folded values as the outputs and `values` supplying the weights they read (`foldInputs`), so
 * only those weights are read and nothing else is evaluated. A weight `values` lacks is the
 * runtime's `RT_MISSING_VALUE` naming it; a failing evaluation `RT_EVAL_FAILED` naming the node.
 */
export function foldProgram(staged: StagedProgram, values: WeightStore): Record<string, HostTensor> {
  const names = Object.keys(staged.foldedTypes);
  if (names.length === 0) return {};
  const g = staged.annotated;
  const byName = new Map(g.values.map((v, i) => [v.name, i]));
  const outputs = names.map((name) => ({ name, value: byName.get(name.slice(FOLDED_PREFIX.length))! }));
  const s = specialize({ ...g, outputs }, { annotations: staged.annotations, cutoff: ENGINE_CUTOFF, values });
  const out: Record<string, HostTensor> = {};
  for (const name of names) {
    const t = s.constants[name.slice(FOLDED_PREFIX.length)];
    if (t === undefined) throw new EngineError(EngineCode.RUN_FAILED, `staging the '${staged.report.form}' program: the folded value '${name}' was not computed`);
    out[name] = t;
  }
  return out;
}

/** Whether a residual parameter is a checkpoint weight (not a value partial evaluation computed). */
export function isWeightParam(staged: StagedProgram, name: string): boolean {
  return !(name in staged.foldedTypes);
}

/** The engine's programs out of the staging pipeline, with what preparing and feeding them needs. */
export interface StagedPrograms {
  /** Per program, in the order given. */
  readonly staged: readonly StagedProgram[];
  /** Per program, the values of its folded parameters. */
  readonly folded: readonly Readonly<Record<string, HostTensor>>[];
  /** Host values of the weights folding read (to stage a program later, e.g. the scoring one). */
  readonly foldSources: ReadonlyMap<string, HostTensor>;
  /** Checkpoint weights some residual reads (the rest were used only by folded values). */
  readonly weightNames: ReadonlySet<string>;
}

/**
 * Stages every engine program (`stageProgram`) and computes their folded parameters; `hostValue`
 * gives the host value of a weight folding reads (the engine's copy, or one read from the
 * checkpoint when the weights live on the device).
 */
export async function stageEnginePrograms(graphs: readonly Graph[], forms: readonly string[], hostValue: (name: string) => HostTensor | Promise<HostTensor>): Promise<StagedPrograms> {
  const staged = graphs.map((g, i) => stageProgram(g, forms[i]!));
  const foldSources = new Map<string, HostTensor>();
  for (const s of staged) for (const n of s.foldInputs) if (!foldSources.has(n)) foldSources.set(n, await hostValue(n));
  const folded = staged.map((s) => foldProgram(s, { get: (n) => foldSources.get(n) }));
  const weightNames = new Set(staged.flatMap((s) => graphParams(s.residual).filter((p) => isWeightParam(s, p.name)).map((p) => p.name)));
  return { staged, folded, foldSources, weightNames };
}
