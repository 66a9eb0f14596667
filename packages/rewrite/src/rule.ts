import type { StageIndex, StageLattice } from '@stageml/annotations';
import type { AttrValue, AttrsOf, Dim, DimBindings, GraphBuilder, HostTensor, OpKey, Value } from '@stageml/ir';
import type { CostModel } from './cost.js';
import { RewriteError, RwCode } from './errors.js';
import { type Captures, type Pattern, patternAnchors } from './pattern.js';

/**
 * How the driver checks a rule's effect on the residual before committing it:
 *
 * - `none`: the rule never makes the residual slower or its constants larger, by construction;
 * - `no-worse`: fires only if per-request time and constant bytes both do not grow (canonical
 *   forms that are free but may duplicate a shared static weight);
 * - `improving`: trades memory for time; fires only if per-request time goes down (or stays equal
 *   while constant bytes go down) and the constant table stays within the memory budget.
 */
export type CostGuard = 'none' | 'no-worse' | 'improving';

/** The op application defining a value, as rules see it. */
export interface ValueDef {
  /** Registry key. */
  readonly op: OpKey;
  /** Operand values. */
  readonly operands: readonly Value[];
  /** Normalized attributes. */
  readonly attrs: Readonly<Record<string, AttrValue>>;
}

/**
 * What a rule's guard and builder may ask besides their captures (tinygrad's `ctx`): binding
 * times at the cutoff, graph facts about captured values, sizes, the cost model and the budget.
 * Queries take values of the graph being rewritten (captures, or operands from `def`).
 */
export interface RuleContext {
  /** Stage lattice. */
  readonly lattice: StageLattice;
  /** Cutoff stage: values at or before it are static (folded ahead of time). */
  readonly cutoff: StageIndex;
  /** Per-request sizes of symbolic dims. */
  readonly sizes: DimBindings;
  /** Cost model. */
  readonly costModel: CostModel;
  /** Constant-table budget in bytes. */
  readonly memoryBudget: number;
  /** Bytes of the residual's constant table so far. */
  readonly constantBytes: number;
  /** Fold size limit in elements. */
  readonly maxFoldElements: number;
  /** Binding time of `v`. */
  stageOf(v: Value): StageIndex;
  /** Whether `v` is known at or before the cutoff. */
  isStatic(v: Value): boolean;
  /** Whether `v` is known only after the cutoff. */
  isDynamic(v: Value): boolean;
  /** Uses of `v` (operand slots plus graph outputs). */
  uses(v: Value): number;
  /** The op defining `v`, or undefined for inputs and parameters. */
  def(v: Value): ValueDef | undefined;
  /** Just the key of the op defining `v` (no allocation), or undefined for inputs and parameters. */
  opOf(v: Value): OpKey | undefined;
  /** Attributes of `v`'s defining op, which must be `op` (else `RW_BAD_RULE`). */
  attrs<K extends OpKey>(v: Value, op: K): AttrsOf<K>;
  /** The one value every element of a `constant` has, or undefined. */
  splat(v: Value): number | undefined;
  /** The data of a `constant`, or undefined. */
  literal(v: Value): HostTensor | undefined;
  /** Inside `build`: the builder handle of a graph value reached through `def`. */
  handle(v: Value): Value;
  /** A dim evaluated at the context's sizes (unsized symbols count as 1). */
  size(d: Dim): number;
}

/** What `rule` takes: a name, the identity in math, the pattern, a guard and a builder. */
export interface RuleSpec<P extends Pattern> {
  /** `<anchor-op>.<verb-phrase>`: unique and stable (counts, logs and tests refer to it). */
  readonly name: string;
  /** The identity the rule applies, in math notation (one line). */
  readonly identity: string;
  /** Side conditions, in words. */
  readonly conditions?: string;
  /** Pattern matched at the root value. */
  readonly match: P;
  /** Pure guard over the captures; false rejects this match (the matcher backtracks). */
  readonly when?: (captures: Captures<P, Value>, ctx: RuleContext) => boolean;
  /**
   * Builds the replacement through `b` (an IR `GraphBuilder`; captures are its values) and
   * returns it, or undefined to decline. Must not declare inputs or parameters.
   */
  readonly build: (captures: Captures<P, Value>, b: GraphBuilder, ctx: RuleContext) => Value | undefined;
  /** Cost check of the driver (default `none`). */
  readonly costGuard?: CostGuard;
}

/** A rule with its types erased, as drivers hold it. */
export interface Rule {
  /** Unique rule name. */
  readonly name: string;
  /** The identity in math notation. */
  readonly identity: string;
  /** Side conditions, in words. */
  readonly conditions: string;
  /** The pattern. */
  readonly match: Pattern;
  /** The guard. */
  readonly when: ((captures: Readonly<Record<string, Value>>, ctx: RuleContext) => boolean) | undefined;
  /** The builder. */
  readonly build: (captures: Readonly<Record<string, Value>>, b: GraphBuilder, ctx: RuleContext) => Value | undefined;
  /** The driver's cost check. */
  readonly costGuard: CostGuard;
  /** Ops the root can be (undefined: any op). */
  readonly anchors: ReadonlySet<OpKey> | undefined;
}

/** A named group of rules (e.g. `canonicalize`, `lora`). */
export interface RuleSet {
  /** Name of the set. */
  readonly name: string;
  /** Its rules, in priority order. */
  readonly rules: readonly Rule[];
}

const RULE_NAME_RE = /^[a-z][A-Za-z0-9]*\.[a-z0-9]+(-[a-z0-9]+)*$/;

/** Declares a rewrite rule. Rules are values: pure data plus pure functions, reusable by any driver. */
export function rule<const P extends Pattern>(spec: RuleSpec<P>): Rule {
  if (!RULE_NAME_RE.test(spec.name)) {
    throw new RewriteError(RwCode.BAD_RULE, `rule name '${spec.name}' is not <anchor-op>.<verb-phrase> (e.g. matmul.absorb-transpose)`);
  }
  return Object.freeze({
    name: spec.name,
    identity: spec.identity,
    conditions: spec.conditions ?? '',
    match: spec.match,
    when: spec.when,
    build: spec.build,
    costGuard: spec.costGuard ?? 'none',
    anchors: patternAnchors(spec.match),
  });
}

/** Groups rules under a name. */
export function ruleSet(name: string, rules: readonly (Rule | RuleSet)[]): RuleSet {
  return Object.freeze({ name, rules: Object.freeze(flattenRules(rules)) });
}

/** Flattens rules and rule sets, rejecting duplicate names with `RW_DUPLICATE_RULE`. */
export function flattenRules(rules: readonly (Rule | RuleSet)[]): Rule[] {
  const out: Rule[] = [];
  const seen = new Set<string>();
  for (const r of rules) {
    for (const x of 'rules' in r ? r.rules : [r]) {
      if (seen.has(x.name)) throw new RewriteError(RwCode.DUPLICATE_RULE, `rule '${x.name}' is given twice`);
      seen.add(x.name);
      out.push(x);
    }
  }
  return out;
}
