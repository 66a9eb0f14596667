import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type Graph, seededRandom } from '@stageml/ir';
import { LLAMA_PROJECTIONS, argmaxOf, type LlamaShape, parseLlamaConfig } from '@stageml/models';
import { type Executor, createCpuNativeExecutor, createOrtExecutor, interpreterExecutor, isOrtAvailable, parseWeightQuantSpec } from '@stageml/runtime';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Engine, writeRandomAdapter } from './index.js';
import { stagedReference } from './test-support.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/llama/', import.meta.url));
const tmp = mkdtempSync(join(tmpdir(), 'stageml-engine-'));
const config = parseLlamaConfig(readFileSync(`${root}base/config.json`, 'utf8'), 'config.json');
const shape: LlamaShape = config;
afterAll(() => {
  rmSync(tmp, { recursive: true, force: true });
});

/** Counts `prepare` calls of an executor. */
function counting(inner: Executor): { executor: Executor; prepared: () => number } {
  let n = 0;
  return {
    executor: {
      name: inner.name,
      capabilities: inner.capabilities,
      dispose: () => inner.dispose(),
      prepare: (g, w) => {
        n++;
        return inner.prepare(g, w);
      },
    },
    prepared: () => n,
  };
}

function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  expect(a.length).toBe(b.length);
  let d = 0;
  for (let i = 0; i < a.length; i++) d = Math.max(d, Math.abs(a[i]! - b[i]!));
  return d;
}

const PROMPTS = [
  [1, 52, 317, 335, 262, 438, 309, 487],
  [1, 54, 264, 479, 455],
  [1, 500, 72, 283, 10, 90, 11, 4, 77, 21, 5],
  [1, 9],
];

const token = (p: number) => 7 + p;

describe('Engine: adapters as data', () => {
  const names: string[] = [];
  let engine: Engine;
  let count: () => number;
  // Reference: each (adapter, prompt) run alone on the adapter's own staged graph (no slots): the
  // prompt's last logits, and those of prompt + one token (what one decode step must give).
  const ref = new Map<string, { prefill: Float32Array; decode: Float32Array }>();

  beforeAll(async () => {
    const rand = seededRandom(16);
    for (let i = 0; i < 32; i++) {
      const rank = 4 + Math.floor(rand() * 61);
      const targets = LLAMA_PROJECTIONS.filter(() => rand() < 0.6);
      const name = `a${String(i)}-r${String(rank)}`;
      await writeRandomAdapter(join(tmp, name), shape, { rank, targets: (targets.length === 0 ? ['q_proj'] : targets), seed: 100 + i });
      names.push(name);
    }
    const inner = (await isOrtAvailable()) ? await createOrtExecutor({ intraOpNumThreads: 1 }) : interpreterExecutor;
    const c = counting(inner);
    count = c.prepared;
    engine = await Engine.load(`${root}base`, { executor: c.executor, maxLoras: 32, maxLoraRank: 64, prefillChunk: 4 });
    for (const n of names) await engine.loadAdapter(join(tmp, n), n);
    for (const a of [undefined, ...names]) {
      const lm = await stagedReference(`${root}base`, { adapter: a === undefined ? undefined : join(tmp, a) });
      for (let p = 0; p < PROMPTS.length; p++) {
        ref.set(`${a ?? ''}|${String(p)}`, { prefill: await lm.last(PROMPTS[p]!), decode: await lm.last([...PROMPTS[p]!, token(p)]) });
      }
      lm.dispose();
    }
  }, 300_000);

  it('1,000 random batch compositions over 32 adapters (ranks 4–64) and base rows: four preparations, each row equal to its adapter run alone', async () => {
    // The constant: one preparation per slot form (gathered, grouped, single) and the base program, made at load.
    expect(count()).toBe(4);
    const rand = seededRandom(2026);
    let worst = 0;
    const seen = new Set<string>();
    for (let c = 0; c < 1000; c++) {
      const rows = 1 + Math.floor(rand() * 6);
      const picks = Array.from({ length: rows }, () => ({ a: rand() < 0.15 ? undefined : names[Math.floor(rand() * names.length)], p: Math.floor(rand() * PROMPTS.length) }));
      seen.add(picks.map((x) => x.a ?? '').sort().join(','));
      const seqs = picks.map((x) => engine.open(x.a, PROMPTS[x.p]!));
      for (const [i, s] of seqs.entries()) {
        expect(await engine.attach(s)).toBe(true);
        let logits: Float32Array | undefined;
        while (!s.ready) logits = await engine.prefill(s);
        worst = Math.max(worst, maxAbsDiff(logits!, ref.get(`${picks[i]!.a ?? ''}|${String(picks[i]!.p)}`)!.prefill));
      }
      const out = await engine.decode(seqs, picks.map((x) => token(x.p)));
      out.forEach((logits, i) => {
        worst = Math.max(worst, maxAbsDiff(logits, ref.get(`${picks[i]!.a ?? ''}|${String(picks[i]!.p)}`)!.decode));
      });
      for (const s of seqs) engine.release(s);
    }
    // Distinct adapter multisets (single-row batches repeat; the rest almost never do).
    expect(seen.size).toBeGreaterThan(700);
    expect(worst).toBeLessThan(1e-4);
    // Still four (three slot forms and the base program), whatever the compositions; every form served steps.
    expect(count()).toBe(4);
    expect(engine.stats().preparations).toBe(4);
    expect(engine.stats().runsByForm.single).toBeGreaterThan(50);
    expect(engine.stats().runsByForm.base).toBeGreaterThan(0);
    expect(engine.stats().runsByForm.gathered).toBeGreaterThan(50);
    expect(engine.stats().runsByForm.grouped).toBeGreaterThan(50);
    expect(engine.memory().kv).toBe(0);
  }, 300_000);

  it('packBase: base-only batches run a program holding its own copy of the weights, equal to the shared-input path; bad values refused', async () => {
    const inner = (await isOrtAvailable()) ? await createOrtExecutor({ intraOpNumThreads: 1 }) : interpreterExecutor;
    const c = counting(inner);
    const packed = await Engine.load(`${root}base`, { executor: c.executor, maxLoras: 2, maxLoraRank: 64, prefillChunk: 4, packBase: true });
    const plain = await Engine.load(`${root}base`, { executor: inner, maxLoras: 2, maxLoraRank: 64, prefillChunk: 4 });
    expect(c.prepared()).toBe(4);
    // Two copies of the f32 weights: the shared host copy the slot programs read and the base program's own.
    expect(packed.memory().weights).toBe(2 * plain.memory().weights);
    await packed.loadAdapter(join(tmp, names[0]!), names[0]);
    let worst = 0;
    for (const a of [undefined, names[0]!, undefined]) {
      const seqs = PROMPTS.map((p) => packed.open(a, p));
      for (const [p, s] of seqs.entries()) {
        await packed.attach(s);
        let logits: Float32Array | undefined;
        while (!s.ready) logits = await packed.prefill(s);
        worst = Math.max(worst, maxAbsDiff(logits!, ref.get(`${a ?? ''}|${String(p)}`)!.prefill));
      }
      const out = await packed.decode(seqs, PROMPTS.map((_, p) => token(p)));
      out.forEach((logits, p) => {
        worst = Math.max(worst, maxAbsDiff(logits, ref.get(`${a ?? ''}|${String(p)}`)!.decode));
      });
      for (const s of seqs) packed.release(s);
    }
    expect(worst).toBeLessThan(1e-4);
    expect(packed.stats().runsByForm.base).toBeGreaterThan(0);
    expect(packed.stats().runsByForm.single).toBeGreaterThan(0);
    expect(packed.stats().preparations).toBe(4);
    // f32 weights: 'program' skips the base program unless packBase asks for it (one more copy).
    const program = await Engine.load(`${root}base`, { executor: inner, maxLoras: 2, weights: 'program', slotForm: 'gathered' });
    const programPacked = await Engine.load(`${root}base`, { executor: inner, maxLoras: 2, weights: 'program', slotForm: 'gathered', packBase: true });
    expect(program.stats().preparations).toBe(1);
    expect(programPacked.stats().preparations).toBe(2);
    expect(programPacked.memory().weights).toBe(2 * program.memory().weights);
    await expect(Engine.load(`${root}base`, { packBase: 'yes' as unknown as boolean })).rejects.toMatchObject({ code: 'ENGINE_BAD_OPTIONS', message: expect.stringContaining('packBase') as unknown });
    for (const e of [packed, plain, program, programPacked]) e.dispose();
  }, 120_000);
});

