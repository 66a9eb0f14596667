import { type AttrValue, type OpKey, type TensorType, isOpKey, opDef, operandArity } from '@stageml/ir';
import { RewriteError, RwCode } from './errors.js';

/**
 * Type-level record of the capture names a pattern binds: `req` always, `opt` only on some
 * alternatives of an `m.oneOf`. Never present at run time.
 */
export interface CaptureNames<Req extends string, Opt extends string> {
  /** Names bound by every match. */
  readonly req: Req;
  /** Names bound by some matches only. */
  readonly opt: Opt;
}

/** Binding time a capture must have at the context's cutoff. */
export type StageRequirement = 'static' | 'dynamic';

/** Matches any value and binds it to `name`; a name used twice must bind the same value. */
export interface CapturePattern {
  readonly kind: 'capture';
  /** Capture name. */
  readonly name: string;
  /** Required binding time at the cutoff. */
  readonly stage?: StageRequirement;
  /** Required type (a pure predicate). */
  readonly type?: (t: TensorType) => boolean;
}

/** Matches an application of one op with exactly these operand patterns. */
export interface OpPattern {
  readonly kind: 'op';
  /** Registry key of the op. */
  readonly op: OpKey;
  /** Operand patterns, in operand order. */
  readonly operands: readonly Pattern[];
  /** Attribute values the node must have (compared structurally); others are free. */
  readonly attrs: Readonly<Record<string, AttrValue>> | undefined;
  /** Capture name bound to the op's result. */
  readonly as: string | undefined;
  /** Whether a non-root match may have other users (default false: interior nodes must be single-use). */
  readonly shared: boolean;
  /** Whether the two operands may match in either order (the op must have the `commutative` trait). */
  readonly commutative: boolean;
}

/** Matches any value. */
export interface AnyPattern {
  readonly kind: 'any';
  /** Capture name bound to the value. */
  readonly as: string | undefined;
}

/** Matches a `constant` node whose elements all equal one value (optionally a given one). */
export interface ScalarPattern {
  readonly kind: 'scalar';
  /** Required value (±0 match each other). */
  readonly value: number | undefined;
  /** Capture name bound to the constant. */
  readonly as: string | undefined;
}

/** Matches when any alternative matches; alternatives are tried in order (with backtracking). */
export interface OneOfPattern {
  readonly kind: 'oneOf';
  /** Alternatives, tried first to last. */
  readonly alternatives: readonly Pattern[];
}

/** One node of a pattern tree. */
export type PatternNode = CapturePattern | OpPattern | AnyPattern | ScalarPattern | OneOfPattern;

/**
 * A pattern: plain immutable data describing a subgraph rooted at one value. The type parameters
 * record the capture names it binds, so a rule's `when` and `build` receive typed captures.
 */
export type Pattern<Req extends string = string, Opt extends string = string> = Branded<PatternNode, Req, Opt>;

/** A pattern node of a known kind carrying its capture names at the type level. */
export type Branded<N extends PatternNode, Req extends string, Opt extends string> = N & {
  /** Phantom: capture names (type level only). */
  readonly __captures?: CaptureNames<Req, Opt>;
};

/** Options of `m.op` (passed as the last argument). */
export interface OpPatternOptions<N extends string = string> {
  /** Attribute values the node must have. */
  readonly attrs?: Readonly<Record<string, AttrValue>>;
  /** Capture the op's result under this name. */
  readonly as?: N;
  /** Allow a non-root match with other users (the rule then must not duplicate its work). */
  readonly shared?: boolean;
}

/** Options of `m.capture`. */
export interface CaptureOptions {
  /** Required binding time at the cutoff. */
  readonly stage?: StageRequirement;
  /** Required type. */
  readonly type?: (t: TensorType) => boolean;
}

type AnyPatternT = Pattern;
/** Names a pattern (or argument list element) binds on every match. */
export type ReqOf<P> = P extends { readonly kind: string; readonly __captures?: CaptureNames<infer R, string> } ? R : never;
/** Names a pattern binds on some matches. */
export type OptOf<P> = P extends { readonly kind: string; readonly __captures?: CaptureNames<string, infer O> } ? O : never;
/** Names every alternative of a tuple binds (required by an `m.oneOf` of them). */
export type ReqOfAll<Ps extends readonly unknown[]> = Ps extends readonly [infer H, ...infer T] ? (T extends readonly [] ? ReqOf<H> : ReqOf<H> & ReqOfAll<T>) : never;
type AsOf<P> = P extends { readonly kind: string } ? never : P extends { readonly as: infer N extends string } ? N : never;

/** Typed captures of a pattern: values for required names, possibly absent ones for optional names. */
export type Captures<P, V> = Readonly<Record<ReqOf<P>, V>> & Partial<Readonly<Record<Exclude<OptOf<P>, ReqOf<P>>, V>>>;

function bad(msg: string): never {
  throw new RewriteError(RwCode.BAD_PATTERN, msg);
}

function isPattern(x: unknown): x is AnyPatternT {
  return typeof x === 'object' && x !== null && 'kind' in x;
}

