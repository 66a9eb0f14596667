import { type AnnotationSpec, type Annotations, BUILTIN_LATTICES, type StageIndex, type StageLattice, TWO_STAGE, annotate } from '@stageml/annotations';
import { type DimBindings, type Graph, graphInputs, graphParams } from '@stageml/ir';
import { type CostModel, analyticCostModel } from './cost.js';
import { RewriteError, RwCode } from './errors.js';

/**
 * Everything rules may depend on besides the graph, passed explicitly (never read from globals):
 * which values are static at which cutoff, the request's sizes, the cost model and the memory
 * budget. Every field has a default.
 */
export interface RewriteContextOptions {
  /** Stage lattice, or a built-in name (`two-stage`, `serving`); default `two-stage`. Ignored when `annotations` is resolved. */
  readonly lattice?: StageLattice | string;
  /** Stages of inputs and parameters (spec or resolved); default: parameters earliest, inputs latest. */
  readonly annotations?: AnnotationSpec | Annotations;
  /** The last stage computed ahead of time (default: the lattice's earliest stage). */
  readonly cutoff?: string;
  /** Sizes of symbolic dims per request, e.g. `{ batch: 1, seq: 4096 }` (unsized symbols count as 1). */
  readonly sizes?: DimBindings;
  /** Cost model (default `analyticCostModel()`). */
  readonly costModel?: CostModel;
  /**
   * The most bytes the residual's constant table (the static values it reads) may hold. A rule
   * that grows the table fires only if the table stays within it (default: unlimited).
   */
  readonly memoryBudget?: number;
  /** Largest literal `pure.fold-constants` creates beyond its operands' size, in elements (default 16). */
  readonly maxFoldElements?: number;
  /** Constant-like values up to this many elements are re-emitted inline, not stored (default 16, as `specialize`). */
  readonly inlineElements?: number;
}

/** A context with every default filled in and the annotations resolved against a graph. */
export interface ResolvedContext {
  /** Stage lattice. */
  readonly lattice: StageLattice;
  /** Resolved annotations. */
  readonly annotations: Annotations;
  /** Cutoff stage index; values at or before it are static. */
  readonly cutoff: StageIndex;
  /** Per-request sizes of symbolic dims. */
  readonly sizes: DimBindings;
  /** Cost model. */
  readonly costModel: CostModel;
  /** Constant-table budget in bytes. */
  readonly memoryBudget: number;
  /** Fold size limit in elements. */
  readonly maxFoldElements: number;
  /** Inline-constant limit in elements. */
  readonly inlineElements: number;
}

function badOption(msg: string): never {
  throw new RewriteError(RwCode.BAD_OPTION, msg);
}

function nonNegativeInt(name: string, v: number): number {
  if (!Number.isSafeInteger(v) || v < 0) badOption(`${name} must be a non-negative integer, got ${String(v)}`);
  return v;
}

function isResolved(a: AnnotationSpec | Annotations | undefined): a is Annotations {
  return a !== undefined && 'stages' in a && 'lattice' in a;
}

/**
 * Fills defaults and resolves annotations against `graph`. Unknown stage or parameter names are
 * `BTA_*` errors from `@stageml/annotations`; bad sizes or budgets are `RW_BAD_OPTION`.
 */
export function resolveContext(graph: Graph, opts: RewriteContextOptions = {}): ResolvedContext {
  let annotations: Annotations;
  if (isResolved(opts.annotations)) annotations = opts.annotations;
  else {
    const l = opts.lattice;
    let lattice: StageLattice;
    if (l === undefined) lattice = TWO_STAGE;
    else if (typeof l === 'string') {
      const found = BUILTIN_LATTICES[l];
      if (found === undefined) badOption(`unknown lattice '${l}' (built-in: ${Object.keys(BUILTIN_LATTICES).join(', ')})`);
      lattice = found;
    } else lattice = l;
    annotations = annotate(graph, lattice, opts.annotations);
  }
  const { lattice } = annotations;
  const cutoff = opts.cutoff === undefined ? lattice.bottom : lattice.index(opts.cutoff);
  const sizes: Record<string, number> = {};
  for (const [k, v] of Object.entries(opts.sizes ?? {})) sizes[k] = nonNegativeInt(`size of '${k}'`, v);
  const memoryBudget = opts.memoryBudget ?? Number.POSITIVE_INFINITY;
  if (!(memoryBudget >= 0)) badOption(`memoryBudget must be ≥ 0 bytes, got ${String(memoryBudget)}`);
  return {
    lattice,
    annotations,
    cutoff,
    sizes,
    costModel: opts.costModel ?? analyticCostModel(),
    memoryBudget,
    maxFoldElements: nonNegativeInt('maxFoldElements', opts.maxFoldElements ?? 16),
    inlineElements: nonNegativeInt('inlineElements', opts.inlineElements ?? 16),
  };
}

/**
 * Annotations for serving a LoRA-adapted model on the `serving` lattice: parameters whose name
 * mentions `lora` at `adapter`, every other parameter at `base`, inputs at `token`. Listing exact
 * names (no globs) makes it valid for any graph.
 */
export function loraServingSpec(graph: Graph): AnnotationSpec {
  const params: Record<string, string> = {};
  for (const p of graphParams(graph)) params[p.name] = /lora/i.test(p.name) ? 'adapter' : 'base';
  const inputs: Record<string, string> = {};
  for (const i of graphInputs(graph)) inputs[i.name] = 'token';
  return { inputs, params };
}