describe('Engine: batched prefill', () => {
  it('prefills mixed adapters, lengths, padding and chunk positions in one run per step, equal to one at a time', async () => {
    for (const [i, r] of [4, 16].entries()) await writeRandomAdapter(join(tmp, `pf${String(i)}`), shape, { rank: r, seed: 300 + i });
    const load = async () => {
      const e = await Engine.load(`${root}base`, { executor: await createOrtExecutor({ intraOpNumThreads: 1 }), maxLoras: 3, prefillChunk: 3 });
      for (const i of [0, 1]) await e.loadAdapter(join(tmp, `pf${String(i)}`), `pf${String(i)}`);
      return e;
    };
    const cases: { a: string | undefined; prompt: number[]; mask?: number[] }[] = [
      { a: 'pf0', prompt: PROMPTS[0]! },
      { a: undefined, prompt: PROMPTS[1]! },
      { a: 'pf1', prompt: PROMPTS[2]!, mask: PROMPTS[2]!.map((_, i) => (i < 2 ? 0 : 1)) },
      { a: 'pf0', prompt: PROMPTS[3]! },
    ];
    // Reference: each sequence prefilled alone, then two decode tokens alone.
    const alone = await load();
    const want: Float32Array[][] = [];
    for (const c of cases) {
      const s = alone.open(c.a, c.prompt, c.mask);
      expect(await alone.attach(s)).toBe(true);
      let logits: Float32Array | undefined;
      while (!s.ready) logits = await alone.prefill(s);
      const d1 = (await alone.decode([s], [token(1)]))[0]!;
      const d2 = (await alone.decode([s], [token(2)]))[0]!;
      want.push([Float32Array.from(logits!), Float32Array.from(d1), Float32Array.from(d2)]);
      alone.release(s);
    }
    // Batched: every step prefills the next chunk of every unfinished prompt in one run (rows at
    // different positions of their prompts, left-padded to the longest chunk).
    const engine = await load();
    const seqs = cases.map((c) => engine.open(c.a, c.prompt, c.mask));
    for (const s of seqs) expect(await engine.attach(s)).toBe(true);
    const got: (Float32Array | undefined)[] = cases.map(() => undefined);
    // Stagger: the first sequence takes one chunk alone, so later steps mix rows with different pasts.
    got[0] = (await engine.prefillMany([seqs[0]!]))[0];
    const runs0 = engine.stats().runs;
    let steps = 0;
    while (seqs.some((s) => !s.ready)) {
      const pending = seqs.filter((s) => !s.ready);
      const out = await engine.prefillMany(pending);
      pending.forEach((s, j) => {
        if (out[j] !== undefined) got[seqs.indexOf(s)] = Float32Array.from(out[j]);
      });
      steps++;
    }
    expect(engine.stats().runs - runs0).toBe(steps);
    expect(steps).toBe(4); // the longest prompt (11 tokens, chunks of 3) takes four runs
    const d1 = await engine.decode(seqs, seqs.map(() => token(1)));
    const d2 = await engine.decode(seqs, seqs.map(() => token(2)));
    cases.forEach((c, i) => {
      expect(maxAbsDiff(got[i]!, want[i]![0]!), `prefill ${String(i)}`).toBeLessThan(1e-4);
      expect(maxAbsDiff(d1[i]!, want[i]![1]!), `decode 1 ${String(i)}`).toBeLessThan(1e-4);
      expect(maxAbsDiff(d2[i]!, want[i]![2]!), `decode 2 ${String(i)}`).toBeLessThan(1e-4);
    });
    expect(seqs.map((s) => s.kv.length)).toEqual(cases.map((c) => c.prompt.length + 2));
    await expect(engine.prefillMany([seqs[0]!])).rejects.toMatchObject({ code: 'ENGINE_BAD_SEQUENCE' });
    for (const s of seqs) engine.release(s);
  });
});

