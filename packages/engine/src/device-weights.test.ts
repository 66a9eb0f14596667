// Weights and slot tables on the torch worker's device only (`EngineOptions.deviceWeights`): the
// worker reads the checkpoint itself, slot writes cross as one slot's rows, and the tokens are the
// host path's.
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { argmaxOf } from '@stageml/models';
import { interpreterExecutor } from '@stageml/runtime';
import { expect, it } from 'vitest';
import { Engine, EngineCode, type EngineOptions, writeRandomAdapter } from './index.js';
import { describeWithTorch, useCpuTorchExecutor } from './test-support.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/llama/', import.meta.url));

/** Greedy tokens of three rows (two adapters and the base) over prefill and 4 decode steps. */
async function tokens(e: Engine): Promise<number[][]> {
  const seqs = [e.open('a', [1, 52, 317, 335, 262]), e.open('b', [1, 54, 264, 479]), e.open(undefined, [1, 500, 72])];
  for (const s of seqs) expect(await e.attach(s)).toBe(true);
  let last = (await e.prefillMany(seqs)).map((l) => argmaxOf(l!));
  const out: number[][] = seqs.map((_, i) => [last[i]!]);
  for (let step = 0; step < 4; step++) {
    last = (await e.decode(seqs, last)).map((l) => argmaxOf(l));
    last.forEach((t, i) => out[i]!.push(t));
  }
  for (const s of seqs) e.release(s);
  return out;
}

describeWithTorch('engine weights and slot tables on the torch device (deviceWeights)', () => {
  const torch = useCpuTorchExecutor();

  for (const [dtype, adapterDtype] of [['f32', 'f32'], ['bf16', 'f32'], ['bf16', 'same']] as const) {
    it(`gives the host path's tokens (${dtype}, adapterDtype ${adapterDtype}); no weight crosses the pipe, a slot write sends its rows only, and memory says where bytes live`, async () => {
      const opts: EngineOptions = { executor: torch(), maxLoras: 3, maxLoraRank: 16, dtype, adapterDtype };
      const host = await Engine.load(`${root}base`, { ...opts, deviceWeights: false });
      const before = torch().traffic().sentTensorBytes;
      const dev = await Engine.load(`${root}base`, opts);
      try {
        // The programs' preparation and the weights' load send no tensor bytes at all.
        expect(torch().traffic().sentTensorBytes - before).toBe(0);
        const m0 = dev.memory();
        const h0 = host.memory();
        expect(m0.weights).toBe(h0.weights);
        expect(m0.slots).toBe(h0.slots);
        expect(m0.onDevice).toBe(m0.weights + m0.slots);
        expect(h0.onDevice).toBe(0);
        const sent = torch().traffic().sentTensorBytes;
        for (const e of [host, dev]) {
          await e.loadAdapter(`${root}adapters/all-r16`, 'a');
          await e.loadAdapter(`${root}adapters/qv-r8`, 'b');
        }
        // Host tables are sent whole with the first run; the device engine sent only the rows written:
        // its factors, at 4 bytes an element on the wire (bf16 travels as f32).
        const wire = dev.memory().slotFactors * (4 / (adapterDtype === 'same' ? 2 : 4));
        expect(torch().traffic().sentTensorBytes - sent).toBe(wire);
        expect(await tokens(dev)).toEqual(await tokens(host));
        // Unloading zeroes the slot's rows on the device; a new adapter takes the slot.
        expect(dev.unloadAdapter('b')).toBe(true);
        expect(host.unloadAdapter('b')).toBe(true);
        expect(dev.slotsAreClear()).toBe(true);
        for (const e of [host, dev]) await e.loadAdapter(`${root}adapters/o-r2`, 'b');
        expect(await tokens(dev)).toEqual(await tokens(host));
      } finally {
        dev.dispose();
        host.dispose();
      }
    }, 300_000);
  }

  it('refuses deviceWeights where the weights must be on the host, or without device tensors', async () => {
    await expect(Engine.load(`${root}base`, { executor: interpreterExecutor, deviceWeights: true })).rejects.toMatchObject({ code: EngineCode.BAD_OPTIONS });
    await expect(Engine.load(`${root}base`, { executor: torch(), deviceWeights: true, memoryBudget: 1e6 })).rejects.toMatchObject({ code: EngineCode.BAD_OPTIONS });
    await expect(Engine.load(`${root}base`, { executor: torch(), deviceWeights: true, weights: 'program' })).rejects.toMatchObject({ code: EngineCode.BAD_OPTIONS });
    // Left to the default, an engine that needs host weights keeps them there.
    const e = await Engine.load(`${root}base`, { executor: torch(), maxLoras: 2, maxLoraRank: 16, memoryBudget: 1e6 });
    try {
      expect(e.memory().onDevice).toBe(0);
    } finally {
      e.dispose();
    }
    // An adapter replacing a whole tensor needs the weights on the host: refused, the engine as it was.
    const dev = await Engine.load(`${root}base`, { executor: torch(), maxLoras: 2, maxLoraRank: 16 });
    try {
      const c = dev.config;
      const dir = join(mkdtempSync(join(tmpdir(), 'stageml-devw-')), 'override');
      await writeRandomAdapter(dir, { vocabSize: c.vocabSize, hiddenSize: c.hiddenSize, intermediateSize: c.intermediateSize, numLayers: c.numLayers, numHeads: c.numHeads, numKvHeads: c.numKvHeads, headDim: c.headDim, tieWordEmbeddings: c.tieWordEmbeddings }, { rank: 4, overrideLmHead: true });
      await expect(dev.loadAdapter(dir, 'o')).rejects.toMatchObject({ code: EngineCode.BAD_ADAPTER, message: expect.stringContaining('deviceWeights') as unknown });
      expect(dev.adapterNames).toEqual([]);
    } finally {
      dev.dispose();
    }
  }, 120_000);
});
