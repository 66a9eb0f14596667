// Every PEFT adapter kind through the engine against PEFT 0.21's f32 logits (fixtures/peft-kinds,
// written by tools/gen_adapter_kinds.py): each adapter alone (prefill, then decode step by step,
// every position's logits within 1e-4), and one mixed decode batch holding every adapter kind plus
// a base row, whose every row equals PEFT run alone on that adapter.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { type Executor, createCpuNativeExecutor, createOrtExecutor, interpreterExecutor } from '@stageml/runtime';
import { SafetensorsFile } from '@stageml/safetensors';
import { describe, expect, it } from 'vitest';
import { Engine } from './index.js';
import { describeWithTorch, useCpuTorchExecutor } from './test-support.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-kinds/', import.meta.url));
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as { prompt_ids: number[][]; models: Record<string, { adapters: Record<string, unknown> }> };
const PREFIX = 3;

const executors: [string, () => Promise<Executor> | Executor][] = [
  ['interpreter', () => interpreterExecutor],
  ['cpu-native', () => createCpuNativeExecutor({ threads: 2 })],
  ['onnxruntime', () => createOrtExecutor()],
];

function maxDiff(got: Float32Array, want: ArrayLike<number>, offset: number): number {
  let d = 0;
  for (let v = 0; v < got.length; v++) d = Math.max(d, Math.abs(got[v]! - want[offset + v]!));
  return d;
}

function kindsTest(model: string, adapters: readonly string[], make: () => Promise<Executor> | Executor): void {
  it(`each of ${adapters.join(', ')} alone, then all in one mixed batch with a base row, within 1e-4 of PEFT`, async () => {
    const engine = await Engine.load(`${root}${model}`, { maxLoras: adapters.length, maxLoraRank: 4, prefillChunk: 4, executor: await make() });
    for (const a of adapters) await engine.loadAdapter(`${root}${model}/adapters/${a}`, a);
    const f = await SafetensorsFile.open(`${root}golden.safetensors`);
    const V = engine.config.vocabSize;
    const rows = ['base', ...adapters];
    for (const [p, ids] of golden.prompt_ids.entries()) {
      const want = await Promise.all(rows.map(async (r) => (await f.readTensor(`${model}.${r}.prompt${String(p)}`)).data));
      // Alone: prefill the prefix, decode the rest one token at a time.
      for (const [i, r] of rows.entries()) {
        const s = engine.open(r === 'base' ? undefined : r, ids.slice(0, PREFIX));
        expect(await engine.attach(s)).toBe(true);
        let logits: Float32Array | undefined;
        while (!s.ready) logits = await engine.prefill(s);
        expect(maxDiff(logits!, want[i]!, (PREFIX - 1) * V), `${r} prompt${String(p)} position ${String(PREFIX - 1)}`).toBeLessThanOrEqual(1e-4);
        for (let t = PREFIX; t < ids.length; t++) {
          const [l] = await engine.decode([s], [ids[t]!]);
          expect(maxDiff(l!, want[i]!, t * V), `${r} prompt${String(p)} position ${String(t)}`).toBeLessThanOrEqual(1e-4);
        }
        engine.release(s);
      }
      // Mixed: every row in one decode batch.
      const seqs = rows.map((r) => engine.open(r === 'base' ? undefined : r, ids.slice(0, PREFIX)));
      for (const s of seqs) {
        expect(await engine.attach(s)).toBe(true);
        while (!s.ready) await engine.prefill(s);
      }
      for (let t = PREFIX; t < ids.length; t++) {
        const out = await engine.decode(seqs, seqs.map(() => ids[t]!));
        out.forEach((l, i) => { expect(maxDiff(l, want[i]!, t * V), `mixed ${rows[i]!} prompt${String(p)} position ${String(t)}`).toBeLessThanOrEqual(1e-4); });
      }
      for (const s of seqs) engine.release(s);
    }
    for (const a of adapters) engine.unloadAdapter(a);
    expect(engine.slotsAreClear()).toBe(true);
    await f.close();
  }, 120_000);
}

for (const [model, spec] of Object.entries(golden.models)) {
  const adapters = Object.keys(spec.adapters);
  for (const [exName, make] of executors) {
    describe(`adapter kinds: ${model} on ${exName}`, () => {
      kindsTest(model, adapters, make);
    });
  }
  describeWithTorch(`adapter kinds: ${model} on torch (CPU)`, () => {
    const torch = useCpuTorchExecutor();
    // The torch worker holds the base weights on its device: lane kinds (trainable tokens, a
    // replaced head) are refused there with ENGINE_BAD_ADAPTER; every slot kind is served.
    kindsTest(model, adapters.filter((a) => a !== 'tokens' && a !== 'head'), torch);
  });
}

describe('programs without the output tables until an adapter needs them', () => {
  it('plain LoRA runs the lean forms; a DoRA or LoRA-bias adapter prepares the forms with S and C once, and only its batches run them', async () => {
    const engine = await Engine.load(`${root}qwen2`, { maxLoras: 3, maxLoraRank: 4, prefillChunk: 4 });
    const prepared = engine.stats().preparations;
    await engine.loadAdapter(`${root}qwen2/adapters/lora`, 'lora');
    const ids = golden.prompt_ids[0]!;
    const run = async (names: (string | undefined)[]): Promise<Float32Array[]> => {
      const seqs = names.map((n) => engine.open(n, ids.slice(0, PREFIX)));
      for (const s of seqs) {
        expect(await engine.attach(s)).toBe(true);
        while (!s.ready) await engine.prefill(s);
      }
      const out = await engine.decode(seqs, seqs.map(() => ids[PREFIX]!));
      for (const s of seqs) engine.release(s);
      return out;
    };
    const plain = await run(['lora', undefined]);
    expect(engine.stats()).toMatchObject({ preparations: prepared, outTableRuns: 0 });
    await engine.loadAdapter(`${root}qwen2/adapters/dora`, 'dora');
    const withOuts = engine.stats().preparations;
    expect(withOuts).toBe(prepared + 3);
    await engine.loadAdapter(`${root}qwen2/adapters/lora-bias`, 'lora-bias');
    expect(engine.stats().preparations).toBe(withOuts);
    // A batch of plain rows still runs the lean forms, with the same logits as before.
    const again = await run(['lora', undefined]);
    expect(engine.stats().outTableRuns).toBe(0);
    again.forEach((l, i) => { expect(Array.from(l)).toEqual(Array.from(plain[i]!)); });
    // A batch with a DoRA row runs the forms with the tables; every row as PEFT has it.
    const f = await SafetensorsFile.open(`${root}golden.safetensors`);
    const rows = ['lora', 'dora', 'lora-bias', 'base'];
    const mixed = await run(rows.map((r) => (r === 'base' ? undefined : r)));
    expect(engine.stats().outTableRuns).toBeGreaterThan(0);
    const V = engine.config.vocabSize;
    for (const [i, r] of rows.entries()) {
      const want = (await f.readTensor(`qwen2.${r}.prompt0`)).data;
      expect(maxDiff(mixed[i]!, want, PREFIX * V), r).toBeLessThanOrEqual(1e-4);
    }
    await f.close();
    engine.dispose();
  }, 120_000);
});
