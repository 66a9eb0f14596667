import type { GraphBuilder, Value } from '@stageml/ir';
import { type ExpertLora, type ExpertLoraValues, type ExpertProjection, moeBlock } from '@stageml/moe';
import { type LoraAdapter, type LoraForm, type LoraModule, loraLinear } from '@stageml/peft';
import type { ExpertsFactory, LinearFactory } from './llama-graph.js';

/** Graph parameter name of an adapter tensor: `adapter.<name>.<module>.lora_A` etc. */
export function adapterParamName(adapter: string, module: string, tensor: 'lora_A' | 'lora_B' | 'lora_B_bias'): string {
  return `adapter.${adapter}.${module}.${tensor}`;
}

function loraValues(b: GraphBuilder, adapter: string, m: LoraModule, inDim: number, outDim: number) {
  return {
    A: b.param(adapterParamName(adapter, m.module, 'lora_A'), ['f32', [m.rank, inDim]]),
    B: b.param(adapterParamName(adapter, m.module, 'lora_B'), ['f32', [outDim, m.rank]]),
    scale: m.scale,
    ...(m.biasB === undefined ? {} : { biasB: b.param(adapterParamName(adapter, m.module, 'lora_B_bias'), ['f32', [outDim]]) }),
  };
}

function baseParams(b: GraphBuilder, module: string, inDim: number, outDim: number, bias: boolean): { w: Value; bias: Value | undefined } {
  return {
    w: b.param(`${module}.weight`, ['f32', [outDim, inDim]]),
    bias: bias ? b.param(`${module}.bias`, ['f32', [outDim]]) : undefined,
  };
}

/**
 * Linear layers carrying one adapter (or none), in residual or merged form: the primitive chain
 * `@stageml/peft`'s `loraLinear` builds, which the rewrite rules (merges) and `stageml stage`'s
 * dtype pass read; `stageml stage` folds the staged residual's chains into `loraLinear` ops after.
 */
export function singleAdapterLinear(adapter: LoraAdapter | undefined, form: LoraForm): LinearFactory {
  return (b, module, x, inDim, outDim, bias) => {
    const p = baseParams(b, module, inDim, outDim, bias);
    const m = adapter?.modules.get(module);
    const lora = m === undefined ? undefined : loraValues(b, adapter!.name, m, inDim, outDim);
    return loraLinear(b, x, p.w, p.bias, lora, form);
  };
}

/** Graph parameter name of an expert adapter tensor: `adapter.<name>.<layer>.experts.<proj>.lora_A`. */
export function expertParamName(adapter: string, layer: string, projection: ExpertProjection, tensor: 'lora_A' | 'lora_B'): string {
  return `adapter.${adapter}.${layer}.experts.${projection}.${tensor}`;
}

/** MoE layers carrying one adapter's per-expert LoRA factors (residual form, grouped by expert). */
export function loraExperts(adapter: string, byLayer: ReadonlyMap<string, readonly ExpertLora[]>): ExpertsFactory {
  return (b, module, x, s) => {
    const lora: Partial<Record<ExpertProjection, ExpertLoraValues>> = {};
    for (const f of byLayer.get(module) ?? []) {
      lora[f.projection] = {
        A: b.param(expertParamName(adapter, module, f.projection, 'lora_A'), ['f32', f.A.shape]),
        B: b.param(expertParamName(adapter, module, f.projection, 'lora_B'), ['f32', f.B.shape]),
        scale: f.scale,
      };
    }
    return moeBlock(
      b,
      x,
      {
        router: b.param(`${module}.gate.weight`, ['f32', [s.numExperts, s.hidden]]),
        gateUp: b.param(`${module}.experts.gate_up_proj`, ['f32', [s.numExperts, 2 * s.intermediate, s.hidden]]),
        down: b.param(`${module}.experts.down_proj`, ['f32', [s.numExperts, s.hidden, s.intermediate]]),
        lora,
      },
      { topK: s.topK, normalize: s.normalize ?? true },
    );
  };
}
