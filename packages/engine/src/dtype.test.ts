// The engine in bf16/f16: its programs against the f32 engine and across executors (the reference
// interpreter and the torch worker on CPU torch run the same bf16 graphs), memory at the stored
// dtype's size, and the coded refusals. (apps/cli/src/serve-dtype.test.ts checks the bf16 engine
// against the PEFT-exact bundle of `stageml stage --dtype bf16`, bit for bit.)
import { fileURLToPath } from 'node:url';
import { roundBf16 } from '@stageml/ir';
import { argmaxOf } from '@stageml/models';
import { type Executor, type TorchExecutor, createTorchExecutor, executorCapabilities, interpreterExecutor, parseWeightQuantSpec } from '@stageml/runtime';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type EngineOptions, ENGINE_DTYPES, Engine, EngineCode, lowestOf } from './index.js';
import { describeWithTorch } from './test-support.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/llama/', import.meta.url));
const ADAPTERS = ['all-r16', 'qv-r8', 'mlp-r4-rslora'];
const PROMPTS = [
  [1, 52, 317, 335, 262, 438, 309, 487],
  [1, 54, 264, 479, 455],
  [1, 500, 72, 283, 10, 90, 11, 4, 77, 21, 5],
];

async function load(opts: EngineOptions): Promise<Engine> {
  const e = await Engine.load(`${root}base`, { maxLoras: 4, maxLoraRank: 16, ...opts });
  for (const a of ADAPTERS) await e.loadAdapter(`${root}adapters/${a}`, a);
  return e;
}

/** Greedy decode of every prompt as one mixed batch (adapter i on prompt i, the last row base): per row its logits at each step and its tokens. */
async function greedy(e: Engine, steps: number): Promise<{ logits: Float32Array[][]; tokens: number[][] }> {
  const seqs = [...PROMPTS.map((p, i) => e.open(ADAPTERS[i], p)), e.open(undefined, PROMPTS[0]!)];
  for (const s of seqs) expect(await e.attach(s)).toBe(true);
  const logits: Float32Array[][] = seqs.map(() => []);
  const tokens: number[][] = seqs.map(() => []);
  let last = (await e.prefillMany(seqs, { maxChunk: 64 })).map((l) => Float32Array.from(l!));
  for (let step = 0; step < steps; step++) {
    last.forEach((l, r) => {
      logits[r]!.push(l);
      tokens[r]!.push(argmaxOf(l));
    });
    last = (await e.decode(seqs, tokens.map((t) => t[t.length - 1]!))).map((l) => Float32Array.from(l));
  }
  for (const s of seqs) e.release(s);
  return { logits, tokens };
}

function relError(a: Float32Array, b: Float32Array): number {
  let num = 0;
  let den = 0;
  for (let i = 0; i < a.length; i++) {
    num += (a[i]! - b[i]!) ** 2;
    den += b[i]! ** 2;
  }
  return Math.sqrt(num / den);
}

