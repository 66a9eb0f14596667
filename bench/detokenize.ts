/**
 * Streaming detokenization: the incremental detokenizer (vLLM's window algorithm) against the
 * peer the server used before (re-decoding every id so far after each token, O(n²)), and one
 * decode of the whole sequence (the floor).
 *
 *   node --conditions=@stageml/source --import tsx bench/detokenize.ts
 *
 * Per tokenizer (fixtures/hf-v2: the byte-fallback SentencePiece-style one and the byte-level
 * BPE one), the ids of accented, CJK and emoji text repeated to N tokens; medians of 9 runs after
 * 2 warm-ups. Results go to bench/results/detokenize.{json,md}.
 */
import { readFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';
import { IncrementalDetokenizer, type TextTokenizer, loadTokenizer } from '@stageml/models';
import { type BenchCase, medianMs, writeResults } from './lib/harness.js';

const v2 = fileURLToPath(new URL('../fixtures/hf-v2/', import.meta.url));
const golden = JSON.parse(readFileSync(`${v2}golden.json`, 'utf8')) as { 'mistral.unicode': { text: string }[] };
const text = golden['mistral.unicode'].map((u) => u.text).join(' ');

function idsOf(tok: TextTokenizer, n: number): number[] {
  const one = tok.encode(text, { addSpecialTokens: false });
  const out: number[] = [];
  while (out.length < n) out.push(...one);
  return out.slice(0, n);
}

async function main(): Promise<void> {
  const load = loadavg().map((x) => x.toFixed(2)).join(' ');
  const cases: BenchCase[] = [];
  for (const [name, dir] of [['byte-fallback', 'mistral-sw'], ['byte-level', 'bytelevel-chat']] as const) {
    const tok = (await loadTokenizer(`${v2}${dir}`))!;
    for (const n of [64, 256]) {
      const ids = idsOf(tok, n);
      const full = tok.decode(ids);
      const inc = medianMs(() => {
        const d = new IncrementalDetokenizer(tok);
        for (const id of ids) d.push(id);
        d.flush();
        if (d.text !== full) throw new Error(`${name}: incremental text differs`);
      }, 9, 2);
      const redecode = medianMs(() => {
        for (let i = 1; i <= ids.length; i++) tok.decode(ids.slice(0, i));
      }, 9, 2);
      const once = medianMs(() => tok.decode(ids), 9, 2);
      const peer = `${name} n=${String(n)} re-decode all per token`;
      cases.push({ name: peer, medianMs: redecode, runs: 9 });
      cases.push({ name: `${name} n=${String(n)} incremental`, medianMs: inc, runs: 9, baseline: peer, ratio: inc / redecode });
      cases.push({ name: `${name} n=${String(n)} one decode (floor)`, medianMs: once, runs: 9, baseline: peer, ratio: once / redecode });
    }
  }
  writeResults('detokenize', 'Streaming detokenization of N tokens: incremental (hold back incomplete UTF-8) vs re-decoding the whole prefix per token (the previous server) vs one decode.', cases, [
    `Load average at start: ${load} (shared 2-core machine).`,
    'The incremental text equals `decode(ids)` in every run (checked).',
  ]);
}

await main();