function makeOp(key: string, args: readonly unknown[], commutative: boolean): OpPattern {
  if (!isOpKey(key)) bad(`unknown op '${key}'`);
  const def = opDef(key);
  const last = args[args.length - 1];
  const opts = last !== undefined && !isPattern(last) ? (last as OpPatternOptions) : undefined;
  const operands = (opts === undefined ? args : args.slice(0, -1)) as AnyPatternT[];
  for (const p of operands) if (!isPattern(p)) bad(`${def.name}: operand patterns must be patterns; options go last`);
  const arity = operandArity(def.operands);
  if (operands.length < arity.min || operands.length > arity.max) {
    bad(`${def.name} takes ${def.operands.join(', ') || 'no operands'}, the pattern gives ${String(operands.length)}`);
  }
  if (commutative && (!def.traits.includes('commutative') || operands.length !== 2)) {
    bad(`${def.name} is not a commutative binary op (its traits: ${def.traits.join(', ') || 'none'})`);
  }
  for (const k of Object.keys(opts?.attrs ?? {})) {
    if (!Object.hasOwn(def.attrs, k)) bad(`${def.name} has no attribute '${k}'`);
  }
  return Object.freeze({
    kind: 'op',
    op: key,
    operands: Object.freeze([...operands]),
    attrs: opts?.attrs,
    as: opts?.as,
    shared: opts?.shared ?? false,
    commutative,
  });
}

type OpArg = AnyPatternT | OpPatternOptions;
type OpResult<Args extends readonly unknown[]> = Branded<OpPattern, ReqOf<Args[number]> | AsOf<Args[number]>, OptOf<Args[number]>>;

/**
 * The pattern language. Patterns are frozen plain data built from these constructors:
 *
 * - `m.op(key, ...operands, { attrs?, as?, shared? })`: an application of op `key`;
 * - `m.commutative(key, a, b, opts?)`: the same, matching either operand order (the op's registry
 *   traits must include `commutative`);
 * - `m.capture(name, { stage?, type? })`: any value, bound to `name`;
 * - `m.any()`: any value, unbound; `m.scalar(value?)`: a splat `constant`;
 * - `m.oneOf(...alternatives)`: the first alternative that matches.
 *
 * Soundness default: a non-root op pattern matches only a value with exactly one use, so a rule
 * never leaves a matched intermediate alive beside its replacement (duplicating its work); a rule
 * that is safe anyway says `shared: true`.
 */
export const m: {
  /** An application of op `key` with exactly these operand patterns. */
  op<const Args extends readonly OpArg[]>(key: OpKey, ...args: Args): OpResult<Args>;
  /** A commutative binary op matching either operand order. */
  commutative<const A extends AnyPatternT, const B extends AnyPatternT, const N extends string = never>(
    key: OpKey,
    a: A,
    b: B,
    opts?: OpPatternOptions<N>,
  ): Branded<OpPattern, ReqOf<A> | ReqOf<B> | N, OptOf<A> | OptOf<B>>;
  /** Any value, bound to `name`, optionally with a binding-time or type requirement. */
  capture<const N extends string>(name: N, opts?: CaptureOptions): Branded<CapturePattern, N, never>;
  /** Any value. */
  any<const N extends string = never>(opts?: { readonly as?: N }): Branded<AnyPattern, N, never>;
  /** A `constant` whose elements all equal one value (`value` when given). */
  scalar<const N extends string = never>(value?: number, opts?: { readonly as?: N }): Branded<ScalarPattern, N, never>;
  /** The first of `alternatives` that matches; names not bound by every alternative are optional in the rule. */
  oneOf<const Ps extends readonly AnyPatternT[]>(...alternatives: Ps): Branded<OneOfPattern, ReqOfAll<Ps>, ReqOf<Ps[number]> | OptOf<Ps[number]>>;
} = {
  op: (key, ...args) => makeOp(key, args, false),
  commutative: (key, a, b, opts) => makeOp(key, opts === undefined ? [a, b] : [a, b, opts], true),
  capture: (name, opts = {}) => {
    if (name.length === 0) bad('a capture needs a name');
    return Object.freeze({ kind: 'capture', name, ...(opts.stage === undefined ? {} : { stage: opts.stage }), ...(opts.type === undefined ? {} : { type: opts.type }) });
  },
  any: (opts) => Object.freeze({ kind: 'any', as: opts?.as }),
  scalar: (value, opts) => Object.freeze({ kind: 'scalar', value, as: opts?.as }),
  oneOf: (...alternatives) => {
    if (alternatives.length === 0) bad('m.oneOf needs at least one alternative');
    return Object.freeze({ kind: 'oneOf', alternatives: Object.freeze([...alternatives]) });
  },
};

/**
 * Ops a pattern's root can match, for indexing rules by anchor: a set of keys, or `undefined`
 * when the root can be any value (`m.any`, `m.capture`).
 */
export function patternAnchors(p: Pattern): ReadonlySet<OpKey> | undefined {
  switch (p.kind) {
    case 'op':
      return new Set([p.op]);
    case 'scalar':
      return new Set<OpKey>(['constant']);
    case 'capture':
    case 'any':
      return undefined;
    case 'oneOf': {
      const out = new Set<OpKey>();
      for (const alt of p.alternatives) {
        const a = patternAnchors(alt);
        if (a === undefined) return undefined;
        for (const k of a) out.add(k);
      }
      return out;
    }
  }
}
