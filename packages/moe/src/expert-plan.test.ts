import { fileURLToPath } from 'node:url';
import { type HostTensor, hostTensor, interpret, seededRandom } from '@stageml/ir';
import { type LoraAdapter, loadLoraAdapter, scalingFor } from '@stageml/peft';
import { specialize } from '@stageml/runtime';
import { beforeAll, describe, expect, it } from 'vitest';
import {
  EXPERT_PROJECTIONS,
  type ExpertLora,
  type MoeModelShape,
  buildMoePlan,
  buildStagedMoeLayer,
  describeMoeAdapter,
  expertLoraFor,
  layerPlanOf,
  moeLeafName,
  moePlanToJson,
  parseMoePlan,
  referenceMoe,
} from './index.js';

// The Mixtral fixture's `experts-r4` adapter: PEFT target_parameters LoRA (r = 4, alpha = 8) on
// the fused expert tensors of both layers, trained-like (B ≠ 0). Base expert weights are random here:
// the plan machinery is what is under test, the transformers goldens live in @stageml/models.
const DIR = fileURLToPath(new URL('../../../fixtures/peft-tiny/mixtral/adapters/experts-r4', import.meta.url));
const SIZES = { numExperts: 4, hidden: 64, intermediate: 96 };
const LAYERS = ['model.layers.0.mlp.experts', 'model.layers.1.mlp.experts'];
let adapter: LoraAdapter;
const byLayer = new Map<string, ExpertLora[]>();

beforeAll(async () => {
  adapter = await loadLoraAdapter(DIR);
  for (const l of LAYERS) byLayer.set(l, expertLoraFor(adapter, l, SIZES, scalingFor(adapter.config, l)));
});

describe('plans over a real PEFT expert adapter', () => {
  it('describes the adapter, plans it per expert and projection, and round-trips the plan', () => {
    const shape: MoeModelShape = { layers: LAYERS.map((name) => ({ name, numExperts: 4 })), adapters: [describeMoeAdapter(adapter.name, byLayer)] };
    expect(shape.adapters[0]!.targets).toEqual(LAYERS.map((layer) => ({ layer, projections: ['gate_up_proj', 'down_proj'] })));
    const plan = buildMoePlan(shape, (u) => (['materialize', 'residual', 'fallback'] as const)[(u.expert + EXPERT_PROJECTIONS.indexOf(u.projection)) % 3]!, { model: 'mixtral-tiny' });
    expect(plan.units).toHaveLength(2 * 2 * 4);
    expect(parseMoePlan(moePlanToJson(plan, shape), shape)).toEqual(plan);
  });

  it('executes the plan of each layer as the per-token reference does, before and after specialization', () => {
    const shape: MoeModelShape = { layers: LAYERS.map((name) => ({ name, numExperts: 4 })), adapters: [describeMoeAdapter(adapter.name, byLayer)] };
    const plan = buildMoePlan(shape, (u) => (['residual', 'materialize', 'fallback'] as const)[(u.expert + u.layer.length) % 3]!);
    const rnd = seededRandom(3);
    const uniform = (s: number[], amp: number): HostTensor => hostTensor('f32', s, Array.from({ length: s.reduce((a, d) => a * d, 1) }, () => (2 * rnd() - 1) * amp));
    for (const layer of LAYERS) {
      const loras = byLayer.get(layer)!;
      const lora = Object.fromEntries(loras.map((l) => [l.projection, { A: l.A, B: l.B, scale: l.scale }]));
      expect(loras.every((l) => l.scale === 2 && l.rank === 4)).toBe(true);
      const base = { router: uniform([4, 64], 0.5), gateUp: uniform([4, 192, 64], 0.125), down: uniform([4, 64, 96], 0.1) };
      const x = uniform([7, 64], 1);
      const staged = buildStagedMoeLayer({ tokens: 7, hidden: 64, intermediate: 96, numExperts: 4, topK: 2, lora: Object.fromEntries(loras.map((l) => [l.projection, { rank: l.rank, scale: l.scale }])) }, layerPlanOf(plan, shape, adapter.name, layer));
      const weights: Record<string, HostTensor> = { 'experts.router': base.router, 'experts.gate_up_proj': base.gateUp, 'experts.down_proj': base.down };
      const inputs: Record<string, HostTensor> = { x };
      for (const l of loras) {
        weights[moeLeafName('adapter', l.projection, 'lora_A')] = l.A;
        weights[moeLeafName('adapter', l.projection, 'lora_B')] = l.B;
        inputs[moeLeafName('late', l.projection, 'lora_A')] = l.A;
        inputs[moeLeafName('late', l.projection, 'lora_B')] = l.B;
      }
      const want = referenceMoe(x, { ...base, lora }, { topK: 2 });
      expect(interpret(staged.graph, { weights, inputs })['y']!).toBeAllclose(want, { rtol: 1e-4, atol: 1e-5 });
      const s = specialize(staged.graph, { lattice: staged.lattice, annotations: staged.annotations, cutoff: 'adapter', values: weights });
      expect(interpret(s.residual, { weights: s.constants, inputs })['y']!).toBeAllclose(want, { rtol: 1e-4, atol: 1e-5 });
      // The delta is real: without it the layer differs.
      expect(referenceMoe(x, base, { topK: 2 })).not.toBeAllclose(want, { rtol: 1e-4, atol: 1e-5 });
    }
  });
});
