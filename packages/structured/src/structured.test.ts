import Ajv from 'ajv';
import { describe, expect, it } from 'vitest';
import { fc, test } from '@fast-check/vitest';
import { Automaton, GrammarCache, GrammarMatcher, StructuredCode, Vocabulary, applyMask, gbnfGrammar, grammarOf, jsonSchemaGrammar, maskHas, regexGrammar, vocabularyOf } from './index.js';

const enc = new TextEncoder();
const dec = new TextDecoder();

/** A vocabulary: every single byte, plus multi-byte pieces typical of JSON output. */
function testVocab(extra: readonly string[] = []): Vocabulary {
  const tokens: (Uint8Array | undefined)[] = [];
  for (let b = 0; b < 256; b++) tokens.push(Uint8Array.of(b));
  for (const s of ['{"', '":', '",', '"}', 'name', 'age', 'true', 'false', 'null', '12', '3.5', '},{', '[{', '}]', 'é', '"a', 'ab', ...extra]) tokens.push(enc.encode(s));
  tokens.push(undefined); // an EOS-like special id
  return new Vocabulary(tokens);
}

/** Random decoding under the constraint: uniform over allowed tokens, ending at the stop id. */
function randomGenerate(cache: GrammarCache, spec: Parameters<GrammarCache['compile']>[0], seed: number, maxTokens = 400): { text: string; stopped: boolean } {
  const eos = cache.vocab.size - 1;
  const m = cache.matcher(spec, [eos]);
  const out: number[] = [];
  let s = seed >>> 0 || 1;
  const rand = () => ((s = (Math.imul(s, 1103515245) + 12345) >>> 0) / 2 ** 32);
  for (let step = 0; step < maxTokens && !m.finished; step++) {
    const mask = m.mask();
    const allowed: number[] = [];
    for (let id = 0; id < cache.vocab.size; id++) if (maskHas(mask, id)) allowed.push(id);
    expect(allowed.length).toBeGreaterThan(0);
    // Favour stopping and closing once possible, so random walks end.
    const id = m.accepting && rand() < 0.5 ? eos : allowed[Math.floor(rand() * allowed.length)]!;
    m.accept(id);
    if (id !== eos) out.push(id);
  }
  const bytes = out.flatMap((id) => [...cache.vocab.tokens[id]!]);
  return { text: dec.decode(Uint8Array.from(bytes)), stopped: m.finished };
}

const SCHEMAS: Record<string, unknown>[] = [
  { type: 'object', properties: { name: { type: 'string', maxLength: 6 }, age: { type: 'integer', minimum: 0, maximum: 150 } }, required: ['name', 'age'], additionalProperties: false },
  { type: 'object', properties: { tags: { type: 'array', items: { enum: ['a', 'b', 'c'] }, minItems: 1, maxItems: 3 }, ok: { type: 'boolean' } }, required: ['tags'] },
  { type: 'object', properties: { v: { anyOf: [{ type: 'integer', minimum: -20, maximum: -3 }, { type: 'null' }, { const: 'x' }] } }, required: ['v'] },
  { type: 'object', properties: { p: { type: 'number', minimum: -1.5, maximum: 2.25 }, q: { type: 'number', exclusiveMinimum: 0, exclusiveMaximum: 10 } }, required: ['p', 'q'] },
  { type: 'object', properties: { a: { type: 'object', properties: { b: { type: 'array', items: { type: 'integer', minimum: 990, maximum: 1010 }, maxItems: 4 } }, required: ['b'] }, c: { type: 'string', pattern: '^[a-c]{2,4}-\\d$' } }, required: ['a', 'c'] },
  { $defs: { node: { type: 'object', properties: { v: { type: 'integer', minimum: 0, maximum: 9 }, kids: { type: 'array', items: { $ref: '#/$defs/node' }, maxItems: 2 } }, required: ['v'] } }, $ref: '#/$defs/node' },
  { type: 'object', properties: { x: { type: ['string', 'integer'], maxLength: 3, maximum: 5, minimum: 1 } }, required: ['x'], additionalProperties: { type: 'boolean' } },
];

