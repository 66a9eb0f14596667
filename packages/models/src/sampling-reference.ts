// The sampler as first written (a comparator sort of the whole vocabulary per pick): the oracle of
// sampling.test.ts and the previous implementation bench/sampling.ts measures against. Not part of
// the package's API.
import { seededRandom } from '@stageml/ir';
import { nucleusSize } from './sampling.js';

/** The sampler as it was written first (a comparator sort of the whole vocabulary): the oracle. */
export function referenceSampler(s: { temperature?: number; topK?: number; topP?: number; seed?: number }): (logits: ArrayLike<number>) => number {
  const rand = seededRandom(s.seed ?? 0);
  const temperature = s.temperature ?? 1;
  return (logits) => {
    const n = logits.length;
    const order = Array.from({ length: n }, (_, i) => i).sort((a, b) => logits[b]! - logits[a]! || a - b);
    const k = s.topK === undefined || s.topK === 0 ? n : Math.min(s.topK, n);
    const max = logits[order[0]!]! / temperature;
    const probs = order.slice(0, k).map((i) => Math.exp(logits[i]! / temperature - max));
    const total = probs.reduce((a, p) => a + p, 0);
    // (top-p's cut is not what changed: shared)
    const keep = nucleusSize(probs, total, s.topP);
    const kept = probs.slice(0, keep);
    const mass = kept.reduce((a, p) => a + p, 0);
    let u = rand() * mass;
    for (let i = 0; i < kept.length; i++) {
      u -= kept[i]!;
      if (u < 0) return order[i]!;
    }
    return order[kept.length - 1]!;
  };
}