describe('Engine: dispose', () => {
  it('releases its programs and live sequences; later steps are ENGINE_BAD_OPTIONS; idempotent', async () => {
    const disposed: string[] = [];
    const inner = await createOrtExecutor({ intraOpNumThreads: 1 });
    const executor: Executor = {
      name: inner.name,
      capabilities: inner.capabilities,
      dispose: () => inner.dispose(),
      prepare: async (g, w) => {
        const p = await inner.prepare(g, w);
        return { executor: p.executor, run: (i, o) => p.run(i, o), dispose: () => { disposed.push(g.name); p.dispose(); } };
      },
    };
    const engine = await Engine.load(`${root}base`, { executor });
    const s = engine.open(undefined, PROMPTS[1]!);
    expect(await engine.attach(s)).toBe(true);
    while (!s.ready) await engine.prefill(s);
    engine.dispose();
    engine.dispose();
    expect(disposed).toHaveLength(4);
    expect(engine.stats().sequences).toBe(0);
    expect(engine.memory().kv).toBe(0);
    const t = engine.open(undefined, PROMPTS[1]!);
    expect(await engine.attach(t)).toBe(true);
    await expect(engine.prefill(t)).rejects.toMatchObject({ code: 'ENGINE_BAD_OPTIONS' });
    await expect(engine.promptLogits(undefined, PROMPTS[1]!)).rejects.toMatchObject({ code: 'ENGINE_BAD_OPTIONS' });
  });
});

describe('Engine: prompt scoring in chunks (issue 39 item 2)', () => {
  it('scores a prompt in chunks over the earlier chunks\' keys and values, equal to one run, yielding between chunks', async () => {
    await writeRandomAdapter(join(tmp, 'score'), shape, { rank: 4, seed: 77 });
    const engine = await Engine.load(`${root}base`);
    await engine.loadAdapter(join(tmp, 'score'), 'score');
    const prompt = Array.from({ length: 41 }, (_, i) => (i * 37 + 5) % config.vocabSize);
    for (const adapter of [undefined, 'score']) {
      // One run (the default chunk is larger than the prompt).
      const whole = await engine.promptLogits(adapter, prompt);
      const chunks: { start: number; logits: Float32Array }[] = [];
      let ticks = 0;
      const tick = setInterval(() => {
        ticks++;
      }, 0);
      for await (const c of engine.promptLogitChunks(adapter, prompt, undefined, { chunk: 8 })) chunks.push({ start: c.start, logits: c.logits.slice() });
      clearInterval(tick);
      expect(chunks.map((c) => c.start)).toEqual([0, 8, 16, 24, 32, 40]);
      const gathered = new Float32Array(prompt.length * config.vocabSize);
      for (const c of chunks) gathered.set(c.logits, c.start * config.vocabSize);
      expect(maxAbsDiff(gathered, whole.data)).toBeLessThan(1e-4);
      expect(ticks).toBeGreaterThan(0);
    }
    expect(engine.stats().sequences).toBe(0);
    engine.dispose();
  });
});

