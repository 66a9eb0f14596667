import type { AttrValue, OpKey, TensorType, ValueId } from '@stageml/ir';
import type { Pattern } from './pattern.js';

/** What the matcher needs to know about a graph (the driver's working graph implements it). */
export interface MatchView {
  /** The op node defining `v` (its key, current operands and attributes), or undefined for a leaf. */
  producer(v: ValueId): { readonly op: OpKey; readonly operands: readonly ValueId[]; readonly attrs: Readonly<Record<string, AttrValue>>; readonly node: number } | undefined;
  /** Uses of `v`: operand slots of live nodes plus graph outputs. */
  useCount(v: ValueId): number;
  /** Whether `v` is known at or before the cutoff. */
  isStatic(v: ValueId): boolean;
  /** Type of `v`. */
  type(v: ValueId): TensorType;
  /** The splat value of a `constant` node, or undefined when it has several distinct elements. */
  splat(v: ValueId): number | undefined;
}

/** A successful match: captures by name and the op nodes the pattern covered (root first). */
export interface MatchResult {
  /** Captured values by name. */
  readonly captures: ReadonlyMap<string, ValueId>;
  /** Node indices of the op patterns that matched. */
  readonly nodes: readonly number[];
}

/** Structural equality of attribute values (dims are canonical, so JSON text compares them). */
function attrEquals(a: AttrValue | undefined, b: AttrValue): boolean {
  if (typeof a === 'number' && typeof b === 'number') return Object.is(a, b) || a === b;
  return JSON.stringify(a) === JSON.stringify(b);
}

/**
 * What is left to do after the current pattern: match `p` at `v`, or (with `p` undefined) bind
 * `name` to `v`; then `next`. An explicit continuation list keeps backtracking allocation-light.
 */
interface Frame {
  readonly p: Pattern | undefined;
  readonly name: string | undefined;
  readonly v: ValueId;
  readonly next: Frame | undefined;
}

class Matcher {
  readonly captures = new Map<string, ValueId>();
  readonly nodes: number[] = [];
  readonly result: MatchResult = { captures: this.captures, nodes: this.nodes };

  constructor(
    readonly view: MatchView,
    readonly accept: (m: MatchResult) => boolean,
  ) {}

  cont(f: Frame | undefined): boolean {
    if (f === undefined) return this.accept(this.result);
    return f.p === undefined ? this.bind(f.name, f.v, f.next) : this.go(f.p, f.v, false, f.next);
  }

  bind(name: string | undefined, v: ValueId, next: Frame | undefined): boolean {
    if (name === undefined) return this.cont(next);
    const prev = this.captures.get(name);
    if (prev !== undefined) return prev === v && this.cont(next);
    this.captures.set(name, v);
    if (this.cont(next)) return true;
    this.captures.delete(name);
    return false;
  }

  operands(ps: readonly Pattern[], vs: readonly ValueId[], then: Frame | undefined): boolean {
    let f = then;
    for (let i = ps.length - 1; i >= 0; i--) f = { p: ps[i]!, name: undefined, v: vs[i]!, next: f };
    return this.cont(f);
  }

  go(p: Pattern, v: ValueId, isRoot: boolean, next: Frame | undefined): boolean {
    const view = this.view;
    switch (p.kind) {
      case 'any':
        return this.bind(p.as, v, next);
      case 'capture':
        if (p.stage !== undefined && view.isStatic(v) !== (p.stage === 'static')) return false;
        if (p.type !== undefined && !p.type(view.type(v))) return false;
        return this.bind(p.name, v, next);
      case 'scalar': {
        if (view.producer(v)?.op !== 'constant') return false;
        const s = view.splat(v);
        if (s === undefined || (p.value !== undefined && s !== p.value)) return false;
        return this.bind(p.as, v, next);
      }
      case 'oneOf':
        for (const alt of p.alternatives) if (this.go(alt, v, isRoot, next)) return true;
        return false;
      case 'op': {
        const def = view.producer(v);
        if (def?.op !== p.op || def.operands.length !== p.operands.length) return false;
        if (!isRoot && !p.shared && view.useCount(v) !== 1) return false;
        if (p.attrs !== undefined) {
          for (const [name, want] of Object.entries(p.attrs)) if (!attrEquals(def.attrs[name], want)) return false;
        }
        this.nodes.push(def.node);
        const then: Frame | undefined = p.as === undefined ? next : { p: undefined, name: p.as, v, next };
        const ops = def.operands;
        if (this.operands(p.operands, ops, then)) return true;
        if (p.commutative && ops[0] !== ops[1] && this.operands(p.operands, [ops[1]!, ops[0]!], then)) return true;
        this.nodes.pop();
        return false;
      }
    }
  }
}

/**
 * Matches `pattern` at value `root`. `accept` sees each complete candidate match (e.g. a rule's
 * guard); returning false backtracks into the next alternative (operand order of commutative ops,
 * `m.oneOf` branches). Returns the first accepted match, or undefined.
 */
export function matchPattern(view: MatchView, pattern: Pattern, root: ValueId, accept: (m: MatchResult) => boolean): MatchResult | undefined {
  const matcher = new Matcher(view, accept);
  return matcher.go(pattern, root, true, undefined) ? matcher.result : undefined;
}
