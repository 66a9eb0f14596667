import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { ModelCode, ModelError } from './errors.js';
import type { LlamaShape } from './llama-graph.js';
import { errorMessage } from '@stageml/ir';

/** Rotary scaling of a Llama-family config (HF `rope_parameters` / `rope_scaling`). */
export type RopeScaling =
  | { readonly type: 'default' }
  | { readonly type: 'linear'; readonly factor: number }
  | {
      readonly type: 'llama3';
      readonly factor: number;
      readonly lowFreqFactor: number;
      readonly highFreqFactor: number;
      readonly originalMaxPositions: number;
    };

/** A Llama-family model configuration (Mixtral included), parsed from HF `config.json`. */
export interface LlamaConfig extends LlamaShape {
  /** Mixture-of-experts layout (Mixtral), when the MLPs are routed experts. */
  readonly moe?: MoeShape;
  /** HF `model_type` (`llama`, `mistral`, `qwen2`). */
  readonly modelType: string;
  readonly headDim: number;
  readonly rmsNormEps: number;
  readonly ropeTheta: number;
  readonly rope: RopeScaling;
  readonly tieWordEmbeddings: boolean;
  readonly attentionBias: boolean;
  readonly mlpBias: boolean;
  /** Bias on q/k/v only (Qwen2). */
  readonly qkvBias: boolean;
  /** Largest position the model was trained for. */
  readonly maxPositions: number;
  /** Token ids that end generation (HF `eos_token_id`, a number or a list). */
  readonly eosTokenIds: readonly number[];
  /** Beginning-of-sequence id, when set. */
  readonly bosTokenId: number | undefined;
  /**
   * Sliding-window attention (Mistral's and Mixtral's `sliding_window`, on every layer): a
   * query attends to itself and the `slidingWindow - 1` attended tokens before it.
   */
  readonly slidingWindow?: number;
}

/** Mixture-of-experts fields (Mixtral): the MLP of every layer is a routed set of experts. */
export interface MoeShape {
  /** Experts per layer (`num_local_experts`). */
  readonly numExperts: number;
  /** Experts each token is routed to (`num_experts_per_tok`). */
  readonly topK: number;
}

const pos = z.number().int().positive();
const ropeSchema = z.looseObject({
  rope_type: z.string().optional(),
  type: z.string().optional(),
  rope_theta: z.number().positive().optional(),
  factor: z.number().positive().optional(),
  low_freq_factor: z.number().positive().optional(),
  high_freq_factor: z.number().positive().optional(),
  original_max_position_embeddings: pos.optional(),
});

const schema = z.looseObject({
  model_type: z.string(),
  vocab_size: pos,
  hidden_size: pos,
  intermediate_size: pos,
  num_hidden_layers: pos,
  num_attention_heads: pos,
  num_key_value_heads: pos.nullish(),
  head_dim: pos.nullish(),
  hidden_act: z.string().optional().default('silu'),
  rms_norm_eps: z.number().positive().optional().default(1e-6),
  rope_theta: z.number().positive().optional(),
  rope_parameters: ropeSchema.nullish(),
  rope_scaling: ropeSchema.nullish(),
  tie_word_embeddings: z.boolean().optional().default(false),
  attention_bias: z.boolean().optional().default(false),
  mlp_bias: z.boolean().optional().default(false),
  max_position_embeddings: pos.optional().default(2048),
  eos_token_id: z.union([z.number().int(), z.array(z.number().int())]).nullish(),
  bos_token_id: z.number().int().nullish(),
  sliding_window: z.number().int().nullish(),
  num_local_experts: pos.optional(),
  num_experts_per_tok: pos.optional(),
  use_sliding_window: z.boolean().optional(),
});

const LLAMA_FAMILY = new Set(['llama', 'mistral', 'qwen2', 'mixtral']);

function bad(file: string, msg: string): never {
  throw new ModelError(ModelCode.BAD_CONFIG, `${file}: ${msg}`);
}

function parseRope(file: string, c: z.infer<typeof schema>): { theta: number; rope: RopeScaling } {
  const p = c.rope_parameters ?? c.rope_scaling ?? undefined;
  const theta = p?.rope_theta ?? c.rope_theta ?? 10000;
  const type = p?.rope_type ?? p?.type ?? 'default';
  switch (type) {
    case 'default':
      return { theta, rope: { type: 'default' } };
    case 'linear':
      if (p?.factor === undefined) bad(file, "rope type 'linear' needs 'factor'");
      return { theta, rope: { type: 'linear', factor: p.factor } };
    case 'llama3':
      if (p?.factor === undefined || p.low_freq_factor === undefined || p.high_freq_factor === undefined || p.original_max_position_embeddings === undefined) {
        bad(file, "rope type 'llama3' needs factor, low_freq_factor, high_freq_factor and original_max_position_embeddings");
      }
      return {
        theta,
        rope: { type: 'llama3', factor: p.factor, lowFreqFactor: p.low_freq_factor, highFreqFactor: p.high_freq_factor, originalMaxPositions: p.original_max_position_embeddings },
      };
    default:
      throw new ModelError(ModelCode.BAD_CONFIG, `${file}: rope type '${type}' is not supported (supported: default, linear, llama3)`);
  }
}

/**
 * Parses a Llama-family HF `config.json` (`llama`, `mistral` with or without sliding windows, `qwen2`, `mixtral`).
 * Other architectures are `MODEL_UNSUPPORTED_ARCH`; malformed or unsupported fields are
 * `MODEL_BAD_CONFIG` naming the file and field.
 */