describe('Engine: decode staging kept across steps', () => {
  it('three rows decoded together for 70 steps (past a staging block) equal each decoded alone', async () => {
    for (const [i, r] of [4, 16].entries()) await writeRandomAdapter(join(tmp, `ds${String(i)}`), shape, { rank: r, seed: 400 + i });
    const load = async () => {
      const e = await Engine.load(`${root}base`, { executor: await createOrtExecutor({ intraOpNumThreads: 1 }), maxLoras: 3 });
      for (const i of [0, 1]) await e.loadAdapter(join(tmp, `ds${String(i)}`), `ds${String(i)}`);
      return e;
    };
    const cases = [{ a: 'ds0', prompt: PROMPTS[0]! }, { a: undefined, prompt: PROMPTS[1]! }, { a: 'ds1', prompt: PROMPTS[3]! }];
    const feed = (step: number, row: number) => 3 + ((step * 13 + row * 7) % 400);
    const STEPS = 70;
    const alone = await load();
    const want: Float32Array[][] = [];
    for (const [row, c] of cases.entries()) {
      const s = alone.open(c.a, c.prompt);
      expect(await alone.attach(s)).toBe(true);
      while (!s.ready) await alone.prefill(s);
      const out: Float32Array[] = [];
      for (let t = 0; t < STEPS; t++) out.push(Float32Array.from((await alone.decode([s], [feed(t, row)]))[0]!));
      want.push(out);
      alone.release(s);
    }
    const engine = await load();
    const seqs = cases.map((c) => engine.open(c.a, c.prompt));
    for (const s of seqs) expect(await engine.attach(s)).toBe(true);
    await engine.prefillMany(seqs);
    let worst = 0;
    for (let t = 0; t < STEPS; t++) {
      const out = await engine.decode(seqs, seqs.map((_, row) => feed(t, row)));
      out.forEach((l, row) => {
        worst = Math.max(worst, maxAbsDiff(l, want[row]![t]!));
      });
    }
    expect(worst).toBeLessThan(1e-4);
    for (const s of seqs) engine.release(s);
  });
});

