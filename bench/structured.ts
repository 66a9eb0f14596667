/**
 * Structured outputs' cost in decoding: tokens/s of 8 concurrent streams on 8 LoRA adapters with a
 * JSON-schema constraint ÷ the same streams unconstrained, through the router's `Scheduler` on a
 * random-weight SmolLM2-135M-shaped checkpoint (vocab 49,152; onnxruntime, BENCH_THREADS threads,
 * default 2). The constraint runs `@stageml/structured` over a synthetic byte-level vocabulary of
 * 49,152 tokens (the checkpoint has no tokenizer): mask per row per step, applied by the host pick.
 * Greedy picks, no stop token (each stream ends at 48 tokens or when its JSON is complete).
 * Rounds alternate unconstrained / constrained; medians of 3 rounds each.
 *
 *   node --conditions=@stageml/source --import tsx bench/structured.ts
 *
 * Results: bench/results/structured.{json,md}. Checkpoint and adapters: bench/tmp/structured.
 */
import { existsSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { Engine, writeRandomAdapter, writeRandomLlama } from '@stageml/engine';
import { seededRandom } from '@stageml/ir';
import type { LlamaShape, SamplingOptions } from '@stageml/models';
import { Scheduler } from '@stageml/router';
import { createOrtExecutor } from '@stageml/runtime';
import { GrammarCache, Vocabulary } from '@stageml/structured';
import { type BenchCase, writeResults } from './lib/harness.js';

const DIR = 'bench/tmp/structured';
const SHAPE: LlamaShape & { maxPositions: number } = { vocabSize: 49152, hiddenSize: 576, intermediateSize: 1536, numLayers: 30, numHeads: 9, numKvHeads: 3, headDim: 64, tieWordEmbeddings: true, rmsNormEps: 1e-5, maxPositions: 2048 };
const STREAMS = 8;
const NEW_TOKENS = 48;
const NAMES = Array.from({ length: STREAMS }, (_, i) => `a${String(i)}`);
const load0 = loadavg()[0]!;

if (!existsSync(join(DIR, 'smol', 'config.json'))) await writeRandomLlama(join(DIR, 'smol'), SHAPE, 135);
for (const [i, name] of NAMES.entries()) if (!existsSync(join(DIR, name, 'adapter_config.json'))) await writeRandomAdapter(join(DIR, name), SHAPE, { rank: 16, seed: 2000 + i });

const engine = await Engine.load(join(DIR, 'smol'), { executor: await createOrtExecutor({ intraOpNumThreads: Number(process.env['BENCH_THREADS'] ?? 2) }), maxLoras: STREAMS, maxLoraRank: 16 });
for (const name of NAMES) await engine.loadAdapter(join(DIR, name));

// A synthetic byte-level vocabulary of the checkpoint's size: bytes, then word pieces and JSON punctuation.
const rand = seededRandom(7);
const enc = new TextEncoder();
const tokens: Uint8Array[] = [];
for (let b = 0; b < 256; b++) tokens.push(Uint8Array.of(b));
const seen = new Set<string>();
const pieces = ['{', '}', '":', '",', '"', '[', ']', '0', '1', '2', ':', ',', '.', '-', 'true', 'false', 'null'];
while (tokens.length < SHAPE.vocabSize) {
  let s = rand() < 0.5 ? ' ' : '';
  const n = 1 + Math.floor(rand() * 8);
  for (let j = 0; j < n; j++) s += rand() < 0.1 ? pieces[Math.floor(rand() * pieces.length)]! : 'abcdefghijklmnopqrstuvwxyz'[Math.floor(rand() * 26)]!;
  if (s.length < 2 || seen.has(s)) continue;
  seen.add(s);
  tokens.push(enc.encode(s));
}
const cache = new GrammarCache(new Vocabulary(tokens));
const schema = {
  type: 'object',
  properties: { name: { type: 'string', maxLength: 40 }, age: { type: 'integer', minimum: 0, maximum: 120 }, tags: { type: 'array', items: { type: 'string', maxLength: 12 }, maxItems: 6 }, note: { type: 'string', maxLength: 80 } },
  required: ['name', 'age', 'tags', 'note'],
  additionalProperties: false,
};
const spec = { kind: 'json_schema' as const, schema, strict: true };

async function round(constrained: boolean): Promise<{ tokens: number; ms: number }> {
  const s = new Scheduler(engine, { maxBatch: STREAMS });
  const t = performance.now();
  const outs = await Promise.all(
    NAMES.map((name, i) => {
      const sampling: SamplingOptions = constrained ? { greedy: true, constraint: cache.matcher(spec, []) } : { greedy: true };
      return s.submit({ tenant: 't', adapter: name, prompt: Array.from({ length: 16 }, (_, k) => 300 + ((i * 97 + k * 13) % 4000)), maxNewTokens: NEW_TOKENS, sampling, stopTokens: [] });
    }),
  );
  return { tokens: outs.reduce((a, o) => a + o.newIds.length, 0), ms: performance.now() - t };
}

await round(false); // warm-up: programs compiled, adapters in slots
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const free: number[] = [];
const json: number[] = [];
const counts: number[] = [];
for (let r = 0; r < 3; r++) {
  const a = await round(false);
  free.push((a.tokens / a.ms) * 1000);
  const b = await round(true);
  json.push((b.tokens / b.ms) * 1000);
  counts.push(b.tokens);
}
const [tf, tj] = [median(free), median(json)];
const cases: BenchCase[] = [
  { name: `unconstrained: ${String(STREAMS)} streams × ${String(NEW_TOKENS)} tokens on ${String(STREAMS)} adapters`, medianMs: 1000 / tf, runs: 3, extra: { tokensPerSecond: tf } },
  { name: `JSON schema (strict): ${String(STREAMS)} streams on ${String(STREAMS)} adapters`, medianMs: 1000 / tj, runs: 3, baseline: 'unconstrained', ratio: tf / tj, extra: { tokensPerSecond: tj, tokensPerRound: median(counts) } },
];
console.log(`tokens/s unconstrained ${tf.toFixed(1)}, constrained ${tj.toFixed(1)}, ratio (constrained ÷ unconstrained) ${(tj / tf).toFixed(3)}`);
writeResults('structured', 'Structured outputs in decoding: JSON-schema-constrained vs unconstrained tokens/s, 8 streams on 8 adapters, SmolLM2-135M-shaped random checkpoint (onnxruntime).', cases, [
  `tokens/s constrained ÷ unconstrained: ${(tj / tf).toFixed(3)} (medianMs is ms per token over all streams)`,
  `load average at start: ${load0.toFixed(2)}`,
]);
engine.dispose();
