import { fc, test } from '@fast-check/vitest';
import { seededRandom } from '@stageml/ir';
import { argmaxRows } from '@stageml/runtime';
import { describe, expect, it } from 'vitest';
import { referenceSampler } from './sampling-reference.js';
import { descendingOrder, topOrder } from './sampling.js';
import { type PickInfo, type PickPlan, argmaxOf, isPlainGreedy, logSoftmax, makePicker, maskLogits, maskedArgmax, pickPlan, processLogits, samplePick, topOf } from './index.js';

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

  it('tells plain greedy pickers (argmax of the raw logits) from the rest', () => {
    expect(isPlainGreedy(makePicker({ greedy: true }))).toBe(true);
    expect(isPlainGreedy(makePicker({ greedy: true, presencePenalty: 0 }))).toBe(true);
    expect(isPlainGreedy(makePicker({ greedy: true, presencePenalty: 0.5 }))).toBe(false);
    expect(isPlainGreedy(makePicker({ greedy: true, onPick: () => undefined }))).toBe(false);
    expect(isPlainGreedy(makePicker({ temperature: 0.5 }))).toBe(false);
  });

  it('plans every picker but those reporting log-probabilities (onPick), with their processing', () => {
    expect(pickPlan(makePicker({ greedy: true }))).toEqual({ kind: 'greedy' });
    expect(pickPlan(makePicker({ greedy: true, presencePenalty: 0 }))).toEqual({ kind: 'greedy' });
    expect(pickPlan(makePicker({ temperature: 0.5, topK: 7, topP: 0.9 }))).toMatchObject({ kind: 'sample', temperature: 0.5, topK: 7, topP: 0.9 });
    expect(pickPlan(makePicker({}))).toMatchObject({ kind: 'sample', temperature: 1, topK: 0, topP: 1 });
    const penalized = pickPlan(makePicker({ temperature: 0.5, presencePenalty: 0.5, frequencyPenalty: -0.25, repetitionPenalty: 1.3, promptIds: [4, 9], logitBias: { 3: 1 } }))!;
    expect(penalized).toMatchObject({ kind: 'sample', temperature: 0.5 });
    expect(penalized.processing!()).toEqual({ logitBias: [[3, 1]], repetitionPenalty: 1.3, seen: [4, 9], frequencyPenalty: -0.25, presencePenalty: 0.5, counts: [] });
    penalized.accept!(7);
    penalized.accept!(7);
    expect(penalized.processing!()).toMatchObject({ seen: [4, 9, 7], counts: [[7, 2]] });
    expect(pickPlan(makePicker({ greedy: true, logitBias: { 3: 1 } }))).toMatchObject({ kind: 'greedy', processing: expect.any(Function) as unknown });
    expect(pickPlan(makePicker({ temperature: 0.5, onPick: () => undefined }))).toBeUndefined();
    expect(pickPlan(makePicker({ greedy: true, topLogprobs: 2, onPick: () => undefined }))).toBeUndefined();
    expect(pickPlan((l) => argmaxOf(l) + 0)).toBeUndefined();
  });

  it('a processed plan\'s picks made elsewhere (processLogits, samplePick, accept) alternate with the picker\'s own, with its tokens', () => {
    const r = seededRandom(12);
    const steps = Array.from({ length: 30 }, () => Float32Array.from({ length: 300 }, () => (r() - 0.5) * 6));
    for (const o of [{ greedy: true as const, presencePenalty: 1.5, frequencyPenalty: 0.7, logitBias: { 5: 3, 299: -2, 400: 9 } }, { temperature: 0.8, topK: 20, repetitionPenalty: 1.8, promptIds: [1, 2, 3, 50], seed: 4 }, { temperature: 1.1, topP: 0.7, presencePenalty: -1, seed: 9 }]) {
      const alone = makePicker(o);
      const want = steps.map((l) => alone(l));
      const mixed = makePicker(o);
      const plan = pickPlan(mixed)!;
      const got = steps.map((l, i) => {
        if (i % 4 === 2) return mixed(l);
        const x = processLogits(l, plan.processing!());
        const id = plan.kind === 'greedy' ? argmaxOf(x) : samplePick(x, plan.temperature, plan.topK, plan.topP, plan.draw());
        plan.accept!(id);
        return id;
      });
      expect(got, JSON.stringify(o)).toEqual(want);
    }
  });

  it('a plan\'s draws are the picker\'s stream: picks made elsewhere with samplePick and picks by the picker may alternate', () => {
    const r = seededRandom(11);
    const steps = Array.from({ length: 24 }, () => Float32Array.from({ length: 500 }, () => (r() - 0.5) * 10));
    for (const o of [{ temperature: 0.9, seed: 5 }, { temperature: 1.4, topK: 30, seed: 6 }, { temperature: 0.6, topP: 0.85, seed: 7 }, { topK: 3, topP: 0.5, seed: 8 }]) {
      const alone = makePicker(o);
      const want = steps.map((l) => alone(l));
      const mixed = makePicker(o);
      const plan = pickPlan(mixed) as Extract<PickPlan, { kind: 'sample' }>;
      expect(plan.kind).toBe('sample');
      const got = steps.map((l, i) => (i % 3 === 1 ? mixed(l) : samplePick(l, plan.temperature, plan.topK, plan.topP, plan.draw())));
      expect(got, JSON.stringify(o)).toEqual(want);
    }
    // u at the ends of [0, 1): the most likely token, and the last one kept.
    const l = [0, 3, 1, 3, -1];
    expect(samplePick(l, 1, 0, 1, 0)).toBe(1);
    expect(samplePick(l, 1, 0, 1, 1 - 2 ** -32)).toBe(4);
    expect(samplePick(l, 1, 2, 1, 1 - 2 ** -32)).toBe(3);
    expect(samplePick(l, 1, 0, 0.4, 1 - 2 ** -32)).toBe(1);
  });

  it('min-p drops tokens below minP times the most likely one\'s probability, after temperature; such pickers pick on the host', () => {
    // Relative probabilities at temperature 1: e^0 = 1, e^-1 ≈ 0.37, e^-2 ≈ 0.14, e^-3 ≈ 0.05.
    const l = [0, -1, -2, -3];
    const last = 1 - 2 ** -32;
    expect(samplePick(l, 1, 0, 1, last)).toBe(3);
    expect(samplePick(l, 1, 0, 1, last, 0.1)).toBe(2);
    expect(samplePick(l, 1, 0, 1, last, 0.2)).toBe(1);
    expect(samplePick(l, 1, 0, 1, last, 1)).toBe(0);
    // Temperature 2 flattens: e^-1.5 ≈ 0.22 ≥ 0.2 stays.
    expect(samplePick(l, 2, 0, 1, last, 0.2)).toBe(3);
    const picker = makePicker({ seed: 1, minP: 0.2 });
    expect(pickPlan(picker)).toBeUndefined();
    expect(pickPlan(makePicker({ seed: 1, minP: 0.2, presencePenalty: 1 }))).toBeUndefined();
    for (let i = 0; i < 50; i++) expect([0, 1]).toContain(picker(l));
    expect(pickPlan(makePicker({ seed: 1, minP: 0 }))).toMatchObject({ kind: 'sample' });
    expect(() => makePicker({ minP: 1.5 })).toThrow(/min-p/);
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

const comparatorOrder = (v: ArrayLike<number>): number[] => Array.from({ length: v.length }, (_, i) => i).sort((a, b) => v[b]! - v[a]! || a - b);

// Values with many ties, both zeros, infinities, and (as float64) neighbours one f32 cannot tell apart.
const value = fc.oneof(
  fc.constantFrom(0, -0, 1, -1, 2.5, Infinity, -Infinity, 1 + 2 ** -40, 1 + 2 ** -41, -3 - 2 ** -35),
  fc.integer({ min: -4, max: 4 }).map((i) => i / 2),
  fc.double({ min: -1e6, max: 1e6, noNaN: true }),
);

describe('the sampler at a real vocabulary (descendingOrder, topOrder)', () => {
  test.prop([fc.array(value, { maxLength: 300 }), fc.boolean()])('orders indices as the comparator sort does, f32 or float64', (vals, asF32) => {
    const v = asF32 ? Float32Array.from(vals) : vals;
    const want = comparatorOrder(v);
    expect(Array.from(descendingOrder(v))).toEqual(want);
    for (const k of [1, 2, 7, Math.floor(v.length / 3), v.length]) if (k <= v.length) expect(Array.from(topOrder(v, k))).toEqual(want.slice(0, k));
  });

  test.prop([fc.integer({ min: 1, max: 12 }).chain((n) => fc.array(fc.array(fc.oneof(value, fc.constant(NaN)), { minLength: n, maxLength: n }), { minLength: 1, maxLength: 5 }))])(
    "argmaxRows (the executors' greedy picks) is argmaxOf per row",
    (rows) => {
      const n = rows[0]!.length;
      const want = rows.map((r) => argmaxOf(Float32Array.from(r)));
      expect(argmaxRows({ dtype: 'f32', shape: [rows.length, n], data: Float32Array.from(rows.flat()) })).toEqual(want);
      // the comparison loop itself, against a plain scan of the rule
      for (const r of rows) expect(argmaxOf(r)).toBe(r.reduce((best, v, i) => (v > r[best]! ? i : best), 0));
    },
  );

  it('takes the same tokens as the comparator-sort sampler at a 32,000-token vocabulary, with every option', () => {
    const r = seededRandom(3);
    const f32 = Float32Array.from({ length: 32000 }, () => (r() * 2 - 1) * 8);
    // float64 logits after penalties, and a vocabulary of a few tied values
    const f64 = Array.from(f32, (x, i) => x + (i % 7) * 2 ** -30);
    const tied = Float32Array.from({ length: 32000 }, () => Math.floor(r() * 5));
    const options: { temperature?: number; topK?: number; topP?: number }[] = [{ temperature: 0.8, topP: 0.95 }, { temperature: 1 }, { temperature: 0.7, topK: 50 }, { temperature: 1.3, topK: 4000, topP: 0.5 }, { topK: 1 }, { topP: 0.01 }];
    for (const logits of [f32, f64, tied]) {
      for (const o of options) {
        for (const seed of [1, 2]) {
          const mine = makePicker({ ...o, seed });
          const theirs = referenceSampler({ ...o, seed });
          const a = Array.from({ length: 6 }, () => mine(logits));
          const b = Array.from({ length: 6 }, () => theirs(logits));
          expect(a, JSON.stringify(o)).toEqual(b);
        }
      }
    }
  });
});

describe('makePicker constraint (mask hook)', () => {
  /** A constraint allowing `allowed[k]` at step k; records what it accepted. */
  const stepper = (allowed: readonly (readonly number[])[]) => {
    const accepted: number[] = [];
    return {
      accepted,
      mask: () => {
        const m = new Uint32Array(2);
        for (const id of allowed[accepted.length]!) m[id >>> 5]! |= 1 << (id & 31);
        return m;
      },
      accept: (id: number) => {
        accepted.push(id);
      },
      get finished() {
        return accepted.length === allowed.length;
      },
    };
  };
  const logits = Array.from({ length: 40 }, (_, i) => (i * 7919) % 13);

  it('greedy picks the best allowed token and feeds it to the constraint', () => {
    const c = stepper([[3, 33], [0], [39, 1]]);
    const pick = makePicker({ greedy: true, constraint: c });
    expect(pickPlan(pick)).toBeUndefined();
    const ids = [pick(logits), pick(logits), pick(logits)];
    expect(ids).toEqual([logits[3]! >= logits[33]! ? 3 : 33, 0, logits[39]! >= logits[1]! ? 39 : 1]);
    expect(c.accepted).toEqual(ids);
    expect(c.finished).toBe(true);
  });

  test.prop([fc.integer({ min: 0, max: 2 ** 31 }), fc.uniqueArray(fc.integer({ min: 0, max: 39 }), { minLength: 1, maxLength: 5 })])('sampling never picks outside the mask, after bias', (seed, allowed) => {
    const c = stepper(Array.from({ length: 20 }, () => allowed));
    const pick = makePicker({ temperature: 1.5, topP: 0.9, seed, logitBias: { 7: 100 }, constraint: c });
    for (let i = 0; i < 20; i++) expect(allowed).toContain(pick(logits));
  });

  it('a mask allowing nothing is MODEL_BAD_OPTIONS', () => {
    const pick = makePicker({ greedy: true, constraint: stepper([[]]) });
    expect(() => pick(logits)).toThrow(expect.objectContaining({ code: 'MODEL_BAD_OPTIONS' }));
  });
});

describe('maskedArgmax', () => {
  // Logits with ties and infinities, masks of any density (a short mask: ids past it are not allowed).
  const logit = fc.oneof(fc.integer({ min: -3, max: 3 }), fc.constant(-Infinity), fc.constant(Infinity));
  test.prop([fc.array(logit, { minLength: 1, maxLength: 200 }), fc.array(fc.integer({ min: 0, max: 0xffffffff }), { minLength: 0, maxLength: 8 })])(
    'picks what argmaxOf picks on the masked copy, and refuses a mask that allows nothing',
    (logits, words) => {
      const mask = Uint32Array.from(words);
      let allowed = false;
      for (let id = 0; id < logits.length; id++) if ((((mask[id >>> 5] ?? 0) >>> (id & 31)) & 1) === 1) allowed = true;
      if (!allowed) {
        expect(() => maskedArgmax(logits, mask)).toThrow(/allows no token/);
        return;
      }
      const masked = maskLogits(logits, mask);
      const id = maskedArgmax(logits, mask);
      // The same id, except where every allowed logit is -Infinity: then the copy's argmax is id 0
      // whether allowed or not, and maskedArgmax the first allowed id.
      if (masked.some((v) => v > -Infinity)) expect(id).toBe(argmaxOf(masked));
      else expect(((mask[id >>> 5]! >>> (id & 31)) & 1) === 1 && masked.every((v, i) => i >= id || ((mask[i >>> 5]! >>> (i & 31)) & 1) === 0)).toBe(true);
    },
  );
  it('takes id 31 of a word (the sign bit) and ignores mask bits past the vocabulary', () => {
    const logits = new Float32Array(40).fill(0);
    logits[31] = 5;
    logits[39] = 9;
    expect(maskedArgmax(logits, Uint32Array.of(0x80000001, 0))).toBe(31);
    expect(maskedArgmax(logits.subarray(0, 33), Uint32Array.of(0, 0xffffffff))).toBe(32);
  });
});