describe('Engine: MoE expert LoRA in slots; adapters that cannot vary by row in lanes', () => {
  const fixtures = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
  const golden = JSON.parse(readFileSync(`${fixtures}golden.json`, 'utf8')) as Record<string, Record<string, { input_ids: number[]; greedy_new_ids: number[] }>>;
  const MIXTRAL = ['base', 'attn-r8', 'experts-r4'];

  /** Greedy goldens mask the pad id 0 (HF generate with pad_token_id = 0): prompt `p` of every model decoded in one mixed batch, each equal to its golden. */
  async function mixedGreedyGoldens(engine: Engine, p: number): Promise<void> {
    const seqs = MIXTRAL.map((m) => {
      const ids = golden[`mixtral.${m}`]![`prompt${String(p)}`]!.input_ids;
      return engine.open(m === 'base' ? undefined : m, ids, ids.map((t) => (t === 0 ? 0 : 1)));
    });
    const last: number[] = [];
    const out: number[][] = MIXTRAL.map(() => []);
    for (const [i, s] of seqs.entries()) {
      expect(await engine.attach(s)).toBe(true);
      let logits: Float32Array | undefined;
      while (!s.ready) logits = await engine.prefill(s);
      out[i]!.push((last[i] = argmaxOf(logits!)));
    }
    for (let k = 0; k < 11; k++) (await engine.decode(seqs, last)).forEach((l, i) => out[i]!.push((last[i] = argmaxOf(l))));
    MIXTRAL.forEach((m, i) => {
      expect(out[i], `${m} prompt${String(p)}`).toEqual(golden[`mixtral.${m}`]![`prompt${String(p)}`]!.greedy_new_ids);
    });
    for (const s of seqs) engine.release(s);
  }

  it('Mixtral: attn-r8, experts-r4 and base rows in one mixed batch each equal their goldens (logits and 12 greedy tokens)', async () => {
    const { SafetensorsFile } = await import('@stageml/safetensors');
    const f = await SafetensorsFile.open(`${fixtures}golden.safetensors`);
    const engine = await Engine.load(`${fixtures}mixtral/base`, { maxLoras: 2, prefillChunk: 3 });
    for (const a of ['attn-r8', 'experts-r4']) await engine.loadAdapter(`${fixtures}mixtral/adapters/${a}`, a);
    const models = ['base', 'attn-r8', 'experts-r4'];
    const V = engine.config.vocabSize;
    for (let p = 0; p < 4; p++) {
      // Logits goldens are of unmasked prompts (HF forward without a mask): last position, within 1e-4.
      for (const m of models) {
        const s = engine.open(m === 'base' ? undefined : m, golden[`mixtral.${m}`]![`prompt${String(p)}`]!.input_ids);
        expect(await engine.attach(s)).toBe(true);
        let logits: Float32Array | undefined;
        while (!s.ready) logits = await engine.prefill(s);
        const want = (await f.readTensor(`mixtral.${m}.prompt${String(p)}.logits`)).data;
        expect(maxAbsDiff(logits!, want.subarray(want.length - V)), `${m} prompt${String(p)}`).toBeLessThanOrEqual(1e-4);
        engine.release(s);
      }
      await mixedGreedyGoldens(engine, p);
    }
    await f.close();
    // Expert factors live in the expert slot tables: the slot programs (and the base program for
    // base-only batches) serve everything, each mixed decode step is one run, and nothing needs a lane.
    expect(engine.stats().preparations).toBe(4);
    expect(engine.memory().lanes).toBe(0);
    const runs = engine.stats().runs;
    const mixed = models.map((m) => engine.open(m === 'base' ? undefined : m, [1, 5, 9]));
    for (const s of mixed) {
      expect(await engine.attach(s)).toBe(true);
      while (!s.ready) await engine.prefill(s);
    }
    const afterPrefill = engine.stats().runs;
    await engine.decode(mixed, [3, 3, 3]);
    expect(engine.stats().runs - afterPrefill).toBe(1);
    expect(afterPrefill - runs).toBe(3);
    for (const s of mixed) engine.release(s);
    const withExperts = engine.memory().slotFactors;
    engine.unloadAdapter('experts-r4');
    expect(engine.memory().slotFactors).toBeLessThan(withExperts);
    expect(engine.slotsAreClear()).toBe(true);
  });

  it('Mixtral on onnxruntime: attn-r8, experts-r4 and base decoded in shared batches give their greedy goldens', async () => {
    const engine = await Engine.load(`${fixtures}mixtral/base`, { maxLoras: 2, executor: await createOrtExecutor({}) });
    for (const a of ['attn-r8', 'experts-r4']) await engine.loadAdapter(`${fixtures}mixtral/adapters/${a}`, a);
    for (let p = 0; p < 4; p++) await mixedGreedyGoldens(engine, p);
    expect(engine.stats().preparations).toBe(4);
  });

  it('Mixtral on cpu-native (topk, groupedMatmul and scatterAdd kernels): attn-r8, experts-r4 and base decoded in shared batches give their greedy goldens', async () => {
    const engine = await Engine.load(`${fixtures}mixtral/base`, { maxLoras: 2, executor: createCpuNativeExecutor({ threads: 2 }) });
    for (const a of ['attn-r8', 'experts-r4']) await engine.loadAdapter(`${fixtures}mixtral/adapters/${a}`, a);
    for (let p = 0; p < 4; p++) await mixedGreedyGoldens(engine, p);
    engine.dispose();
  });

  it('Mixtral int8 on cpu-native (quantized router and attention, f32 experts) equals the interpreter quantized the same way', async () => {
    const quantize = parseWeightQuantSpec('int8');
    const load = async (executor: Executor): Promise<Engine> => {
      const e = await Engine.load(`${fixtures}mixtral/base`, { maxLoras: 1, executor, quantize });
      await e.loadAdapter(`${fixtures}mixtral/adapters/experts-r4`, 'experts-r4');
      return e;
    };
    const [native, ref] = [await load(createCpuNativeExecutor({ threads: 2 })), await load(interpreterExecutor)];
    const ids = golden['mixtral.base']!['prompt1']!.input_ids;
    const last = async (e: Engine, a: string | undefined): Promise<Float32Array> => {
      const s = e.open(a, ids);
      expect(await e.attach(s)).toBe(true);
      let logits: Float32Array | undefined;
      while (!s.ready) logits = await e.prefill(s);
      e.release(s);
      return logits!;
    };
    for (const a of [undefined, 'experts-r4']) {
      const got = await last(native, a);
      const want = await last(ref, a);
      // cpu-native rounds the quantized linears' activations to int8 too (per 32 inputs).
      let worst = 0;
      for (let i = 0; i < want.length; i++) worst = Math.max(worst, Math.abs(got[i]! - want[i]!) / (1 + Math.abs(want[i]!)));
      expect(worst, String(a)).toBeLessThan(2e-2);
      expect(argmaxOf(got), String(a)).toBe(argmaxOf(want));
    }
    native.dispose();
    ref.dispose();
  });

  it('a whole-tensor-override adapter (modules_to_save lm_head) mixed with other adapters: every row equals its adapter alone', async () => {
    await writeRandomAdapter(join(tmp, 'override'), shape, { rank: 8, targets: ['q_proj', 'down_proj'], overrideLmHead: true, seed: 5 });
    await writeRandomAdapter(join(tmp, 'plain'), shape, { rank: 12, seed: 6 });
    const engine = await Engine.load(`${root}base`, { maxLoras: 2 });
    for (const n of ['override', 'plain']) await engine.loadAdapter(join(tmp, n), n);
    expect(engine.stats().preparations).toBe(4);
    const picks = [{ a: 'override', p: 0 }, { a: undefined, p: 1 }, { a: 'plain', p: 2 }, { a: 'override', p: 3 }];
    const seqs = picks.map((x) => engine.open(x.a, PROMPTS[x.p]!));
    for (const s of seqs) {
      await engine.attach(s);
      while (!s.ready) await engine.prefill(s);
    }
    const out = await engine.decode(seqs, picks.map((x) => token(x.p)));
    for (const [i, x] of picks.entries()) {
      const lm = await stagedReference(`${root}base`, { adapter: x.a === undefined ? undefined : join(tmp, x.a) });
      expect(maxAbsDiff(out[i]!, await lm.last([...PROMPTS[x.p]!, token(x.p)])), `${x.a ?? 'base'} row ${String(i)}`).toBeLessThan(1e-4);
      lm.dispose();
    }
    expect(engine.memory().lanes).toBe(shape.vocabSize * shape.hiddenSize * 4);
    for (const s of seqs) engine.release(s);
  });

  it('serves lm_head modules_to_save on a tied model in a lane; an engine without lanes refuses it, naming it, and stays as it was', async () => {
    const tied = join(tmp, 'tied');
    const { writeRandomLlama } = await import('./index.js');
    await writeRandomLlama(tied, { ...shape, numLayers: 1, tieWordEmbeddings: true });
    await writeRandomAdapter(join(tmp, 'head-on-tied'), { ...shape, numLayers: 1 }, { rank: 4, targets: ['q_proj'], overrideLmHead: true });
    const served = await Engine.load(tied, { maxLoras: 2 });
    await served.loadAdapter(join(tmp, 'head-on-tied'), 'x');
    expect(served.adapterNames).toEqual(['x']);
    expect(served.memory().lanes).toBeGreaterThan(0);
    const engine = await Engine.load(tied, { maxLoras: 2, weights: 'program' });
    const before = engine.memory();
    await expect(engine.loadAdapter(join(tmp, 'head-on-tied'), 'x')).rejects.toMatchObject({ code: 'ENGINE_BAD_ADAPTER', message: expect.stringContaining('lm_head.weight') as string });
    expect(engine.adapterNames).toEqual([]);
    expect(engine.memory()).toEqual(before);
  });
});