export function parseLlamaConfig(text: string, file = 'config.json'): LlamaConfig {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (e) {
    throw new ModelError(ModelCode.BAD_CONFIG, `${file} is not JSON: ${errorMessage(e)}`, { cause: e });
  }
  const type = (raw as { model_type?: unknown } | null)?.model_type;
  if (typeof type !== 'string' || !LLAMA_FAMILY.has(type)) {
    const arch = (raw as { architectures?: unknown } | null)?.architectures;
    throw new ModelError(ModelCode.UNSUPPORTED_ARCH, `${file}: model_type ${JSON.stringify(type)}${Array.isArray(arch) ? ` (${arch.join(', ')})` : ''} is not a supported architecture (llama, mistral, qwen2, mixtral)`);
  }
  const parsed = schema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    bad(file, `field '${issue.path.join('.')}': ${issue.message}`);
  }
  const c = parsed.data;
  if (c.hidden_act !== 'silu') bad(file, `hidden_act '${c.hidden_act}' is not supported (silu)`);
  if (type === 'qwen2' && c.use_sliding_window === true) bad(file, 'use_sliding_window: Qwen2 windows only the layers past max_window_layers, which is not supported');
  const windowed = c.sliding_window !== null && c.sliding_window !== undefined && c.use_sliding_window !== false && (type === 'mistral' || type === 'mixtral');
  if (windowed && c.sliding_window! < 1) bad(file, `field 'sliding_window': must be a positive integer, got ${String(c.sliding_window)}`);
  const numKvHeads = c.num_key_value_heads ?? c.num_attention_heads;
  const headDim = c.head_dim ?? c.hidden_size / c.num_attention_heads;
  if (!Number.isInteger(headDim)) bad(file, `hidden_size ${String(c.hidden_size)} is not divisible by num_attention_heads ${String(c.num_attention_heads)}`);
  if (c.num_attention_heads % numKvHeads !== 0) bad(file, 'num_attention_heads must be a multiple of num_key_value_heads');
  const { theta, rope } = parseRope(file, c);
  const eos = c.eos_token_id;
  return {
    modelType: type,
    vocabSize: c.vocab_size,
    hiddenSize: c.hidden_size,
    intermediateSize: c.intermediate_size,
    numLayers: c.num_hidden_layers,
    numHeads: c.num_attention_heads,
    numKvHeads,
    headDim,
    rmsNormEps: c.rms_norm_eps,
    ropeTheta: theta,
    rope,
    tieWordEmbeddings: c.tie_word_embeddings,
    attentionBias: c.attention_bias,
    mlpBias: c.mlp_bias,
    qkvBias: type === 'qwen2',
    maxPositions: c.max_position_embeddings,
    eosTokenIds: eos === null || eos === undefined ? [] : Array.isArray(eos) ? eos : [eos],
    bosTokenId: c.bos_token_id ?? undefined,
    ...(type === 'mixtral' ? { moe: parseMoe(file, c) } : {}),
    ...(windowed && c.sliding_window! < c.max_position_embeddings ? { slidingWindow: c.sliding_window! } : {}),
  };
}

function parseMoe(file: string, c: z.infer<typeof schema>): MoeShape {
  if (c.num_local_experts === undefined || c.num_experts_per_tok === undefined) bad(file, 'mixtral needs num_local_experts and num_experts_per_tok');
  if (c.num_experts_per_tok > c.num_local_experts) bad(file, 'num_experts_per_tok exceeds num_local_experts');
  return { numExperts: c.num_local_experts, topK: c.num_experts_per_tok };
}

/**
 * Rotary inverse frequencies as HF computes them in float32: θ^(−2i/d) for i < d/2, then the
 * scaling of `rope` (linear divides by the factor; llama3 divides low frequencies, keeps high ones
 * and blends in between).
 */
export function ropeInvFreqFor(headDim: number, theta: number, rope: RopeScaling = { type: 'default' }): number[] {
  const f = Math.fround;
  const base = Array.from({ length: headDim / 2 }, (_, i) => f(1 / f(f(theta) ** f((2 * i) / headDim))));
  switch (rope.type) {
    case 'default':
      return base;
    case 'linear':
      return base.map((v) => f(v / rope.factor));
    case 'llama3': {
      const lowWavelen = rope.originalMaxPositions / rope.lowFreqFactor;
      const highWavelen = rope.originalMaxPositions / rope.highFreqFactor;
      return base.map((inv) => {
        const wavelen = (2 * Math.PI) / inv;
        if (wavelen > lowWavelen) return f(inv / rope.factor);
        if (wavelen < highWavelen) return inv;
        const smooth = (rope.originalMaxPositions / wavelen - rope.lowFreqFactor) / (rope.highFreqFactor - rope.lowFreqFactor);
        return f((1 - smooth) * (inv / rope.factor) + smooth * inv);
      });
    }
  }
}

/**
 * Reads and parses `dir/config.json` (`parseLlamaConfig`); an unreadable file is `MODEL_IO` naming
 * the path, a malformed one `MODEL_BAD_CONFIG`.
 */
export async function readLlamaConfig(dir: string): Promise<LlamaConfig> {
  const file = join(dir, 'config.json');
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (e) {
    throw new ModelError(ModelCode.IO, `cannot read ${file}: ${errorMessage(e)}`, { cause: e });
  }
  return parseLlamaConfig(text, file);
}
