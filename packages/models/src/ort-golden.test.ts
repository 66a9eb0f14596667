// The fixture goldens (transformers + PEFT logits and greedy ids) through the onnxruntime executor.
// NOTE: it lives here, not in @stageml/runtime, because models sits above runtime (a test in
// runtime importing models would be an undeclared dependency and a cycle).
import type { HostTensor } from '@stageml/ir';
import { type Executor, createOrtExecutor } from '@stageml/runtime';
import { beforeAll, describe, expect, it } from 'vitest';
import { CausalLM } from './causal-lm.js';
import { FIXTURE_ROOT, GOLDEN, checkGoldenFamily, maxAbsDiff, readGoldenLogits } from './test-support.js';

const want: Record<string, HostTensor> = {};
let executor: Executor;

beforeAll(async () => {
  Object.assign(want, await readGoldenLogits());
  executor = await createOrtExecutor();
});



describe('Llama fixture on onnxruntime', () => {
  let lm: CausalLM;
  beforeAll(async () => {
    lm = await CausalLM.load(`${FIXTURE_ROOT}llama/base`, { executor });
    for (const a of GOLDEN.families.llama.adapters) await lm.loadAdapter(`${FIXTURE_ROOT}llama/adapters/${a}`);
  });

  it('runs on the onnxruntime executor', () => {
    expect(lm.executorName).toBe('onnxruntime');
  });

  for (const model of ['base', ...GOLDEN.families.llama.adapters]) {
    it(`${model}: logits within 1e-4 and 12 greedy tokens equal on every prompt`, async () => {
      await checkGoldenFamily(lm, want, 'llama', model);
    });
  }

  it('runs the mixed batch (four adapters and the base, one per row) within 1e-4', async () => {
    const mixed = GOLDEN['llama.mixed'];
    const { logits } = await lm.forward(mixed.adapter_names.map(() => mixed.input_ids), { adapters: mixed.adapter_names });
    expect(maxAbsDiff(logits, want['llama.mixed.logits']!)).toBeLessThanOrEqual(1e-4);
  });
});

describe('Mixtral fixture on onnxruntime', () => {
  let lm: CausalLM;
  beforeAll(async () => {
    lm = await CausalLM.load(`${FIXTURE_ROOT}mixtral/base`, { executor });
    for (const a of GOLDEN.families.mixtral.adapters) await lm.loadAdapter(`${FIXTURE_ROOT}mixtral/adapters/${a}`);
  });

  for (const model of ['base', ...GOLDEN.families.mixtral.adapters]) {
    it(`${model}: logits within 1e-4 and 12 greedy tokens equal on every prompt`, async () => {
      await checkGoldenFamily(lm, want, 'mixtral', model);
    });
  }
});
