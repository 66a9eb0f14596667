import { StructuredCode, StructuredError } from './errors.js';
import { type Grammar, alt, lit } from './grammar.js';
import { gbnfGrammar } from './gbnf.js';
import { jsonObjectGrammar, jsonSchemaGrammar } from './json-schema.js';
import { CompiledGrammar, GrammarMatcher } from './matcher.js';
import { regexGrammar } from './regex.js';
import type { Vocabulary } from './vocab.js';

/** A decoding constraint, as requests give it. */
export type ConstraintSpec =
  | { readonly kind: 'json_schema'; readonly schema: unknown; readonly strict?: boolean }
  | { readonly kind: 'json_object' }
  | { readonly kind: 'regex'; readonly pattern: string }
  | { readonly kind: 'choice'; readonly choices: readonly string[] }
  | { readonly kind: 'grammar'; readonly grammar: string };

/** The grammar of a constraint spec (see each kind's compiler for what it supports). */
export function grammarOf(spec: ConstraintSpec): Grammar {
  switch (spec.kind) {
    case 'json_schema': return jsonSchemaGrammar(spec.schema, spec.strict === undefined ? {} : { strict: spec.strict });
    case 'json_object': return jsonObjectGrammar();
    case 'regex': return regexGrammar(spec.pattern);
    case 'choice': {
      if (spec.choices.length === 0 || spec.choices.some((c) => typeof c !== 'string')) throw new StructuredError(StructuredCode.BAD_SPEC, 'a choice constraint needs a non-empty list of strings');
      return { rules: new Map([['root', alt(...spec.choices.map((c) => lit(c)))]]), root: 'root' };
    }
    case 'grammar': return gbnfGrammar(spec.grammar);
    default: throw new StructuredError(StructuredCode.BAD_SPEC, `unknown constraint kind '${String((spec as { kind: unknown }).kind)}'`);
  }
}

/** A stable key of a spec: JSON with object keys sorted (schema property order is kept: it is the output order). */
export function specKey(spec: ConstraintSpec): string {
  return JSON.stringify(spec);
}

/**
 * Compiled grammars of one vocabulary, cached by spec (least recently used dropped past
 * `capacity`): requests with the same schema share the automaton and its per-state token masks.
 */
export class GrammarCache {
  readonly vocab: Vocabulary;
  readonly #capacity: number;
  readonly #entries = new Map<string, CompiledGrammar>();

  /** A cache for `vocab` of at most `capacity` grammars (default 256). */
  constructor(vocab: Vocabulary, capacity = 256) {
    this.vocab = vocab;
    this.#capacity = capacity;
  }

  /** The compiled grammar of `spec` (compiled now unless cached); bad specs throw their coded error. */
  compile(spec: ConstraintSpec): CompiledGrammar {
    const key = specKey(spec);
    const hit = this.#entries.get(key);
    if (hit !== undefined) {
      this.#entries.delete(key);
      this.#entries.set(key, hit);
      return hit;
    }
    const g = new CompiledGrammar(grammarOf(spec), this.vocab);
    this.#entries.set(key, g);
    if (this.#entries.size > this.#capacity) this.#entries.delete(this.#entries.keys().next().value!);
    return g;
  }

  /** A fresh matcher of `spec` ending on `stopIds`. */
  matcher(spec: ConstraintSpec, stopIds: readonly number[]): GrammarMatcher {
    return new GrammarMatcher(this.compile(spec), stopIds);
  }

  /** Number of cached grammars. */
  get size(): number {
    return this.#entries.size;
  }
}
