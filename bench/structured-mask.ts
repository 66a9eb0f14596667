/**
 * Token masks of `@stageml/structured` at SmolLM2's vocabulary size (49,152 ids): compile time
 * of a JSON schema, the first mask of a matching state (one walk of the vocabulary trie), a cached
 * mask, and whole constrained generations (uniform random picks among allowed tokens, so every
 * kind of state is visited) in ms per token.
 *
 *   node --conditions=@stageml/source --import tsx bench/structured-mask.ts
 *
 * The vocabulary is synthetic but shaped like a byte-level BPE one: the 256 byte tokens, then
 * word pieces of 1–8 letters (half with a leading space) mixed with JSON punctuation and digits.
 * No tokenizer of that size ships with the repository. Results: bench/results/structured-mask.{json,md}.
 */
import { seededRandom } from '@stageml/ir';
import { GrammarCache, Vocabulary, maskHas } from '@stageml/structured';
import { type BenchCase, writeResults } from './lib/harness.js';

const VOCAB = 49152;
const rand = seededRandom(7);
const enc = new TextEncoder();
const tokens: (Uint8Array | undefined)[] = [];
for (let b = 0; b < 256; b++) tokens.push(Uint8Array.of(b));
const seen = new Set<string>();
const pieces = ['{', '}', '":', '",', '"', '[', ']', '0', '1', '2', '3', ':', ',', '.', '-', 'true', 'false', 'null', '\n', '  '];
const letters = 'abcdefghijklmnopqrstuvwxyz';
while (tokens.length < VOCAB - 1) {
  let s = rand() < 0.5 ? ' ' : '';
  const n = 1 + Math.floor(rand() * 8);
  for (let j = 0; j < n; j++) s += rand() < 0.1 ? pieces[Math.floor(rand() * pieces.length)]! : letters[Math.floor(rand() * 26)]!;
  if (seen.has(s) || s.length < 2) continue;
  seen.add(s);
  tokens.push(enc.encode(s));
}
tokens.push(undefined);
const EOS = VOCAB - 1;
const vocab = new Vocabulary(tokens);

const schema = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 24 },
    age: { type: 'integer', minimum: 0, maximum: 150 },
    email: { type: 'string', pattern: '^[a-z]{1,12}@[a-z]{1,8}\\.(com|org)$' },
    tags: { type: 'array', items: { enum: ['red', 'green', 'blue'] }, maxItems: 4 },
    score: { type: 'number', minimum: 0, maximum: 1 },
    address: { type: 'object', properties: { city: { type: 'string', maxLength: 16 }, zip: { type: 'string', pattern: '^\\d{5}$' } }, required: ['city'] },
  },
  required: ['name', 'age', 'tags'],
  additionalProperties: false,
};

const cases: BenchCase[] = [];
const time = (f: () => void): number => {
  const t = performance.now();
  f();
  return performance.now() - t;
};
const cache = new GrammarCache(vocab);
const compileMs = time(() => cache.compile({ kind: 'json_schema', schema }));
const g = cache.compile({ kind: 'json_schema', schema });
const firstMaskMs = time(() => g.tokenMask(g.automaton.start));
const cachedMaskMs = time(() => g.tokenMask(g.automaton.start));
cases.push({ name: 'compile JSON schema (6 properties, nested)', medianMs: compileMs, runs: 1 });
cases.push({ name: 'first mask of a state (trie walk)', medianMs: firstMaskMs, runs: 1 });
cases.push({ name: 'mask of a seen state (cached)', medianMs: cachedMaskMs, runs: 1 });

for (const round of ['cold', 'warm']) {
  let steps = 0;
  const t = performance.now();
  for (let r = 0; r < 8; r++) {
    const m = cache.matcher({ kind: 'json_schema', schema }, [EOS]);
    for (let i = 0; i < 300 && !m.finished; i++) {
      const mask = m.mask();
      const allowed: number[] = [];
      for (let w = 0; w < mask.length; w++) if (mask[w] !== 0) for (let b = 0; b < 32; b++) if (maskHas(mask, w * 32 + b)) allowed.push(w * 32 + b);
      const id = m.accepting ? EOS : allowed[Math.floor(rand() * allowed.length)]!;
      m.accept(id);
      steps++;
    }
  }
  const ms = (performance.now() - t) / steps;
  cases.push({ name: `generation, ${round} cache: mask + accept per token (mean of ${String(steps)} tokens)`, medianMs: ms, runs: steps });
}
for (const c of cases) console.log(`${c.name}: ${c.medianMs.toFixed(3)} ms`);
writeResults('structured-mask', 'Token masks of @stageml/structured at vocabulary 49,152 (synthetic byte-level BPE-shaped vocabulary).', cases, [`trie nodes: ${String(vocab.nodeCount)}`]);