describe('Engine dtype', () => {
  let f32: { logits: Float32Array[][]; tokens: number[][] };
  let bf16: { logits: Float32Array[][]; tokens: number[][] };
  let engine32: Engine;
  let engine16: Engine;
  beforeAll(async () => {
    engine32 = await load({});
    engine16 = await load({ dtype: 'bf16' });
    f32 = await greedy(engine32, 4);
    bf16 = await greedy(engine16, 4);
  }, 120_000);

  it('computes in bf16 (logits within bf16 error of the f32 engine, not equal to them) with the same greedy tokens on the fixture', () => {
    expect(engine16.dtype).toBe('bf16');
    expect(engine16.factorDtype).toBe('f32');
    expect(bf16.tokens).toEqual(f32.tokens);
    bf16.logits.forEach((row, r) => {
      row.forEach((l, s) => {
        const err = relError(l, f32.logits[r]![s]!);
        expect(err).toBeGreaterThan(1e-4);
        expect(err).toBeLessThan(3e-2);
        // Logits are a bf16 result cast to f32.
        expect(l.every((x) => roundBf16(x) === x)).toBe(true);
      });
    });
  });

  it('holds the weights at 2 bytes an element and the f32 slot tables as in f32; adapterDtype same halves the tables', async () => {
    const m32 = engine32.memory();
    const m16 = engine16.memory();
    expect(m16.weights * 2).toBe(m32.weights);
    expect(m16.slots).toBe(m32.slots);
    expect(m16.slotFactors).toBe(m32.slotFactors);
    const same = await load({ dtype: 'bf16', adapterDtype: 'same' });
    try {
      expect(same.factorDtype).toBe('bf16');
      const m = same.memory();
      expect(m.slots * 2).toBe(m32.slots);
      expect(m.slotFactors * 2).toBe(m32.slotFactors);
      const out = await greedy(same, 2);
      // Not bit-equal to PEFT's f32 factors, but the same tokens here.
      expect(out.tokens.map((t) => t.slice(0, 2))).toEqual(f32.tokens.map((t) => t.slice(0, 2)));
    } finally {
      same.dispose();
    }
  }, 120_000);

  it('runs f16 and resolves dtype checkpoint to the stored dtype (f32 for the fixture)', async () => {
    const f16 = await load({ dtype: 'f16' });
    try {
      const out = await greedy(f16, 2);
      expect(out.tokens.map((t) => t.slice(0, 2))).toEqual(f32.tokens.map((t) => t.slice(0, 2)));
      expect(relError(out.logits[0]![0]!, f32.logits[0]![0]!)).toBeLessThan(1e-2);
    } finally {
      f16.dispose();
    }
    const ckpt = await Engine.load(`${root}base`, { dtype: 'checkpoint', maxLoras: 1 });
    expect(ckpt.dtype).toBe('f32');
    ckpt.dispose();
    expect(ENGINE_DTYPES).toEqual(['f32', 'bf16', 'f16']);
    expect(lowestOf('bf16')).toBe(roundBf16(-3.3895313892515355e38));
  }, 120_000);

  it('serves merged copies (a memory budget plan) in bf16: lanes hold bf16 weights, counted at 2 bytes an element', async () => {
    const planned = await load({ dtype: 'bf16', memoryBudget: 1e9 });
    try {
      const out = await greedy(planned, 2);
      const merged = planned.plan().merged;
      expect(Object.keys(merged).length).toBeGreaterThan(0);
      const modules = Object.values(merged).flat();
      // Every merged copy is one weight [out, in] in bf16.
      expect(planned.memory().lanes).toBeGreaterThan(0);
      expect(planned.memory().lanes).toBeLessThanOrEqual(modules.length * engine16.memory().weights);
      expect(out.tokens.map((t) => t.slice(0, 2))).toEqual(f32.tokens.map((t) => t.slice(0, 2)));
      out.logits.forEach((row) => {
        expect(row[0]!.every((x) => roundBf16(x) === x)).toBe(true);
      });
    } finally {
      planned.dispose();
    }
  }, 120_000);

  it('serves a MoE model (the mixtral fixture) in bf16 with the f32 engine\'s greedy tokens, attention and expert adapters alike', async () => {
    const mixtral = fileURLToPath(new URL('../../../fixtures/peft-tiny/mixtral/', import.meta.url));
    const prompt = [1, 52, 31, 35, 26, 43, 30, 48];
    const tokensOf = async (dtype: 'f32' | 'bf16', adapter: string): Promise<number[]> => {
      const e = await Engine.load(`${mixtral}base`, { dtype, maxLoras: 2, maxLoraRank: 8 });
      try {
        await e.loadAdapter(`${mixtral}adapters/${adapter}`, adapter);
        const s = e.open(adapter, prompt);
        await e.attach(s);
        let l = (await e.prefill(s, { maxChunk: 64 }))!;
        const out: number[] = [];
        for (let i = 0; i < 4; i++) {
          out.push(argmaxOf(l));
          l = (await e.decode([s], [out[i]!]))[0]!;
        }
        return out;
      } finally {
        e.dispose();
      }
    };
    for (const adapter of ['attn-r8', 'experts-r4']) expect(await tokensOf('bf16', adapter), adapter).toEqual(await tokensOf('f32', adapter));
  }, 120_000);

  it('refuses an executor that cannot run the dtype, a bad dtype and quantize in bf16, with coded errors', async () => {
    const fake = (name: string): Executor => ({
      name,
      capabilities: executorCapabilities(name) ?? { name, supportsOp: () => true, lateBinding: true },
      dispose: () => Promise.resolve(),
      prepare: () => Promise.reject(new Error('never prepared')),
    });
    for (const name of ['onnxruntime', 'tfjs-cpu', 'my-executor']) {
      await expect(Engine.load(`${root}base`, { dtype: 'bf16', executor: fake(name) })).rejects.toMatchObject({ code: EngineCode.UNSUPPORTED_DTYPE, message: expect.stringContaining(`the executor '${name}' cannot run bf16 programs`) as unknown });
    }
    await expect(Engine.load(`${root}base`, { dtype: 'f16', executor: fake('onnxruntime') })).rejects.toMatchObject({ code: EngineCode.UNSUPPORTED_DTYPE });
    await expect(Engine.load(`${root}base`, { dtype: 'fp8' as 'f32' })).rejects.toMatchObject({ code: EngineCode.BAD_OPTIONS, message: expect.stringContaining("dtype must be one of f32, bf16, f16 or checkpoint, got 'fp8'") as unknown });
    await expect(Engine.load(`${root}base`, { dtype: 'bf16', adapterDtype: 'bf16' as 'same' })).rejects.toMatchObject({ code: EngineCode.BAD_OPTIONS });
    await expect(Engine.load(`${root}base`, { dtype: 'bf16', weights: 'program', quantize: parseWeightQuantSpec('int8'), executor: interpreterExecutor })).rejects.toMatchObject({ code: EngineCode.BAD_OPTIONS });
  });
});

describeWithTorch('Engine dtype on the torch executor (CPU torch)', () => {
  let executor: TorchExecutor;
  beforeAll(async () => {
    executor = await createTorchExecutor({ device: 'cpu' });
  }, 120_000);
  afterAll(async () => {
    await executor.close();
  });

  it('runs the bf16 programs with the interpreter\'s greedy tokens and logits within bf16 rounding of its', async () => {
    const torch = await load({ dtype: 'bf16', executor });
    const interp = await load({ dtype: 'bf16' });
    try {
      const a = await greedy(torch, 4);
      const b = await greedy(interp, 4);
      expect(a.tokens).toEqual(b.tokens);
      a.logits.forEach((row, r) => {
        row.forEach((l, s) => {
          // CPU torch computes each bf16 op in f32 and rounds, as the interpreter does; sums may
          // associate differently, so a value may land one bf16 step away.
          expect(relError(l, b.logits[r]![s]!)).toBeLessThan(1e-2);
        });
      });
    } finally {
      torch.dispose();
      interp.dispose();
    }
  }, 120_000);
});