describe('Engine: plans applied', () => {
  const ADAPTERS = ['all-r16', 'mlp-r4-rslora', 'o-r2', 'qv-r8'];
  // Each adapter's (and the base's) decode logits after each prompt, from its own staged graph.
  const want = new Map<string, Float32Array>();
  beforeAll(async () => {
    for (const [i, a] of [...ADAPTERS, undefined].entries()) {
      const lm = await stagedReference(`${root}base`, { adapter: a === undefined ? undefined : `${root}adapters/${a}` });
      const p = i % PROMPTS.length;
      want.set(a ?? '', await lm.last([...PROMPTS[p]!, token(p)]));
      lm.dispose();
    }
  }, 120_000);

  async function mixedStepMatches(engine: Engine): Promise<void> {
    const picks = [...ADAPTERS, undefined].map((a, i) => ({ a, p: i % PROMPTS.length }));
    const seqs = picks.map((x) => engine.open(x.a, PROMPTS[x.p]!));
    for (const s of seqs) {
      expect(await engine.attach(s)).toBe(true);
      while (!s.ready) await engine.prefill(s);
    }
    const out = await engine.decode(seqs, picks.map((x) => token(x.p)));
    for (const [i, x] of picks.entries()) expect(maxAbsDiff(out[i]!, want.get(x.a ?? '')!), x.a ?? 'base').toBeLessThan(1e-4);
    for (const s of seqs) engine.release(s);
  }

  it('merges everything under an ample budget, nothing under a zero budget; results equal each adapter alone either way', async () => {
    const ample = await Engine.load(`${root}base`, { maxLoras: 4, memoryBudget: 1e12 });
    for (const a of ADAPTERS) await ample.loadAdapter(`${root}adapters/${a}`, a);
    await mixedStepMatches(ample);
    const merged = ample.plan().merged;
    expect(Object.keys(merged).sort()).toEqual([...ADAPTERS].sort());
    expect(merged['qv-r8']).toHaveLength(4);
    expect(ample.memory().lanes).toBeGreaterThan(0);
    expect(ample.plan().plan?.format).toBe('stageml.plan');
    expect(ample.stats().preparations).toBe(4);

    const none = await Engine.load(`${root}base`, { maxLoras: 4, memoryBudget: 0 });
    for (const a of ADAPTERS) await none.loadAdapter(`${root}adapters/${a}`, a);
    await mixedStepMatches(none);
    expect(none.plan().merged).toEqual({});
    expect(none.memory().lanes).toBe(0);
  });

  it('recycleOutputs on cpu-native: a step over several lanes returns every lane\'s own logits (one call never reuses its own runs\' storage)', async () => {
    const native = createCpuNativeExecutor({ threads: 2 });
    const engine = await Engine.load(`${root}base`, { executor: native, maxLoras: 4, memoryBudget: 1e12, recycleOutputs: true });
    for (const a of ADAPTERS) await engine.loadAdapter(`${root}adapters/${a}`, a);
    await mixedStepMatches(engine);
    await mixedStepMatches(engine);
    expect(Object.keys(engine.plan().merged).length).toBeGreaterThan(1);
    engine.dispose();
  });

  it('spends a tight budget on the adapter with the traffic, re-plans on unload, swapping between steps', async () => {
    // q_proj (64×64) and v_proj (32×64) of both layers: the bytes of merging qv-r8 whole.
    const budget = 2 * (64 * 64 + 32 * 64) * 4;
    const engine = await Engine.load(`${root}base`, { maxLoras: 4, memoryBudget: budget });
    for (const a of ADAPTERS) await engine.loadAdapter(`${root}adapters/${a}`, a);
    for (let i = 0; i < 50; i++) engine.release(engine.open('qv-r8', PROMPTS[0]!));
    engine.release(engine.open('o-r2', PROMPTS[1]!));
    engine.replan();
    await mixedStepMatches(engine);
    expect(engine.plan().merged).toEqual({ 'qv-r8': ['model.layers.0.self_attn.q_proj', 'model.layers.0.self_attn.v_proj', 'model.layers.1.self_attn.q_proj', 'model.layers.1.self_attn.v_proj'] });
    expect(engine.memory().lanes).toBe(budget);
    const applied = engine.plan().applied;
    // A sequence in flight on qv-r8 keeps decoding, with the same tokens, across the re-plan.
    const s = engine.open('qv-r8', PROMPTS[2]!);
    await engine.attach(s);
    while (!s.ready) await engine.prefill(s);
    engine.unloadAdapter('all-r16');
    const [after] = await engine.decode([s], [token(2)]);
    expect(engine.plan().applied).toBe(applied + 1);
    const lm = await stagedReference(`${root}base`, { adapter: `${root}adapters/qv-r8` });
    expect(maxAbsDiff(after!, await lm.last([...PROMPTS[2]!, token(2)]))).toBeLessThan(1e-4);
    lm.dispose();
    engine.release(s);
    expect(Object.keys(engine.plan().merged)).not.toContain('all-r16');
  });

  it('applies a fixed plan as written (never re-planned) and refuses a plan that does not fit', async () => {
    const planned = await Engine.load(`${root}base`, { maxLoras: 4, memoryBudget: 2 * (64 * 64 + 32 * 64) * 4 });
    for (const a of ADAPTERS) await planned.loadAdapter(`${root}adapters/${a}`, a);
    await mixedStepMatches(planned);
    const plan = planned.plan().plan!;
    const fixed = await Engine.load(`${root}base`, { maxLoras: 4, plan, replanEvery: 1 });
    for (const a of ADAPTERS) await fixed.loadAdapter(`${root}adapters/${a}`, a);
    expect(fixed.plan().plan).toEqual(plan);
    expect(fixed.plan().memoryBudget).toBeUndefined();
    for (let i = 0; i < 20; i++) fixed.release(fixed.open('o-r2', PROMPTS[1]!));
    fixed.replan();
    await mixedStepMatches(fixed);
    await mixedStepMatches(fixed);
    expect(fixed.plan().merged).toEqual(planned.plan().merged);
    expect(fixed.plan().applied).toBe(1);

    await expect(Engine.load(`${root}base`, { plan, memoryBudget: 1 })).rejects.toMatchObject({ code: 'ENGINE_BAD_OPTIONS' });
    await expect(Engine.load(`${root}base`, { plan: { ...plan, units: 'none' } as unknown as typeof plan })).rejects.toMatchObject({ code: 'PLAN_BAD_DOCUMENT' });
    // A merged unit on a layer its adapter does not have (the model has 2): refused at load, nothing registered.
    const i = plan.units.findIndex((u) => u.kind === 'materialize');
    expect(i).toBeGreaterThanOrEqual(0);
    const target = plan.units[i]!.adapter;
    const wrong = { ...plan, units: plan.units.map((u, j) => (j === i ? { ...u, layer: 99 } : u)) };
    const refusing = await Engine.load(`${root}base`, { maxLoras: 4, plan: wrong });
    await expect(refusing.loadAdapter(`${root}adapters/${target}`, target)).rejects.toMatchObject({ code: 'ENGINE_BAD_OPTIONS' });
    expect(refusing.adapterNames).toEqual([]);
  });
});

