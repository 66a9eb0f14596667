import { Automaton } from './automaton.js';
import { StructuredCode, StructuredError } from './errors.js';
import type { Grammar } from './grammar.js';
import type { Vocabulary } from './vocab.js';

/** Most per-state masks one compiled grammar keeps (then the cache starts over). */
const MASK_CACHE_STATES = 4096;

/** A token bitmask: bit `id % 32` of word `id >> 5` is set when token `id` is allowed. */
export type TokenBitmask = Uint32Array;

/** Whether `id` is set in `mask`. */
export function maskHas(mask: TokenBitmask, id: number): boolean {
  return ((mask[id >>> 5]! >>> (id & 31)) & 1) === 1;
}

/**
 * Sets every logit of a token outside `mask` to -Infinity, in place (`logits` may be longer than
 * the mask's vocabulary: the extra ids are never allowed).
 */
export function applyMask(logits: { [i: number]: number; readonly length: number }, mask: TokenBitmask): void {
  for (let id = 0; id < logits.length; id++) if (!maskHas(mask, id)) logits[id] = -Infinity;
}

/**
 * A grammar compiled against one vocabulary: its automaton and, per matching state, the mask of
 * tokens whose bytes keep the text a prefix of the grammar's language (computed once per state
 * by one walk of the vocabulary trie, then cached). Shared by every request with the same spec.
 */
export class CompiledGrammar {
  readonly automaton: Automaton;
  readonly vocab: Vocabulary;
  readonly #masks = new Map<number, TokenBitmask>();

  /** Compiles `grammar` for `vocab`. */
  constructor(grammar: Grammar, vocab: Vocabulary) {
    this.automaton = new Automaton(grammar);
    this.vocab = vocab;
  }

  /** The tokens allowed in `state` (stop tokens not included), cached per state. */
  tokenMask(state: number): TokenBitmask {
    let m = this.#masks.get(state);
    if (m !== undefined) return m;
    const v = this.vocab;
    const a = this.automaton;
    m = new Uint32Array((v.size + 31) >>> 5);
    const nodes: number[] = [0];
    const states: number[] = [state];
    while (nodes.length > 0) {
      const n = nodes.pop()!;
      const s = states.pop()!;
      const first = v.childStart[n]!;
      const end = first + v.childCount[n]!;
      for (let c = first; c < end; c++) {
        const t = a.step(s, v.childByte[c]!);
        if (t < 0) continue;
        for (let e = v.endStart[c]!; e < v.endStart[c + 1]!; e++) {
          const id = v.endIds[e]!;
          m[id >>> 5]! |= 1 << (id & 31);
        }
        if (v.childCount[c]! > 0) {
          nodes.push(c);
          states.push(t);
        }
      }
    }
    // Bounded: a grammar with unbounded nesting (json_object) may reach ever new states.
    if (this.#masks.size >= MASK_CACHE_STATES) this.#masks.clear();
    this.#masks.set(state, m);
    return m;
  }
}

/**
 * One request's position in a compiled grammar: the mask of its next token, and the tokens it
 * accepts. Stop tokens are allowed only where the text so far is a complete match; once the
 * match is complete and nothing may follow, only stop tokens are (and `finished` is true).
 */
export class GrammarMatcher {
  readonly #g: CompiledGrammar;
  readonly #stops: readonly number[];
  #state: number;
  #stopped = false;

  /** A matcher at the start of `g`, ending on any of `stopIds`. */
  constructor(g: CompiledGrammar, stopIds: readonly number[]) {
    this.#g = g;
    this.#stops = stopIds;
    this.#state = g.automaton.start;
  }

  /** Whether the text so far is a complete match (a stop token may end it). */
  get accepting(): boolean {
    return this.#g.automaton.accepting(this.#state);
  }

  /** Whether the match is complete and nothing may follow, or a stop token was accepted. */
  get finished(): boolean {
    return this.#stopped || !this.#g.automaton.live(this.#state);
  }

  /** The allowed next tokens (a fresh mask the caller may keep). */
  mask(): TokenBitmask {
    const base = this.#g.tokenMask(this.#state);
    const words = Math.max(base.length, ...this.#stops.map((s) => (s >>> 5) + 1));
    const m = new Uint32Array(words);
    if (!this.#stopped) m.set(base);
    if (this.accepting && !this.#stopped) for (const s of this.#stops) m[s >>> 5]! |= 1 << (s & 31);
    return m;
  }

  /** Whether token `id` is allowed next. */
  allows(id: number): boolean {
    if (this.#stopped) return false;
    if (this.#stops.includes(id)) return this.accepting;
    const t = this.#g.vocab.tokens[id];
    return t !== undefined && this.#g.automaton.stepAll(this.#state, t) >= 0;
  }

  /** Advances past token `id`; a token the grammar does not allow is `STRUCT_REJECTED_TOKEN`. */
  accept(id: number): void {
    if (!this.allows(id)) throw new StructuredError(StructuredCode.REJECTED_TOKEN, `token ${String(id)} is not allowed by the constraint at this point`);
    if (this.#stops.includes(id)) {
      this.#stopped = true;
      return;
    }
    this.#state = this.#g.automaton.stepAll(this.#state, this.#g.vocab.tokens[id]!);
  }
}
