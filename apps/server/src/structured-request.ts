import type { TokenConstraint } from '@stageml/models';
import { type ConstraintSpec, GrammarCache, vocabularyOf } from '@stageml/structured';
import type { TextTokenizer } from '@stageml/models';
import { ServerCode, ServerError } from './errors.js';

/** The structured-output fields of a request body, as OpenAI and vLLM spell them. */
interface StructuredFields {
  readonly response_format?: unknown;
  readonly guided_json?: unknown;
  readonly guided_regex?: unknown;
  readonly guided_choice?: unknown;
  readonly guided_grammar?: unknown;
  readonly structured_outputs?: unknown;
}

const bad = (field: string, what: string): never => {
  throw new ServerError(ServerCode.BAD_REQUEST, `'${field}': ${what}`);
};

/** A JSON schema given as an object, or as its JSON text (vLLM accepts both). */
function schemaOf(field: string, v: unknown): unknown {
  if (typeof v === 'string') {
    try {
      return JSON.parse(v) as unknown;
    } catch {
      return bad(field, 'is not valid JSON');
    }
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return bad(field, 'must be a JSON schema object');
  return v;
}

function responseFormatSpec(v: unknown): ConstraintSpec | undefined {
  if (typeof v !== 'object' || v === null) return bad('response_format', "must be an object with a 'type'");
  const rf = v as { type?: unknown; json_schema?: unknown };
  switch (rf.type) {
    case 'text': return undefined;
    case 'json_object': return { kind: 'json_object' };
    case 'json_schema': {
      const js = rf.json_schema as { schema?: unknown; strict?: unknown } | null | undefined;
      if (typeof js !== 'object' || js === null) return bad('response_format.json_schema', "is required with type 'json_schema'");
      const schema = js.schema === undefined ? {} : schemaOf('response_format.json_schema.schema', js.schema);
      return { kind: 'json_schema', schema, ...(js.strict === true ? { strict: true } : {}) };
    }
    default: return bad('response_format.type', `must be 'text', 'json_object' or 'json_schema', got ${JSON.stringify(rf.type)}`);
  }
}

/** vLLM's `structured_outputs` object (and the older `guided_*` fields): exactly one kind. */
function guidedSpec(field: string, o: Readonly<Record<string, unknown>>): ConstraintSpec | undefined {
  const specs: ConstraintSpec[] = [];
  const prefix = field === 'structured_outputs' ? 'structured_outputs.' : 'guided_';
  const key = (k: string) => (field === 'structured_outputs' ? k : `guided_${k}`);
  if (o[key('json')] != null) specs.push({ kind: 'json_schema', schema: schemaOf(`${prefix}json`, o[key('json')]) });
  if (o[key('regex')] != null) {
    if (typeof o[key('regex')] !== 'string') bad(`${prefix}regex`, 'must be a string');
    specs.push({ kind: 'regex', pattern: o[key('regex')] as string });
  }
  if (o[key('choice')] != null) {
    const c = o[key('choice')];
    if (!Array.isArray(c) || c.length === 0 || c.some((x) => typeof x !== 'string')) bad(`${prefix}choice`, 'must be a non-empty list of strings');
    specs.push({ kind: 'choice', choices: c as string[] });
  }
  if (o[key('grammar')] != null) {
    if (typeof o[key('grammar')] !== 'string') bad(`${prefix}grammar`, 'must be a string');
    specs.push({ kind: 'grammar', grammar: o[key('grammar')] as string });
  }
  if (field === 'structured_outputs' && o['json_object'] === true) specs.push({ kind: 'json_object' });
  if (specs.length > 1) bad(field === 'structured_outputs' ? field : 'guided_*', 'give only one of json, regex, choice, grammar');
  return specs[0];
}

/**
 * The decoding constraint a request asks for, or undefined: `response_format` (`json_object`,
 * `json_schema` with `strict`), vLLM's `structured_outputs` (`json`, `regex`, `choice`, `grammar`,
 * `json_object`) or its older `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`.
 * More than one is `SERVER_BAD_REQUEST` naming the fields.
 */
export function constraintSpecOf(request: object): ConstraintSpec | undefined {
  const body = request as StructuredFields;
  const found: [string, ConstraintSpec][] = [];
  if (body.response_format != null) {
    const s = responseFormatSpec(body.response_format);
    if (s !== undefined) found.push(['response_format', s]);
  }
  if (body.structured_outputs != null) {
    if (typeof body.structured_outputs !== 'object') bad('structured_outputs', 'must be an object');
    const s = guidedSpec('structured_outputs', body.structured_outputs as Record<string, unknown>);
    if (s !== undefined) found.push(['structured_outputs', s]);
  }
  const g = guidedSpec('guided', body as Record<string, unknown>);
  if (g !== undefined) found.push(['guided_*', g]);
  if (found.length > 1) bad(found.map(([f]) => f).join("' and '"), 'give one structured-output constraint, not several');
  return found[0]?.[1];
}

const caches = new WeakMap<TextTokenizer, GrammarCache>();

/** The grammar cache of a tokenizer (its vocabulary built once, `vocabSize` ids). */
export function grammarCacheOf(tok: TextTokenizer, vocabSize: number): GrammarCache {
  let c = caches.get(tok);
  if (c === undefined) {
    c = new GrammarCache(vocabularyOf(tok, vocabSize));
    caches.set(tok, c);
  }
  return c;
}

/**
 * Compiles `spec` for the model's tokenizer now (a bad schema, regex or grammar is a 400 before
 * anything runs) and returns a factory of fresh matchers, one per generated choice, ending on
 * `stopIds` (allowed only where the output is complete).
 */
export function constraintFactory(tok: TextTokenizer | undefined, vocabSize: number, spec: ConstraintSpec, stopIds: readonly number[]): () => TokenConstraint {
  if (tok === undefined) throw new ServerError(ServerCode.BAD_REQUEST, 'structured outputs need the model\'s tokenizer, and this model has none');
  const cache = grammarCacheOf(tok, vocabSize);
  cache.compile(spec);
  return () => cache.matcher(spec, stopIds);
}
