import type { LlamaConfig } from '@stageml/models';
import { MoeError, expertLoraFor } from '@stageml/moe';
import { type LoraAdapter, type LoraModule, alphaFor, scalingFor } from '@stageml/peft';
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

/** The MoE router of layer N, as PEFT names the module whose `weight` `target_parameters` may target. */
const ROUTER = /^model\.layers\.(\d+)\.mlp\.gate$/;

/**
 * `adapter` with its MoE router factors (PEFT `target_parameters: ["mlp.gate.weight"]`) moved from
 * `parameterFactors` into `modules`. The router is a plain linear x·Rᵀ (hidden → experts) and PEFT
 * adds s·B·A to R, so its factors A [r, hidden] and B [experts, r] are a module's LoRA factors:
 * from here on the router is served as every other projection is (slot tables, row slots, plan
 * merges). `ENGINE_BAD_ADAPTER` naming the router when the model has no such router, the factors
 * are nested (depth > 0) or the module also carries `target_modules` factors. An adapter without
 * router factors is returned as it is.
 */
export function routerAsModules(adapter: LoraAdapter, config: LlamaConfig): LoraAdapter {
  const routers = adapter.parameterFactors.filter((f) => ROUTER.test(f.module));
  if (routers.length === 0) return adapter;
  const refuse = (why: string): never => {
    throw new EngineError(EngineCode.BAD_ADAPTER, `adapter '${adapter.name}' ${why}`);
  };
  const modules = new Map<string, LoraModule>(adapter.modules);
  for (const f of routers) {
    const what = `targets the MoE router '${f.module}.weight' (target_parameters)`;
    const layer = Number(ROUTER.exec(f.module)![1]);
    const moe = config.moe;
    if (moe === undefined || layer >= config.numLayers || moe.layers?.[layer] === false) refuse(`${what}, which this model does not have`);
    if (f.depth !== 0) refuse(`${what} nested under another targeted parameter of the router; the router has one parameter`);
    if (modules.has(f.module)) refuse(`${what} and has target_modules factors on the same module`);
    if (f.A.shape.length !== 2 || f.B.shape.length !== 2 || f.A.shape[0] !== f.B.shape[1]) refuse(`${what} with lora_A [${f.A.shape.join(', ')}] and lora_B [${f.B.shape.join(', ')}], not A [r, hidden] and B [experts, r]`);
    modules.set(f.module, { module: f.module, rank: f.A.shape[0]!, alpha: alphaFor(adapter.config, f.module), scale: scalingFor(adapter.config, f.module), A: f.A, B: f.B });
  }
  return { ...adapter, modules, parameterFactors: adapter.parameterFactors.filter((f) => !ROUTER.test(f.module)) };
}
