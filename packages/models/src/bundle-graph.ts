import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { type AnnotationSpec, SERVING_STAGES, type StageLattice } from '@stageml/annotations';
import { type Graph, type HostTensor, graphParams, errorMessage } from '@stageml/ir';
import { type ExpertLora, expertLoraFor } from '@stageml/moe';
import { type LoraAdapter, type LoraForm, checkAdapterAgainstBase, loadLoraAdapter, scalingFor } from '@stageml/peft';
import { openCheckpoint } from '@stageml/safetensors';
import { readParam } from './checkpoint-map.js';
import { ModelCode, ModelError } from './errors.js';
import { type LlamaConfig, familyGraphOptions, parseLlamaConfig } from './hf-config.js';
import { adapterParamName, expertParamName, loraExperts, singleAdapterLinear } from './linear-factories.js';
import { buildLlamaGraph } from './llama-graph.js';

/** Options of `stagedModelGraph`. */
export interface StagedModelOptions {
  /** A PEFT adapter directory applied to every row (the adapter's tensors are `adapter`-stage parameters). */
  readonly adapter?: string;
  /** Name of the adapter (default: the adapter directory's name). */
  readonly adapterName?: string;
  /** Keep only the first `numLayers` decoder layers (default: all), e.g. one layer for lowering tests. */
  readonly numLayers?: number;
  /** How LoRA is applied (default `residual`, as PEFT computes it). */
  readonly form?: LoraForm;
}

/** The forward graph of a model with at most one adapter, with everything needed to specialize it. */
export interface StagedModelGraph {
  /** The parsed config (with `numLayers` reduced when asked). */
  readonly config: LlamaConfig;
  /** The forward graph: KV cache and attention mask inputs, adapter parameters named `adapter.<name>.…`. */
  readonly graph: Graph;
  /** Values of every parameter: checkpoint weights (after adapter overrides) and adapter tensors. */
  readonly values: ReadonlyMap<string, HostTensor>;
  /** The serving lattice (`base < adapter < tenant < request < routing < token`). */
  readonly lattice: StageLattice;
  /** Stages of the parameters: adapter tensors at `adapter`, the rest at `base`; inputs at the top. */
  readonly annotations: AnnotationSpec;
  /** The loaded adapter, when one was given. */
  readonly adapter: LoraAdapter | undefined;
}

/**
 * Builds the forward graph of a model directory and at most one adapter — `buildLlamaGraph` with
 * a KV cache, an attention mask, the adapter's linear and expert factories and the rotary tables
 * of the config — and collects the values and annotations to
 * specialize it at any stage of `SERVING_STAGES` (`stageml stage` writes the residual as a bundle).
 * Errors are the loaders' coded errors (`MODEL_*`, `PEFT_*`, `MOE_*`).
 */
export async function stagedModelGraph(dir: string, opts: StagedModelOptions = {}): Promise<StagedModelGraph> {
  let cfgText: string;
  try {
    cfgText = await readFile(join(dir, 'config.json'), 'utf8');
  } catch (e) {
    throw new ModelError(ModelCode.IO, `cannot read ${join(dir, 'config.json')}: ${errorMessage(e)}`, { cause: e });
  }
  const full = parseLlamaConfig(cfgText, join(dir, 'config.json'));
  const layers = opts.numLayers ?? full.numLayers;
  if (!Number.isSafeInteger(layers) || layers < 1 || layers > full.numLayers) {
    throw new ModelError(ModelCode.BAD_OPTIONS, `numLayers must be an integer in [1, ${String(full.numLayers)}], got ${String(opts.numLayers)}`);
  }
  const config: LlamaConfig = {
    ...full,
    numLayers: layers,
    ...(full.layerWindows === undefined ? {} : { layerWindows: full.layerWindows.slice(0, layers) }),
    ...(full.moe?.layers === undefined ? {} : { moe: { ...full.moe, layers: full.moe.layers.slice(0, layers) } }),
  };
  const adapter = opts.adapter === undefined ? undefined : await loadLoraAdapter(opts.adapter, opts.adapterName === undefined ? {} : { name: opts.adapterName });
  const experts = new Map<string, ExpertLora[]>();
  if (adapter !== undefined && adapter.parameterFactors.length > 0) {
    if (config.moe === undefined) throw new ModelError(ModelCode.BAD_ADAPTER, `adapter '${adapter.name}' targets parameters, which ${config.modelType} models do not have`);
    const shapes = { numExperts: config.moe.numExperts, hidden: config.hiddenSize, intermediate: config.moe.intermediateSize ?? config.intermediateSize };
    for (let l = 0; l < layers; l++) {
      const path = `model.layers.${String(l)}.mlp.experts`;
      const list = expertLoraFor(adapter, path, shapes, scalingFor(adapter.config, path));
      if (list.length > 0) experts.set(`model.layers.${String(l)}.mlp`, list);
    }
  }
  const form = opts.form ?? 'residual';
  const graph = buildLlamaGraph(config, {
    name: config.modelType,
    kvCache: true,
    attentionMask: true,
    linear: singleAdapterLinear(adapter, form),
    ...(adapter === undefined || experts.size === 0 ? {} : { experts: loraExperts(adapter.name, experts) }),
    ...familyGraphOptions(config),
  });
  const values = new Map<string, HostTensor>();
  const ckpt = await openCheckpoint(dir);
  try {
    for (const p of graphParams(graph)) {
      if (p.name.startsWith('adapter.')) continue;
      values.set(p.name, await readParam(ckpt, dir, p.name, graph.values[p.results[0]!]!.type.shape as number[]));
    }
    if (adapter !== undefined) {
      // Modules of dropped layers are checked against the checkpoint, not the smaller graph.
      checkAdapterAgainstBase(adapter, (p) => values.get(p)?.shape ?? (ckpt.has(p) ? ckpt.info(p).shape : undefined));
    }
  } finally {
    await ckpt.close();
  }
  if (adapter !== undefined) {
    for (const [k, t] of adapter.overrides) values.set(k, t);
    for (const m of adapter.modules.values()) {
      values.set(adapterParamName(adapter.name, m.module, 'lora_A'), m.A);
      values.set(adapterParamName(adapter.name, m.module, 'lora_B'), m.B);
      if (m.biasB !== undefined) values.set(adapterParamName(adapter.name, m.module, 'lora_B_bias'), m.biasB);
    }
    for (const [layer, list] of experts) {
      for (const x of list) {
        values.set(expertParamName(adapter.name, layer, x.projection, 'lora_A'), x.A);
        values.set(expertParamName(adapter.name, layer, x.projection, 'lora_B'), x.B);
      }
    }
  }
  const adapted = graphParams(graph).some((p) => p.name.startsWith('adapter.'));
  const annotations: AnnotationSpec = adapted ? { params: { 'adapter.*': 'adapter' } } : {};
  return { config, graph, values, lattice: SERVING_STAGES, annotations, adapter };
}
