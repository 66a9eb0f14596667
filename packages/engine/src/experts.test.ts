import { fileURLToPath } from 'node:url';
import { readLlamaConfig } from '@stageml/models';
import { type LoraAdapter, loadLoraAdapter } from '@stageml/peft';
import { describe, expect, it } from 'vitest';
import { expertSlotFactors, routerAsModules } from './experts.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-kinds/', import.meta.url));

describe('routerAsModules', () => {
  it('moves PEFT router factors (target_parameters mlp.gate.weight) into modules, one per MoE layer, scale α/r', async () => {
    const config = await readLlamaConfig(`${root}qwen3_moe`);
    const loaded = await loadLoraAdapter(`${root}qwen3_moe/adapters/router`);
    expect(loaded.parameterFactors.length).toBe(2);
    const a = routerAsModules(loaded, config);
    expect([...a.modules.keys()].sort()).toEqual(['model.layers.0.mlp.gate', 'model.layers.1.mlp.gate']);
    expect(a.parameterFactors).toEqual([]);
    const m = a.modules.get('model.layers.0.mlp.gate')!;
    expect([m.rank, m.scale, m.A.shape, m.B.shape]).toEqual([2, 2, [2, config.hiddenSize], [config.moe!.numExperts, 2]]);
    // Nothing of it is left for the expert tables.
    expect(expertSlotFactors(a, config, 4)).toEqual([]);
  });

  it('returns an adapter without router factors unchanged (expert factors stay parameter factors)', async () => {
    const config = await readLlamaConfig(`${root}qwen3_moe`);
    const experts = await loadLoraAdapter(`${root}qwen3_moe/adapters/experts`);
    expect(routerAsModules(experts, config)).toBe(experts);
  });

  it('refuses router factors on a model without that MoE router, naming the router (ENGINE_BAD_ADAPTER)', async () => {
    const moe = await readLlamaConfig(`${root}qwen3_moe`);
    const dense = await readLlamaConfig(`${root}qwen2`);
    const loaded = await loadLoraAdapter(`${root}qwen3_moe/adapters/router`);
    expect(() => routerAsModules(loaded, dense)).toThrow(expect.objectContaining({ code: 'ENGINE_BAD_ADAPTER', message: expect.stringMatching(/MoE router 'model\.layers\.0\.mlp\.gate\.weight'/) as string }));
    expect(() => routerAsModules(loaded, { ...moe, moe: { ...moe.moe!, layers: [false, true] } })).toThrow(expect.objectContaining({ code: 'ENGINE_BAD_ADAPTER' }));
  });

  it('refuses nested router factors and a router that also has target_modules factors', async () => {
    const config = await readLlamaConfig(`${root}qwen3_moe`);
    const loaded = await loadLoraAdapter(`${root}qwen3_moe/adapters/router`);
    const nested: LoraAdapter = { ...loaded, parameterFactors: loaded.parameterFactors.map((f) => ({ ...f, depth: 1 })) };
    expect(() => routerAsModules(nested, config)).toThrow(expect.objectContaining({ code: 'ENGINE_BAD_ADAPTER', message: expect.stringContaining('nested') as string }));
    const once = routerAsModules(loaded, config);
    const both: LoraAdapter = { ...loaded, modules: once.modules };
    expect(() => routerAsModules(both, config)).toThrow(expect.objectContaining({ code: 'ENGINE_BAD_ADAPTER', message: expect.stringContaining('target_modules') as string }));
  });
});