describe('jsonSchemaGrammar', () => {
  it('accepts valid compact JSON and rejects invalid', () => {
    const a = new Automaton(jsonSchemaGrammar(SCHEMAS[0]!));
    expect(a.matches('{"name":"bob","age":42}')).toBe(true);
    expect(a.matches('{"name":"bob","age":151}')).toBe(false);
    expect(a.matches('{"name":"bob"}')).toBe(false);
    expect(a.matches('{"name":"bob","age":4,"x":1}')).toBe(false);
    expect(a.matches('{"name":"bobbobb","age":4}')).toBe(false);
    expect(a.matches('{"name":"b\\"é","age":0}')).toBe(true);
  });

  it('skips optional properties with correct commas', () => {
    const a = new Automaton(jsonSchemaGrammar({ type: 'object', properties: { a: { type: 'integer' }, b: { type: 'integer' }, c: { type: 'integer' } }, required: ['b'] }));
    for (const ok of ['{"b":1}', '{"a":1,"b":2}', '{"b":2,"c":3}', '{"a":1,"b":2,"c":3}']) expect(a.matches(ok)).toBe(true);
    for (const no of ['{}', '{"a":1}', '{,"b":1}', '{"b":1,}', '{"a":1"b":2}']) expect(a.matches(no)).toBe(false);
  });

  it('allows extra properties only when the schema does and not under strict', () => {
    const s = { type: 'object', properties: { a: { type: 'integer' } }, additionalProperties: true };
    expect(new Automaton(jsonSchemaGrammar(s)).matches('{"a":1,"zz":[1,{"q":null}]}')).toBe(true);
    expect(new Automaton(jsonSchemaGrammar(s, { strict: true })).matches('{"a":1,"zz":2}')).toBe(false);
  });

  it('names unsupported keywords and malformed schemas with codes', () => {
    expect(() => jsonSchemaGrammar({ type: 'object', not: {} })).toThrow(expect.objectContaining({ code: StructuredCode.UNSUPPORTED_SCHEMA, message: expect.stringContaining("'not'") }));
    expect(() => jsonSchemaGrammar({ type: 'wat' })).toThrow(expect.objectContaining({ code: StructuredCode.BAD_SCHEMA }));
    expect(() => jsonSchemaGrammar({ $ref: '#/$defs/missing' })).toThrow(expect.objectContaining({ code: StructuredCode.BAD_SCHEMA }));
    expect(() => jsonSchemaGrammar({ type: 'integer', minimum: 5, maximum: 4 })).toThrow(expect.objectContaining({ code: StructuredCode.BAD_SCHEMA }));
  });

  test.prop([fc.integer({ min: -100000, max: 100000 }), fc.integer({ min: 0, max: 100000 }), fc.integer({ min: -300000, max: 300000 })])('integer bounds match exactly the integers within them', (lo, width, x) => {
    const hi = lo + width;
    const a = new Automaton(jsonSchemaGrammar({ type: 'integer', minimum: lo, maximum: hi }));
    expect(a.matches(String(x))).toBe(x >= lo && x <= hi);
    expect(a.matches(String(lo))).toBe(true);
    expect(a.matches(String(hi))).toBe(true);
    expect(a.matches(`0${String(Math.abs(x))}`)).toBe(false);
  });

  test.prop([fc.integer({ min: -50, max: 50 }), fc.double({ min: -60, max: 60, noNaN: true })])('number bounds never admit a value outside them', (lo, x) => {
    const a = new Automaton(jsonSchemaGrammar({ type: 'number', minimum: lo, maximum: lo + 7 }));
    if (a.matches(JSON.stringify(x))) expect(x >= lo && x <= lo + 7).toBe(true);
  });

  it('random decoding under each schema always validates (ajv)', () => {
    const ajv = new Ajv({ strict: false });
    const cache = new GrammarCache(testVocab());
    for (const [i, schema] of SCHEMAS.entries()) {
      const validate = ajv.compile(schema);
      let ended = 0;
      for (let seed = 1; seed <= 15; seed++) {
        const { text, stopped } = randomGenerate(cache, { kind: 'json_schema', schema }, seed * 7919 + i, 4000);
        if (!stopped) continue;
        ended++;
        const value = JSON.parse(text) as unknown;
        expect(validate(value), `${text} vs schema ${String(i)}: ${ajv.errorsText(validate.errors)}`).toBe(true);
      }
      expect(ended, `schema ${String(i)}: no random walk ended`).toBeGreaterThan(0);
    }
  });
});

describe('regexGrammar', () => {
  const patterns = ['^[a-z]+@[a-z]+\\.(com|org)$', '\\d{3}-\\d{2,4}', '(ab|c)*d?', '[^x]{2}', 'a.b', '\\w+\\s\\W', '(?:foo|bar)+', 'x{2,}y'];
  test.prop([fc.constantFrom(...patterns), fc.string({ unit: fc.constantFrom('a', 'b', 'c', 'd', 'x', 'y', '1', '2', '-', '@', '.', ' ', 'é', 'f', 'o', 'r', 'm', 'g', 'z', '\n'), maxLength: 14 })])('matches what RegExp fully matches', (p, s) => {
    const a = new Automaton(regexGrammar(p));
    const re = new RegExp(`^(?:${p.replace(/^\^/, '').replace(/\$$/, '')})$`, 'u');
    expect(a.matches(s)).toBe(re.test(s));
  });

  it('refuses backreferences and lookaround with STRUCT_BAD_REGEX', () => {
    expect(() => regexGrammar('(a)\\1')).toThrow(expect.objectContaining({ code: StructuredCode.BAD_REGEX }));
    expect(() => regexGrammar('a(?=b)')).toThrow(expect.objectContaining({ code: StructuredCode.BAD_REGEX }));
    expect(() => regexGrammar('a{3,1}')).toThrow(expect.objectContaining({ code: StructuredCode.BAD_REGEX }));
  });
});

