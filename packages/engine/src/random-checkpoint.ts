import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { type HostTensor, graphParams, seededRandom } from '@stageml/ir';
import { LLAMA_PROJECTIONS, type LlamaProjection, type LlamaShape, buildLlamaGraph } from '@stageml/models';
import { writeSafetensors } from '@stageml/safetensors';

function uniform(shape: readonly number[], scale: number, rand: () => number): HostTensor {
  const n = shape.reduce((a, b) => a * b, 1);
  const data = new Float32Array(n);
  for (let i = 0; i < n; i++) data[i] = (rand() * 2 - 1) * scale;
  return { dtype: 'f32', shape, data };
}

/**
 * Writes a random-weight Llama checkpoint (`config.json` + `model.safetensors`) with `shape` into
 * `dir`, for tests and benchmarks: weights uniform in ±1/√in, norms 1. Deterministic in `seed`.
 */
export async function writeRandomLlama(dir: string, shape: LlamaShape & { readonly maxPositions?: number }, seed = 1): Promise<void> {
  await mkdir(dir, { recursive: true });
  const rand = seededRandom(seed);
  const tensors: Record<string, HostTensor> = {};
  const graph = buildLlamaGraph(shape);
  for (const p of graphParams(graph)) {
    const s = graph.values[p.results[0]!]!.type.shape as number[];
    if (s.length === 1) tensors[p.name] = { dtype: 'f32', shape: s, data: new Float32Array(s[0]!).fill(1) };
    else tensors[p.name] = uniform(s, 1 / Math.sqrt(s[s.length - 1]!), rand);
  }
  await writeSafetensors(join(dir, 'model.safetensors'), tensors);
  const hd = shape.headDim ?? shape.hiddenSize / shape.numHeads;
  await writeFile(join(dir, 'config.json'), JSON.stringify({
    architectures: ['LlamaForCausalLM'],
    model_type: 'llama',
    hidden_size: shape.hiddenSize,
    intermediate_size: shape.intermediateSize,
    num_hidden_layers: shape.numLayers,
    num_attention_heads: shape.numHeads,
    num_key_value_heads: shape.numKvHeads,
    head_dim: hd,
    vocab_size: shape.vocabSize,
    rms_norm_eps: shape.rmsNormEps ?? 1e-5,
    rope_theta: shape.ropeTheta ?? 10000,
    tie_word_embeddings: shape.tieWordEmbeddings ?? false,
    max_position_embeddings: shape.maxPositions ?? 2048,
    bos_token_id: 1,
    eos_token_id: 2,
  }, null, 2));
}

/** What `writeRandomAdapter` writes. */
export interface RandomAdapterSpec {
  /** Rank r. */
  readonly rank: number;
  /** lora_alpha (default 2r). */
  readonly alpha?: number;
  /** Targeted projections (default all seven). */
  readonly targets?: readonly LlamaProjection[];
  /** Layers whose projections are adapted (default all). */
  readonly layers?: readonly number[];
  /** Add a `modules_to_save` whole-tensor override of `lm_head` (a row-invariant adapter). */
  readonly overrideLmHead?: boolean;
  /** Seed of the factors. */
  readonly seed?: number;
}

/** Writes a random PEFT LoRA adapter directory for a model of `shape` into `dir`. */
export async function writeRandomAdapter(dir: string, shape: LlamaShape, spec: RandomAdapterSpec): Promise<void> {
  await mkdir(dir, { recursive: true });
  const rand = seededRandom(spec.seed ?? 7);
  const targets = spec.targets ?? LLAMA_PROJECTIONS;
  const H = shape.hiddenSize;
  const hd = shape.headDim ?? H / shape.numHeads;
  const dims: Record<LlamaProjection, [number, number]> = {
    q_proj: [H, shape.numHeads * hd],
    k_proj: [H, shape.numKvHeads * hd],
    v_proj: [H, shape.numKvHeads * hd],
    o_proj: [shape.numHeads * hd, H],
    gate_proj: [H, shape.intermediateSize],
    up_proj: [H, shape.intermediateSize],
    down_proj: [shape.intermediateSize, H],
  };
  const tensors: Record<string, HostTensor> = {};
  for (let l = 0; l < shape.numLayers; l++) {
    if (spec.layers !== undefined && !spec.layers.includes(l)) continue;
    for (const t of targets) {
      const group = ['q_proj', 'k_proj', 'v_proj', 'o_proj'].includes(t) ? 'self_attn' : 'mlp';
      const key = `base_model.model.model.layers.${String(l)}.${group}.${t}`;
      const [inDim, outDim] = dims[t];
      tensors[`${key}.lora_A.weight`] = uniform([spec.rank, inDim], 1 / Math.sqrt(inDim), rand);
      tensors[`${key}.lora_B.weight`] = uniform([outDim, spec.rank], 0.5 / Math.sqrt(spec.rank), rand);
    }
  }
  if (spec.overrideLmHead === true) tensors['base_model.model.lm_head.modules_to_save.default.weight'] = uniform([shape.vocabSize, H], 1 / Math.sqrt(H), rand);
  await writeSafetensors(join(dir, 'adapter_model.safetensors'), tensors);
  await writeFile(join(dir, 'adapter_config.json'), JSON.stringify({
    peft_type: 'LORA',
    r: spec.rank,
    lora_alpha: spec.alpha ?? 2 * spec.rank,
    target_modules: [...targets],
    modules_to_save: spec.overrideLmHead === true ? ['lm_head'] : null,
    bias: 'none',
  }, null, 2));
}