const ORT_HERE = await isOrtAvailable();

describe('Engine with quantized weights', () => {
  it.skipIf(!ORT_HERE)('packs int8/int4 weights once and equals the staged graph quantized the same way (last-position logits, with an adapter)', async () => {
    const executor = await createOrtExecutor();
    const prompt = [0, 52, 317, 44, 9];
    for (const spec of ['int8', 'int4']) {
      const quantize = parseWeightQuantSpec(spec);
      const graphs: Graph[] = [];
      const engine = await Engine.load(`${root}base`, { executor: { name: executor.name, capabilities: executor.capabilities, dispose: () => executor.dispose(), prepare: (g, w) => (graphs.push(g), executor.prepare(g, w)) }, quantize, maxLoras: 2, maxLoraRank: 16 });
      // Four programs (the three slot forms and base); each packs the linears as its own parameters
      // and reads the unquantized f32 tensors (embeddings, norms) as inputs of one shared host copy.
      expect(graphs).toHaveLength(4);
      for (const g of graphs) {
        const kinds = new Map(g.nodes.filter((n) => n.kind !== 'op').map((n) => [n.name, n.kind]));
        expect(kinds.get('model.embed_tokens.weight')).toBe('input');
        expect(kinds.get('model.norm.weight')).toBe('input');
        expect(kinds.get('model.layers.0.self_attn.q_proj.weight.qweight')).toBe('param');
      }
      await engine.loadAdapter(`${root}adapters/qv-r8`, 'qv-r8');
      const refs = new Map<string, Awaited<ReturnType<typeof stagedReference>>>();
      for (const a of ['', 'qv-r8', 'o-r2']) refs.set(a, await stagedReference(`${root}base`, { adapter: a === '' ? undefined : `${root}adapters/${a}`, executor, quantize }));
      for (const a of [undefined, 'qv-r8']) {
        const s = engine.open(a, prompt);
        expect(await engine.attach(s)).toBe(true);
        let logits: Float32Array | undefined;
        while (!s.ready) logits = await engine.prefill(s);
        engine.release(s);
        expect(maxAbsDiff(logits!, await refs.get(a ?? '')!.last(prompt))).toBeLessThan(1e-4);
      }
      // Two adapters decoded together (the grouped or gathered form) equal each alone.
      await engine.loadAdapter(`${root}adapters/o-r2`, 'o-r2');
      const pair = [engine.open('o-r2', prompt), engine.open('qv-r8', prompt)];
      for (const s of pair) {
        await engine.attach(s);
        while (!s.ready) await engine.prefill(s);
      }
      const both = await engine.decode(pair, [7, 7]);
      for (const s of pair) engine.release(s);
      for (const [i, a] of ['o-r2', 'qv-r8'].entries()) expect(maxAbsDiff(both[i]!, await refs.get(a)!.last([...prompt, 7]))).toBeLessThan(1e-4);
      for (const r of refs.values()) r.dispose();
      expect(engine.stats().runsByForm.single + engine.stats().runsByForm.base).toBeGreaterThan(0);
      expect(engine.stats().runsByForm.gathered + engine.stats().runsByForm.grouped).toBe(1);
      // Quantized weights are smaller than the f32 checkpoint in the engine's own accounting.
      const f32 = await Engine.load(`${root}base`, { executor, maxLoras: 2, maxLoraRank: 16 });
      expect(engine.memory().weights).toBeLessThan(f32.memory().weights);
      await expect(Engine.load(`${root}base`, { executor, quantize, memoryBudget: 1e9 })).rejects.toMatchObject({ code: 'ENGINE_BAD_OPTIONS' });
    }
  });
});

