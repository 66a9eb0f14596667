import { describe, expect, it } from 'vitest';
import { type PickInfo, logSoftmax, makePicker, topOf } from './index.js';

describe('makePicker logits processing', () => {
  const logits = [1, 3, 2, 0];

  it('logit_bias moves the greedy choice; out-of-range biases are MODEL_BAD_OPTIONS', () => {
    expect(makePicker({ greedy: true })(logits)).toBe(1);
    expect(makePicker({ greedy: true, logitBias: { 3: 10 } })(logits)).toBe(3);
    expect(() => makePicker({ greedy: true, logitBias: { 3: 101 } })).toThrow(/\[-100, 100\]/);
  });

  it('frequency and presence penalties count output tokens; repetition penalty covers the prompt', () => {
    const freq = makePicker({ greedy: true, frequencyPenalty: 0.6 });
    expect([freq(logits), freq(logits), freq(logits)]).toEqual([1, 1, 2]); // 3 − 0.6·2 < 2
    const pres = makePicker({ greedy: true, presencePenalty: 1.5 });
    expect([pres(logits), pres(logits), pres(logits)]).toEqual([1, 2, 1]); // each used token loses 1.5 once: [1, 1.5, 0.5, 0]
    const rep = makePicker({ greedy: true, repetitionPenalty: 2, promptIds: [1] });
    expect(rep(logits)).toBe(2); // 3 / 2 < 2
    expect(() => makePicker({ greedy: true, presencePenalty: 3 })).toThrow(/\[-2, 2\]/);
    expect(() => makePicker({ greedy: true, repetitionPenalty: 0 })).toThrow(/positive/);
  });

  it('reports raw log-probabilities of the pick and the top tokens', () => {
    const seen: PickInfo[] = [];
    const pick = makePicker({ greedy: true, logitBias: { 0: 5 }, topLogprobs: 2, onPick: (i) => seen.push(i) });
    expect(pick(logits)).toBe(0);
    const lp = logSoftmax(logits);
    expect(seen[0]!.logprob).toBeCloseTo(lp[0]!, 12);
    expect(seen[0]!.top.map((t) => t.id)).toEqual([1, 2]);
    expect(topOf([0, 5, 5, 1], 3).map((t) => t.id)).toEqual([1, 2, 3]);
  });

  it('sampling is reproducible per seed and differs across seeds', () => {
    const wide = Array.from({ length: 50 }, (_, i) => Math.sin(i));
    const draw = (seed: number) => {
      const p = makePicker({ seed, temperature: 1.5 });
      return Array.from({ length: 20 }, () => p(wide));
    };
    expect(draw(7)).toEqual(draw(7));
    expect(draw(7)).not.toEqual(draw(8));
  });
});
