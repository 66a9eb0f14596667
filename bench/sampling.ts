/**
 * Picking the next token of 64 rows from a real vocabulary: the sampler (`makePicker`: radix
 * order, a heap for top-k) against the one before it (a comparator sort of the whole vocabulary
 * per pick, `sampling-reference.ts`) and the peer a torch server runs on the CPU (HF's top-k /
 * top-p warpers and `torch.multinomial` over the batch: one sort per row, vectorized and
 * multi-threaded), all on this machine.
 *
 *   node --conditions=@stageml/source --import tsx bench/sampling.ts
 *
 * Vocabularies of 32,000 (Llama 2, Mistral) and 128,256 (Llama 3) tokens; logits uniform in
 * [-8, 8) (a flat distribution: top-p keeps many tokens); medians of 5 steps after 1 warm-up. Our
 * picks are checked equal to the previous sampler's in every case. The torch peer runs only where
 * python3 has torch (CI installs Debian's python3-torch). Results: bench/results/sampling.{json,md}.
 */
import { spawnSync } from 'node:child_process';
import { loadavg } from 'node:os';
import { seededRandom } from '@stageml/ir';
import { type SamplingOptions, makePicker } from '@stageml/models';
import { referenceSampler } from '../packages/models/src/sampling-reference.js';
import { type BenchCase, medianMs, writeResults } from './lib/harness.js';

const ROWS = 64;
const OPTIONS: readonly [string, SamplingOptions][] = [
  ['greedy', { greedy: true }],
  ['temperature 1', { temperature: 1 }],
  ['top-p 0.95, temperature 0.8', { temperature: 0.8, topP: 0.95 }],
  ['top-k 50, temperature 0.7', { temperature: 0.7, topK: 50 }],
];

/** The torch peer: ms per 64-row step, by case name (empty without python3 + torch). */
function torchPeer(vocabs: readonly number[]): Record<string, number> {
  const script = `
import json, sys, time, torch
torch.manual_seed(0)
out = {}
for V in ${JSON.stringify(vocabs)}:
    logits = torch.rand((${String(ROWS)}, V)) * 16 - 8
    def step(temperature=None, top_p=None, top_k=None, greedy=False):
        if greedy:
            return logits.argmax(-1)
        x = logits / temperature
        if top_k is not None:  # HF's TopKLogitsWarper
            kth = torch.topk(x, top_k)[0][..., -1, None]
            x = x.masked_fill(x < kth, -float("inf"))
        if top_p is not None:  # HF's TopPLogitsWarper
            s, i = torch.sort(x, descending=False)
            cum = s.softmax(-1).cumsum(-1)
            drop = cum <= (1 - top_p)
            drop[..., -1:] = 0
            x = x.masked_fill(drop.scatter(1, i, drop), -float("inf"))
        return torch.multinomial(x.softmax(-1), 1)
    cases = {"greedy": dict(greedy=True), "temperature 1": dict(temperature=1.0), "top-p 0.95, temperature 0.8": dict(temperature=0.8, top_p=0.95), "top-k 50, temperature 0.7": dict(temperature=0.7, top_k=50)}
    for name, kw in cases.items():
        step(**kw)
        ts = []
        for _ in range(5):
            t0 = time.perf_counter(); step(**kw); ts.append((time.perf_counter() - t0) * 1e3)
        out["V=%d %s" % (V, name)] = sorted(ts)[2]
print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "ms": out}))
`;
  for (const py of ['python3', '/usr/bin/python3']) {
    const r = spawnSync(py, ['-c', script], { encoding: 'utf8', timeout: 600_000 });
    if (r.status === 0) {
      const res = JSON.parse(r.stdout) as { torch: string; threads: number; ms: Record<string, number> };
      torchInfo = `torch ${res.torch} (CPU, ${String(res.threads)} threads)`;
      return res.ms;
    }
  }
  return {};
}
let torchInfo = 'torch: not available (python3 without torch)';

function main(): void {
  const load = loadavg().map((x) => x.toFixed(2)).join(' ');
  const vocabs = [32000, 128256];
  const peer = torchPeer(vocabs);
  const cases: BenchCase[] = [];
  for (const V of vocabs) {
    const r = seededRandom(V);
    const rows = Array.from({ length: ROWS }, () => Float32Array.from({ length: V }, () => r() * 16 - 8));
    for (const [name, o] of OPTIONS) {
      const label = `V=${String(V)} ${name}`;
      const ours = rows.map((_, i) => makePicker({ ...o, ...(o.greedy === true ? {} : { seed: i }) }));
      const before = rows.map((_, i) => (o.greedy === true ? makePicker(o) : referenceSampler({ ...(o as object), seed: i })));
      const a: number[] = [];
      const b: number[] = [];
      const oursMs = medianMs(() => { rows.forEach((x, i) => a.push(ours[i]!(x))); }, 5, 1);
      const beforeMs = medianMs(() => { rows.forEach((x, i) => b.push(before[i]!(x))); }, 5, 1);
      if (a.join() !== b.join()) throw new Error(`${label}: the picks differ from the previous sampler's`);
      const base = `${label}: previous sampler (comparator sort)`;
      cases.push({ name: base, medianMs: beforeMs, runs: 5 });
      cases.push({ name: `${label}: makePicker`, medianMs: oursMs, runs: 5, baseline: base, ratio: oursMs / beforeMs });
      const t = peer[label];
      if (t !== undefined) cases.push({ name: `${label}: torch CPU, HF warpers + multinomial (peer)`, medianMs: t, runs: 5, baseline: base, ratio: t / beforeMs });
    }
  }
  writeResults('sampling', `One decode step's picks for ${String(ROWS)} rows (ms per step): makePicker against the previous sampler and a torch CPU sampler over the batch.`, cases, [
    `Load average at start: ${load} (shared 2-core machine). ${torchInfo}.`,
    'makePicker took the same tokens as the previous sampler in every case (checked each run).',
    'The torch peer samples with its own generator, so its tokens are not compared; greedy is argmax over the batch.',
  ]);
}

main();