describe('Engine on the cpu-native executor', () => {
  const prompt = [0, 52, 317, 44, 9];
  async function lastLogits(engine: Engine, adapter: string | undefined): Promise<Float32Array> {
    const s = engine.open(adapter, prompt);
    expect(await engine.attach(s)).toBe(true);
    let logits: Float32Array | undefined;
    while (!s.ready) logits = await engine.prefill(s);
    engine.release(s);
    return logits!;
  }

  it('equals the interpreter in f32 (prefill with and without an adapter; a mixed decode equals each row alone), and int8/int4 equal the staged graph quantized the same way on it', async () => {
    const native = createCpuNativeExecutor({ threads: 2 });
    const engine = await Engine.load(`${root}base`, { executor: native, maxLoras: 2, maxLoraRank: 16 });
    for (const a of ['qv-r8', 'o-r2']) await engine.loadAdapter(`${root}adapters/${a}`, a);
    const ref = new Map<string, Awaited<ReturnType<typeof stagedReference>>>();
    for (const a of ['', 'qv-r8', 'o-r2']) ref.set(a, await stagedReference(`${root}base`, { adapter: a === '' ? undefined : `${root}adapters/${a}`, executor: interpreterExecutor }));
    for (const a of [undefined, 'qv-r8']) expect(maxAbsDiff(await lastLogits(engine, a), await ref.get(a ?? '')!.last(prompt)), String(a)).toBeLessThan(1e-4);
    const pair = [engine.open('o-r2', prompt), engine.open('qv-r8', prompt), engine.open(undefined, prompt)];
    for (const s of pair) {
      await engine.attach(s);
      while (!s.ready) await engine.prefill(s);
    }
    const both = await engine.decode(pair, [7, 7, 7]);
    for (const s of pair) engine.release(s);
    for (const [i, a] of ['o-r2', 'qv-r8', undefined].entries()) expect(maxAbsDiff(both[i]!, await ref.get(a ?? '')!.last([...prompt, 7])), String(a)).toBeLessThan(1e-4);
    for (const r of ref.values()) r.dispose();
    expect(engine.stats().runsByForm.gathered + engine.stats().runsByForm.grouped).toBe(1);
    // recycleOutputs: the same logits step for step, each step's written into the last one's
    // storage (valid until the next call, as documented).
    const recycling = await Engine.load(`${root}base`, { executor: native, maxLoras: 2, maxLoraRank: 16, recycleOutputs: true });
    await recycling.loadAdapter(`${root}adapters/qv-r8`, 'qv-r8');
    const runSteps = async (e: Engine): Promise<{ copies: Float32Array[]; views: Float32Array[] }> => {
      const seqs = [e.open('qv-r8', prompt), e.open(undefined, prompt)];
      for (const s of seqs) {
        await e.attach(s);
        while (!s.ready) await e.prefill(s);
      }
      const copies: Float32Array[] = [];
      const views: Float32Array[] = [];
      for (const tok of [7, 11, 13]) {
        const out = await e.decode(seqs, [tok, tok]);
        views.push(out[0]!);
        copies.push(out[0]!.slice(), out[1]!.slice());
      }
      for (const s of seqs) e.release(s);
      return { copies, views };
    };
    const plain = await runSteps(engine);
    const reused = await runSteps(recycling);
    reused.copies.forEach((x, i) => {
      expect(Array.from(x), `row ${String(i % 2)} step ${String(i >> 1)}`).toEqual(Array.from(plain.copies[i]!));
    });
    expect(reused.views[1]!.buffer).toBe(reused.views[2]!.buffer);
    expect(Array.from(reused.views[1]!)).toEqual(Array.from(reused.copies[4]!));
    expect(plain.views[1]!.buffer).not.toBe(plain.views[2]!.buffer);
    recycling.dispose();
    for (const spec of ['int8', 'int4']) {
      const quantize = parseWeightQuantSpec(spec);
      const q = await Engine.load(`${root}base`, { executor: native, quantize, maxLoras: 2, maxLoraRank: 16 });
      await q.loadAdapter(`${root}adapters/qv-r8`, 'qv-r8');
      for (const a of [undefined, 'qv-r8']) {
        const lm = await stagedReference(`${root}base`, { adapter: a === undefined ? undefined : `${root}adapters/${a}`, executor: native, quantize });
        expect(maxAbsDiff(await lastLogits(q, a), await lm.last(prompt)), `${spec} ${String(a)}`).toBeLessThan(1e-4);
        lm.dispose();
      }
    }
  });
});
