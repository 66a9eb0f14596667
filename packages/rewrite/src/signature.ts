import { type ValueId, typeToString } from '@stageml/ir';
import type { WorkGraph } from './work-graph.js';

/**
 * Structural signatures of matches whose rewrite made requests slower. A signature names the
 * rule and the op, attributes, type, stage and use count of every matched node and capture. For a
 * rule that looks only at its captures, two matches with one signature cost the same to rewrite
 * (the 224 LoRA layers of a 7B model have 7 signatures), so such a match is not built again.
 * Remembering only slower-per-request rejections keeps this independent of the memory budget.
 */
export class MatchSignatures {
  readonly #wg: WorkGraph;
  readonly #slower = new Set<string>();
  readonly #rules = new Set<string>();
  readonly #typeKeys: (string | undefined)[] = [];

  constructor(wg: WorkGraph) {
    this.#wg = wg;
  }

  #typeKey(v: ValueId): string {
    let k = this.#typeKeys[v];
    if (k === undefined) {
      k = typeToString(this.#wg.types[v]!);
      this.#typeKeys[v] = k;
    }
    return k;
  }

  /** The signature of a match of `rule`. */
  of(rule: string, captures: ReadonlyMap<string, ValueId>, matched: readonly number[]): string {
    const wg = this.#wg;
    const parts = [rule];
    for (const n of matched) {
      const node = wg.nodes[n]!;
      const r = node.results[0]!;
      parts.push(`${node.op}${node.attrKey}:${this.#typeKey(r)}@${String(wg.stages[r])}#${String(wg.useCount(r))}`);
    }
    for (const [name, v] of [...captures].sort((a, b) => (a[0] < b[0] ? -1 : 1))) {
      const p = wg.nodes[wg.nodeOf[v]!]!;
      parts.push(`${name}=${p.kind === 'op' ? p.op + p.attrKey : p.kind}:${this.#typeKey(v)}@${String(wg.stages[v])}#${String(wg.useCount(v))}`);
    }
    return parts.join('|');
  }

  /** Whether some match of `rule` was found slower (else no signature of it needs computing). */
  hasRule(rule: string): boolean {
    return this.#rules.has(rule);
  }

  /** Whether a match with this signature was found slower. */
  has(signature: string): boolean {
    return this.#slower.has(signature);
  }

  /** Records the signature of a match of `rule` found slower. */
  add(rule: string, signature: string): void {
    this.#rules.add(rule);
    this.#slower.add(signature);
  }
}
