import type { LlamaConfig } from '@stageml/models';
import { MoeError, expertLoraFor } from '@stageml/moe';
import { type LoraAdapter, scalingFor } from '@stageml/peft';
import { EngineCode, EngineError } from './errors.js';
import type { ExpertSlotFactors } from './slots.js';

/**
 * An adapter's MoE expert factors (PEFT `target_parameters`) per expert-projection table of the
 * engine's slot tables, scale per module; `ENGINE_BAD_ADAPTER` naming what does not fit the model
 * or the slot rank `rank`.
 */
export function expertSlotFactors(adapter: LoraAdapter, config: LlamaConfig, rank: number): ExpertSlotFactors[] {
  if (adapter.parameterFactors.length === 0) return [];
  const refuse = (why: string): never => {
    throw new EngineError(EngineCode.BAD_ADAPTER, `adapter '${adapter.name}' ${why}`);
  };
  const moe = config.moe;
  if (moe === undefined) refuse(`targets parameters (${adapter.config.targetParameters.join(', ')}), which ${config.modelType} models do not have`);
  const shapes = { numExperts: moe!.numExperts, hidden: config.hiddenSize, intermediate: moe!.intermediateSize ?? config.intermediateSize };
  const out: ExpertSlotFactors[] = [];
  for (const path of new Set(adapter.parameterFactors.map((f) => f.module))) {
    if (/^model\.layers\.\d+\.mlp\.gate$/.test(path)) refuse(`targets the MoE router '${path}.weight' (target_parameters); router LoRA is not served (its slot tables would have to route per row), only expert tensors are`);
    const layer = /^model\.layers\.(\d+)\.mlp\.experts$/.exec(path);
    if (layer === null || Number(layer[1]) >= config.numLayers) refuse(`targets '${path}', which this model does not have`);
    let list;
    try {
      list = expertLoraFor(adapter, path, shapes, scalingFor(adapter.config, path));
    } catch (e) {
      if (e instanceof MoeError) refuse(e.message.replace(`adapter '${adapter.name}': `, ''));
      throw e;
    }
    for (const x of list) {
      if (x.rank > rank) refuse(`has rank ${String(x.rank)} on '${path}' (${x.projection}), above the slot rank ${String(rank)} (raise --max-lora-rank)`);
      out.push({ module: `${path}.${x.projection}`, A: x.A, B: x.B, rank: x.rank, scale: x.scale });
    }
  }
  return out;
}
