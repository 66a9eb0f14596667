// The fixture goldens (transformers + PEFT logits and greedy ids) through the torch executor (CPU
// torch here and in CI), the whole engine (`CausalLM`, `generate`) on top of the worker.
// It lives in @stageml/models, which sits above @stageml/runtime (the executor's package), so no
// package depends on one above it.
import type { HostTensor } from '@stageml/ir';
import { RuntimeCode, RuntimeError, type TorchExecutor, createTorchExecutor, isTorchAvailable } from '@stageml/runtime';
import { describeNeeding } from '@stageml/testkit';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CausalLM } from './causal-lm.js';
import { FIXTURE_ROOT, GOLDEN, checkGoldenFamily, maxAbsDiff, readGoldenLogits } from './test-support.js';

/** A `describe` that needs Python 3 with torch: failing in CI when torch is missing, skipped elsewhere. */
function describeWithTorch(name: string, fn: () => void): void {
  describeNeeding(name, isTorchAvailable(), () => new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, 'the torch executor tests need Python 3 with torch in CI: apt-get install python3-torch (or set STAGEML_PYTHON)'), fn);
}



describeWithTorch('fixture goldens on the torch executor', () => {
  const want: Record<string, HostTensor> = {};
  let executor: TorchExecutor;

  beforeAll(async () => {
    Object.assign(want, await readGoldenLogits());
    executor = await createTorchExecutor({ device: 'cpu' });
  }, 120_000);
  afterAll(async () => {
    await executor.close();
  });


  describe('Llama', () => {
    let lm: CausalLM;
    beforeAll(async () => {
      lm = await CausalLM.load(`${FIXTURE_ROOT}llama/base`, { executor });
      for (const a of GOLDEN.families.llama.adapters) await lm.loadAdapter(`${FIXTURE_ROOT}llama/adapters/${a}`);
    }, 120_000);

    it('runs on the torch executor', () => {
      expect(lm.executorName).toBe('torch-cpu');
    });

    for (const model of ['base', ...GOLDEN.families.llama.adapters]) {
      it(`${model}: logits within 1e-4 and 12 greedy tokens equal on every prompt`, async () => {
        await checkGoldenFamily(lm, want, 'llama', model);
      }, 120_000);
    }

    it('runs the mixed batch (four adapters and the base, one per row) within 1e-4', async () => {
      const mixed = GOLDEN['llama.mixed'];
      const { logits } = await lm.forward(mixed.adapter_names.map(() => mixed.input_ids), { adapters: mixed.adapter_names });
      expect(maxAbsDiff(logits, want['llama.mixed.logits']!)).toBeLessThanOrEqual(1e-4);
    });
  });

  describe('Mixtral', () => {
    let lm: CausalLM;
    beforeAll(async () => {
      lm = await CausalLM.load(`${FIXTURE_ROOT}mixtral/base`, { executor });
      for (const a of GOLDEN.families.mixtral.adapters) await lm.loadAdapter(`${FIXTURE_ROOT}mixtral/adapters/${a}`);
    }, 120_000);

    for (const model of ['base', ...GOLDEN.families.mixtral.adapters]) {
      it(`${model}: logits within 1e-4 and 12 greedy tokens equal on every prompt`, async () => {
        await checkGoldenFamily(lm, want, 'mixtral', model);
      }, 120_000);
    }
  });
});