describe('gbnfGrammar', () => {
  it('parses rules, classes, groups and quantifiers', () => {
    const g = gbnfGrammar('root ::= greet " " name ("!" | "?")?  # comment\ngreet ::= "hi" | "yo"\nname ::= [A-Z] [a-z]{1,3}\n');
    const a = new Automaton(g);
    expect(a.matches('hi Bob!')).toBe(true);
    expect(a.matches('yo Al')).toBe(true);
    expect(a.matches('hi bob')).toBe(false);
    expect(a.matches('hi Bobby')).toBe(false);
  });

  it('supports recursion and refuses undefined rules and left recursion', () => {
    expect(new Automaton(gbnfGrammar('root ::= "(" root ")" | "x"')).matches('((x))')).toBe(true);
    expect(() => new Automaton(gbnfGrammar('root ::= item\n'))).toThrow(expect.objectContaining({ code: StructuredCode.BAD_GRAMMAR }));
    expect(() => new Automaton(gbnfGrammar('root ::= root "a" | "b"'))).toThrow(expect.objectContaining({ code: StructuredCode.BAD_GRAMMAR }));
    expect(() => gbnfGrammar('start ::= "a"')).toThrow(expect.objectContaining({ code: StructuredCode.BAD_GRAMMAR }));
  });
});

describe('GrammarMatcher', () => {
  it('masks tokens by the whole token bytes and allows the stop token only when complete', () => {
    const vocab = testVocab();
    const eos = vocab.size - 1;
    const cache = new GrammarCache(vocab);
    const m = cache.matcher({ kind: 'choice', choices: ['true', 'tru'] }, [eos]);
    const id = (s: string) => vocab.tokens.findIndex((t) => t !== undefined && dec.decode(t) === s);
    let mask = m.mask();
    expect(maskHas(mask, id('true'))).toBe(true);
    expect(maskHas(mask, id('t'))).toBe(true);
    expect(maskHas(mask, id('false'))).toBe(false);
    expect(maskHas(mask, eos)).toBe(false);
    for (const c of 'tru') m.accept(id(c));
    mask = m.mask();
    expect(maskHas(mask, eos)).toBe(true);
    expect(maskHas(mask, id('e'))).toBe(true);
    m.accept(id('e'));
    expect(m.finished).toBe(true);
    expect([...m.mask()].some((w, i) => w !== 0 && i !== eos >>> 5)).toBe(false);
    expect(() => { m.accept(id('x')); }).toThrow(expect.objectContaining({ code: StructuredCode.REJECTED_TOKEN }));
  });

  it('applyMask sets disallowed logits to -Infinity, ids past the vocabulary too', () => {
    const vocab = testVocab();
    const m = new GrammarMatcher(new GrammarCache(vocab).compile({ kind: 'regex', pattern: 'a' }), []);
    const logits = new Float32Array(vocab.size + 3).fill(1);
    applyMask(logits, m.mask());
    const kept = [...logits.keys()].filter((i) => logits[i] === 1);
    expect(kept.map((i) => dec.decode(vocab.tokens[i]))).toEqual(['a']);
  });

  it('caches compiled grammars by spec', () => {
    const cache = new GrammarCache(testVocab());
    const a = cache.compile({ kind: 'json_object' });
    expect(cache.compile({ kind: 'json_object' })).toBe(a);
    expect(cache.compile({ kind: 'regex', pattern: 'a' })).not.toBe(a);
    expect(cache.size).toBe(2);
  });

  it('json_object only produces objects', () => {
    const cache = new GrammarCache(testVocab());
    for (let seed = 1; seed < 20; seed++) {
      const { text, stopped } = randomGenerate(cache, { kind: 'json_object' }, seed, 3000);
      if (stopped) expect(typeof JSON.parse(text)).toBe('object');
    }
    expect(() => grammarOf({ kind: 'choice', choices: [] })).toThrow(expect.objectContaining({ code: StructuredCode.BAD_SPEC }));
  });
});

describe('vocabularyOf', () => {
  it('reads byte-level and SentencePiece spellings, never special ids', () => {
    const bl = ['a', 'Ġthe', 'Ċ', 'Ã©', '<|eos|>'];
    const v = vocabularyOf({ tokenOf: (i) => bl[i], specialIds: new Set([4]) }, 5);
    expect(v.tokens.slice(0, 4).map((t) => dec.decode(t))).toEqual(['a', ' the', '\n', 'é']);
    expect(v.tokens[4]).toBeUndefined();
    const sp = ['▁the', '<0x0A>', 'x', '<s>'];
    const w = vocabularyOf({ tokenOf: (i) => sp[i], specialIds: new Set([3]) }, 4);
    expect(w.tokens.slice(0, 3).map((t) => dec.decode(t))).toEqual([' the', '\n', 'x']);
  });
});

describe('Automaton limits', () => {
  it('refuses a grammar whose unrolled repetitions exceed the program size, with STRUCT_BAD_GRAMMAR', () => {
    const huge = { type: 'array', items: { type: 'string', maxLength: 4000 }, maxItems: 4000 };
    expect(() => new Automaton(jsonSchemaGrammar(huge))).toThrow(expect.objectContaining({ code: StructuredCode.BAD_GRAMMAR }));
  });
});
