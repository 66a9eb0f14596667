// The fixture goldens (transformers + PEFT logits and greedy ids) through the torch executor (CPU
// torch here and in CI), the whole engine (`CausalLM`, `generate`) on top of the worker.
// It lives in @stageml/models, which sits above @stageml/runtime (the executor's package), so no
// package depends on one above it.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type { HostTensor } from '@stageml/ir';
import { RuntimeCode, RuntimeError, type TorchExecutor, createTorchExecutor, isTorchAvailable } from '@stageml/runtime';
import { SafetensorsFile } from '@stageml/safetensors';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CausalLM } from './causal-lm.js';
import { generate } from './generate.js';

/** A `describe` that needs Python 3 with torch: failing in CI when torch is missing, skipped elsewhere. */
function describeWithTorch(name: string, fn: () => void): void {
  if (!isTorchAvailable() && process.env['CI'] !== undefined) {
    describe(name, () => {
      it('needs Python 3 with torch', () => {
        throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, 'the torch executor tests need Python 3 with torch in CI: apt-get install python3-torch (or set STAGEML_PYTHON)');
      });
    });
    return;
  }
  describe.skipIf(!isTorchAvailable())(name, fn);
}

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
interface Golden {
  families: { llama: { adapters: string[] }; mixtral: { adapters: string[] } };
  'llama.mixed': { adapter_names: string[]; input_ids: number[] };
  [k: string]: unknown;
}
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as Golden;
const prompt = (family: string, model: string, p: number) =>
  (golden[`${family}.${model}`] as Record<string, { input_ids: number[]; greedy_new_ids: number[] }>)[`prompt${String(p)}`]!;

function maxAbsDiff(a: HostTensor, b: HostTensor): number {
  expect(a.data.length).toBe(b.data.length);
  let m = 0;
  for (let i = 0; i < a.data.length; i++) m = Math.max(m, Math.abs(a.data[i]! - b.data[i]!));
  return m;
}

describeWithTorch('fixture goldens on the torch executor', () => {
  const want: Record<string, HostTensor> = {};
  let executor: TorchExecutor;

  beforeAll(async () => {
    const f = await SafetensorsFile.open(`${root}golden.safetensors`);
    for (const k of f.names()) if (k.startsWith('llama.') || k.startsWith('mixtral.')) want[k] = await f.readTensor(k);
    await f.close();
    executor = await createTorchExecutor({ device: 'cpu' });
  }, 120_000);
  afterAll(async () => {
    await executor.close();
  });

  async function checkFamily(lm: CausalLM, family: string, model: string): Promise<void> {
    const adapter = model === 'base' ? undefined : model;
    for (let p = 0; p < 4; p++) {
      const { input_ids, greedy_new_ids } = prompt(family, model, p);
      const { logits } = await lm.forward([input_ids], { adapters: [adapter] });
      expect(maxAbsDiff(logits, want[`${family}.${model}.prompt${String(p)}.logits`]!), `${model} prompt ${String(p)}`).toBeLessThanOrEqual(1e-4);
      const gen = await generate(lm, input_ids, { adapter, maxNewTokens: 12, padTokenId: 0, stopTokens: [] });
      expect(gen.newIds, `${model} prompt ${String(p)} greedy ids`).toEqual(greedy_new_ids);
    }
  }

  describe('Llama', () => {
    let lm: CausalLM;
    beforeAll(async () => {
      lm = await CausalLM.load(`${root}llama/base`, { executor });
      for (const a of golden.families.llama.adapters) await lm.loadAdapter(`${root}llama/adapters/${a}`);
    }, 120_000);

    it('runs on the torch executor', () => {
      expect(lm.executorName).toBe('torch-cpu');
    });

    for (const model of ['base', ...golden.families.llama.adapters]) {
      it(`${model}: logits within 1e-4 and 12 greedy tokens equal on every prompt`, async () => {
        await checkFamily(lm, 'llama', model);
      }, 120_000);
    }

    it('runs the mixed batch (four adapters and the base, one per row) within 1e-4', async () => {
      const mixed = golden['llama.mixed'];
      const { logits } = await lm.forward(mixed.adapter_names.map(() => mixed.input_ids), { adapters: mixed.adapter_names });
      expect(maxAbsDiff(logits, want['llama.mixed.logits']!)).toBeLessThanOrEqual(1e-4);
    });
  });

  describe('Llama with LoRA linears fused (STAGEML_TORCH_FUSE=1: the fused step on the CPU)', () => {
    let fused: TorchExecutor;
    let lm: CausalLM;
    beforeAll(async () => {
      const before = process.env['STAGEML_TORCH_FUSE'];
      process.env['STAGEML_TORCH_FUSE'] = '1';
      try {
        fused = await createTorchExecutor({ device: 'cpu' });
      } finally {
        if (before === undefined) delete process.env['STAGEML_TORCH_FUSE'];
        else process.env['STAGEML_TORCH_FUSE'] = before;
      }
      lm = await CausalLM.load(`${root}llama/base`, { executor: fused });
      for (const a of golden.families.llama.adapters) await lm.loadAdapter(`${root}llama/adapters/${a}`);
    }, 120_000);
    afterAll(async () => {
      await fused.close();
    });

    for (const model of golden.families.llama.adapters) {
      it(`${model}: logits within 1e-4 and 12 greedy tokens equal on every prompt`, async () => {
        await checkFamily(lm, 'llama', model);
      }, 120_000);
    }
  });

  describe('Mixtral', () => {
    let lm: CausalLM;
    beforeAll(async () => {
      lm = await CausalLM.load(`${root}mixtral/base`, { executor });
      for (const a of golden.families.mixtral.adapters) await lm.loadAdapter(`${root}mixtral/adapters/${a}`);
    }, 120_000);

    for (const model of ['base', ...golden.families.mixtral.adapters]) {
      it(`${model}: logits within 1e-4 and 12 greedy tokens equal on every prompt`, async () => {
        await checkFamily(lm, 'mixtral', model);
      }, 120_000);
    }
  });
});
