import { type Graph, graphInputs, graphParams } from '@stageml/ir';
import { BtaCode, BtaError } from './errors.js';
import type { StageIndex, StageLattice } from './lattice.js';

/**
 * Which stage each graph input and parameter is bound at. Keys are exact names or glob patterns
 * (`*` matches any run of characters: `model.layers.*.lora_A.weight`); values are stage names.
 */
export interface AnnotationSpec {
  /** Stages of inputs (default: the latest stage). */
  readonly inputs?: Readonly<Record<string, string>>;
  /** Stages of parameters (default: the earliest stage). */
  readonly params?: Readonly<Record<string, string>>;
  /** Stage of every input not listed (default: the lattice's top). */
  readonly defaultInput?: string;
  /** Stage of every parameter not listed (default: the lattice's bottom). */
  readonly defaultParam?: string;
}

/** Resolved annotations of one graph: a stage for every input and parameter, by name. */
export interface Annotations {
  /** The lattice the stages belong to. */
  readonly lattice: StageLattice;
  /** Stage of each input and parameter, by name. */
  readonly stages: ReadonlyMap<string, StageIndex>;
}

function globToRegExp(glob: string): RegExp {
  const escaped = glob.replace(/[.+?^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '.*');
  return new RegExp(`^${escaped}$`);
}

function resolve(
  kind: 'input' | 'param',
  names: readonly string[],
  spec: Readonly<Record<string, string>> | undefined,
  fallback: StageIndex,
  lattice: StageLattice,
  out: Map<string, StageIndex>,
): void {
  const assigned = new Map<string, { stage: StageIndex; key: string }>();
  for (const [key, stageName] of Object.entries(spec ?? {})) {
    const stage = lattice.index(stageName);
    const isPattern = key.includes('*');
    const re = isPattern ? globToRegExp(key) : undefined;
    const matches = isPattern ? names.filter((n) => re!.test(n)) : names.filter((n) => n === key);
    if (matches.length === 0) {
      const near = names.filter((n) => n.toLowerCase().includes(key.toLowerCase().replace(/\*/g, ''))).slice(0, 3);
      throw new BtaError(BtaCode.UNKNOWN_NAME, `no ${kind} ${isPattern ? 'matches' : 'is named'} '${key}'`, {
        hint: near.length > 0 ? `did you mean ${near.map((n) => `'${n}'`).join(', ')}?` : `the graph's ${kind}s: ${names.slice(0, 8).join(', ')}${names.length > 8 ? ', …' : ''}`,
      });
    }
    for (const m of matches) {
      const prev = assigned.get(m);
      // An exact name beats a pattern; two patterns (or two exact keys) must agree.
      if (prev !== undefined && prev.stage !== stage && prev.key.includes('*') === isPattern) {
        throw new BtaError(BtaCode.CONFLICT, `${kind} '${m}' is annotated '${lattice.name(prev.stage)}' by '${prev.key}' and '${stageName}' by '${key}'`);
      }
      if (prev === undefined || (prev.key.includes('*') && !isPattern)) assigned.set(m, { stage, key });
    }
  }
  for (const n of names) out.set(n, assigned.get(n)?.stage ?? fallback);
}

/**
 * Resolves an annotation spec against a graph. Defaults: parameters at the earliest stage, inputs
 * at the latest; both overridable (a KV cache can be late, a hot-swapped adapter weight `adapter`).
 * Unknown stage names are `BTA_UNKNOWN_STAGE`; names (or patterns) matching no input or parameter
 * are `BTA_UNKNOWN_NAME`.
 */
export function annotate(graph: Graph, lattice: StageLattice, spec: AnnotationSpec = {}): Annotations {
  const stages = new Map<string, StageIndex>();
  const inputDefault = spec.defaultInput === undefined ? lattice.top : lattice.index(spec.defaultInput);
  const paramDefault = spec.defaultParam === undefined ? lattice.bottom : lattice.index(spec.defaultParam);
  resolve('input', graphInputs(graph).map((n) => n.name), spec.inputs, inputDefault, lattice, stages);
  resolve('param', graphParams(graph).map((n) => n.name), spec.params, paramDefault, lattice, stages);
  return { lattice, stages };
}

/** The spec that reproduces `ann` exactly on a graph with these names (used to carry stages forward). */
export function annotationsToSpec(ann: Annotations, graph: Graph): AnnotationSpec {
  const inputs: Record<string, string> = {};
  const params: Record<string, string> = {};
  for (const n of graphInputs(graph)) {
    const s = ann.stages.get(n.name);
    if (s !== undefined) inputs[n.name] = ann.lattice.name(s);
  }
  for (const n of graphParams(graph)) {
    const s = ann.stages.get(n.name);
    if (s !== undefined) params[n.name] = ann.lattice.name(s);
  }
  return { inputs, params };
}
