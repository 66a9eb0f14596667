/**
 * Deterministic decisions drawn from a list of fast-check naturals. Generators that build
 * structures step by step (graphs) read their choices from one; fast-check then shrinks the list
 * toward zeros, i.e. toward every first option, which keeps counterexamples small and readable.
 */
export class Chooser {
  readonly #xs: readonly number[];
  #i = 0;

  /** Decisions come from `xs` in order, then from a fixed hash sequence once `xs` runs out. */
  constructor(xs: readonly number[]) {
    this.#xs = xs;
  }

  /** A number in [0, n) (0 when n ≤ 1). */
  int(n: number): number {
    const x = this.#xs[this.#i] ?? Math.imul(this.#i + 1, 0x9e3779b1) >>> 8;
    this.#i++;
    return n <= 1 ? 0 : x % n;
  }

  /** An integer in [lo, hi]. */
  range(lo: number, hi: number): number {
    return lo + this.int(hi - lo + 1);
  }

  /** A coin flip; false first. */
  bool(): boolean {
    return this.int(2) === 1;
  }

  /** One element of a non-empty list; the first when shrunk. */
  pick<T>(xs: readonly T[]): T {
    return xs[this.int(xs.length)]!;
  }

  /** A random subset of `xs` keeping their order. */
  subset<T>(xs: readonly T[]): T[] {
    return xs.filter(() => this.bool());
  }

  /** A random permutation of `xs`; the identity when shrunk. */
  shuffle<T>(xs: readonly T[]): T[] {
    const out = [...xs];
    for (let i = out.length - 1; i > 0; i--) {
      const j = i - this.int(i + 1);
      [out[i], out[j]] = [out[j]!, out[i]!];
    }
    return out;
  }
}
