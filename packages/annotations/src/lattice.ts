import { BtaCode, BtaError } from './errors.js';

/** Index of a stage in its lattice: 0 is the earliest (bottom), `size − 1` the latest (top). */
export type StageIndex = number;

/**
 * A binding-time lattice: a totally ordered chain of named stages, earliest first. A value known at
 * stage `s` is known at every later stage; `join` is the later of two stages.
 */
export class StageLattice {
  /** Stage names, earliest first. */
  readonly names: readonly string[];
  readonly #index: ReadonlyMap<string, StageIndex>;

  /** A chain of `names`, earliest first; names must be unique identifiers. */
  constructor(names: readonly string[]) {
    if (names.length === 0) throw new BtaError(BtaCode.BAD_LATTICE, 'a lattice needs at least one stage');
    const index = new Map<string, StageIndex>();
    names.forEach((n, i) => {
      if (!/^[A-Za-z_][A-Za-z0-9_-]*$/.test(n)) throw new BtaError(BtaCode.BAD_LATTICE, `stage name '${n}' is not an identifier`);
      if (index.has(n)) throw new BtaError(BtaCode.BAD_LATTICE, `stage '${n}' appears twice`);
      index.set(n, i);
    });
    this.names = Object.freeze([...names]);
    this.#index = index;
  }

  /** Number of stages. */
  get size(): number {
    return this.names.length;
  }
  /** The earliest stage (always 0). */
  readonly bottom: StageIndex = 0;
  /** The latest stage. */
  get top(): StageIndex {
    return this.names.length - 1;
  }

  /** Index of stage `name`; unknown names are `BTA_UNKNOWN_STAGE` (never silently static). */
  index(name: string): StageIndex {
    const i = this.#index.get(name);
    if (i === undefined) {
      throw new BtaError(BtaCode.UNKNOWN_STAGE, `unknown stage '${name}' (this lattice has ${this.names.join(' < ')})`);
    }
    return i;
  }

  /** Whether `name` is a stage of this lattice. */
  has(name: string): boolean {
    return this.#index.has(name);
  }

  /** Name of stage `i`. */
  name(i: StageIndex): string {
    const n = this.names[i];
    if (n === undefined) throw new BtaError(BtaCode.UNKNOWN_STAGE, `stage index ${String(i)} is outside 0..${String(this.top)}`);
    return n;
  }

  /** The later of two stages (least upper bound). */
  join(a: StageIndex, b: StageIndex): StageIndex {
    return a > b ? a : b;
  }

  /** Whether stage `a` is at or before stage `b`. */
  leq(a: StageIndex, b: StageIndex): boolean {
    return a <= b;
  }

  /** `static < dynamic` style text: `base < adapter < …`. */
  toString(): string {
    return this.names.join(' < ');
  }
}

/** Defines a user lattice from stage names, earliest first. */
export function defineLattice(names: readonly string[]): StageLattice {
  return new StageLattice(names);
}

/** The classic two-stage lattice `static < dynamic`. */
export const TWO_STAGE: StageLattice = new StageLattice(['static', 'dynamic']);

/** The serving chain `base < adapter < tenant < request < routing < token`. */
export const SERVING_STAGES: StageLattice = new StageLattice(['base', 'adapter', 'tenant', 'request', 'routing', 'token']);

/** Built-in lattices by name (`two-stage`, `serving`), for CLIs and manifests. */
export const BUILTIN_LATTICES: Readonly<Record<string, StageLattice>> = { 'two-stage': TWO_STAGE, serving: SERVING_STAGES };
