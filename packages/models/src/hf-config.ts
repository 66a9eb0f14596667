import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { ModelCode, ModelError } from './errors.js';
import type { LlamaShape, RotaryTables } from './llama-graph.js';
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
    }
  | {
      /** Phi-3's LongRoPE (`longrope`, legacy `su` / `yarn` in Phi-3 configs): per-frequency factors. */
      readonly type: 'longrope';
      readonly shortFactor: readonly number[];
      readonly longFactor: readonly number[];
      readonly originalMaxPositions: number;
      /** cos/sin multiplier (`attention_factor`, else √(1 + ln f / ln original) for f > 1). */
      readonly attentionFactor: number;
    };

/** A Llama-family model configuration (Mixtral included), parsed from HF `config.json`. */
export interface LlamaConfig extends LlamaShape {
  /** Mixture-of-experts layout (Mixtral), when the MLPs are routed experts. */
  readonly moe?: MoeShape;
  /** HF `model_type` (one of `SUPPORTED_MODEL_TYPES`). */
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
  /** Rotary of the sliding-window layers when it differs (Gemma 3's `rope_parameters.sliding_attention`). */
  readonly localRope?: { readonly theta: number; readonly rope: RopeScaling };
}

/** The `model_type`s this package runs (Gemma 3 as its text model, `gemma3_text`). */
export const SUPPORTED_MODEL_TYPES = ['llama', 'mistral', 'qwen2', 'mixtral', 'qwen3', 'qwen3_moe', 'olmo2', 'phi3', 'gemma2', 'gemma3_text'] as const;

/** Mixture-of-experts fields (Mixtral): the MLP of every layer is a routed set of experts. */
export interface MoeShape {
  /** Experts per layer (`num_local_experts`). */
  readonly numExperts: number;
  /** Experts each token is routed to (`num_experts_per_tok`). */
  readonly topK: number;
  /** Per-expert MLP width (Qwen3-MoE's `moe_intermediate_size`); default `intermediate_size`. */
  readonly intermediateSize?: number;
  /** Renormalize the top-k routing weights (Qwen3-MoE's `norm_topk_prob`; Mixtral always). */
  readonly normalize?: boolean;
  /** Which layers are MoE (Qwen3-MoE's `mlp_only_layers` / `decoder_sparse_step`); default all. */
  readonly layers?: readonly boolean[];
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
  short_factor: z.array(z.number()).optional(),
  long_factor: z.array(z.number()).optional(),
  attention_factor: z.number().positive().nullish(),
  partial_rotary_factor: z.number().positive().max(1).optional(),
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
  tie_word_embeddings: z.boolean().optional(),
  attention_bias: z.boolean().optional().default(false),
  mlp_bias: z.boolean().optional().default(false),
  max_position_embeddings: pos.optional().default(2048),
  eos_token_id: z.union([z.number().int(), z.array(z.number().int())]).nullish(),
  bos_token_id: z.number().int().nullish(),
  sliding_window: z.number().int().nullish(),
  num_local_experts: pos.optional(),
  num_experts_per_tok: pos.optional(),
  use_sliding_window: z.boolean().optional(),
  max_window_layers: z.number().int().nonnegative().optional(),
  layer_types: z.array(z.string()).nullish(),
  sliding_window_pattern: pos.optional(),
  hidden_activation: z.string().nullish(),
  query_pre_attn_scalar: z.number().positive().optional(),
  final_logit_softcapping: z.number().positive().nullish(),
  attn_logit_softcapping: z.number().positive().nullish(),
  rope_local_base_freq: z.number().positive().optional(),
  partial_rotary_factor: z.number().positive().max(1).optional(),
  original_max_position_embeddings: pos.optional(),
  use_bidirectional_attention: z.boolean().nullish(),
  num_experts: z.number().int().nonnegative().optional(),
  moe_intermediate_size: pos.optional(),
  norm_topk_prob: z.boolean().optional(),
  decoder_sparse_step: pos.optional(),
  mlp_only_layers: z.array(z.number().int().nonnegative()).nullish(),
});

const SUPPORTED = new Set<string>(SUPPORTED_MODEL_TYPES);

function bad(file: string, msg: string): never {
  throw new ModelError(ModelCode.BAD_CONFIG, `${file}: ${msg}`);
}

type RopeDict = z.infer<typeof ropeSchema>;

function parseRope(file: string, c: z.infer<typeof schema>, p: RopeDict | undefined, defaultTheta = 10000): { theta: number; rope: RopeScaling } {
  const theta = p?.rope_theta ?? c.rope_theta ?? defaultTheta;
  let type = p?.rope_type ?? p?.type ?? 'default';
  if (c.model_type === 'phi3' && (type === 'su' || type === 'yarn')) type = 'longrope';
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
    case 'longrope': {
      const original = c.original_max_position_embeddings ?? p?.original_max_position_embeddings;
      if (p?.short_factor === undefined || p.long_factor === undefined || original === undefined) bad(file, "rope type 'longrope' needs short_factor, long_factor and original_max_position_embeddings");
      const factor = p.factor ?? c.max_position_embeddings / original;
      const attentionFactor = p.attention_factor ?? (factor <= 1 ? 1 : Math.sqrt(1 + Math.log(factor) / Math.log(original)));
      return { theta, rope: { type: 'longrope', shortFactor: p.short_factor, longFactor: p.long_factor, originalMaxPositions: original, attentionFactor } };
    }
    default:
      throw new ModelError(ModelCode.BAD_CONFIG, `${file}: rope type '${type}' is not supported (supported: default, linear, llama3, longrope)`);
  }
}

/** `rope_parameters` split by layer type (Gemma 2/3's `{ full_attention: …, sliding_attention: … }`), or one dict for all layers. */
function ropeDicts(file: string, c: z.infer<typeof schema>): { global: RopeDict | undefined; local: RopeDict | undefined } {
  const p = (c.rope_parameters ?? undefined) as Record<string, unknown> | undefined;
  if (p !== undefined && ('full_attention' in p || 'sliding_attention' in p)) {
    const one = (key: string): RopeDict | undefined => {
      const r = ropeSchema.safeParse(p[key] ?? {});
      if (!r.success) bad(file, `field 'rope_parameters.${key}': ${r.error.issues[0]!.message}`);
      return r.data;
    };
    return { global: one('full_attention'), local: one('sliding_attention') };
  }
  return { global: c.rope_parameters ?? c.rope_scaling ?? undefined, local: undefined };
}

function parseActivation(file: string, act: string): 'silu' | 'gelu_tanh' | 'gelu' {
  switch (act) {
    case 'silu':
    case 'swish':
      return 'silu';
    case 'gelu_pytorch_tanh':
    case 'gelu_new':
      return 'gelu_tanh';
    case 'gelu':
      return 'gelu';
    default:
      return bad(file, `hidden activation '${act}' is not supported (silu, gelu_pytorch_tanh, gelu_new, gelu)`);
  }
}

/** Per-layer sliding windows as HF builds `layer_types` (given, or each family's default pattern). */
function layerWindowsOf(file: string, c: z.infer<typeof schema>): (number | null)[] | undefined {
  const type = c.model_type;
  const n = c.num_hidden_layers;
  const w = c.sliding_window ?? null;
  let kinds: readonly string[] | undefined = c.layer_types ?? undefined;
  let window: number | null = w;
  if (type === 'gemma2' || type === 'gemma3_text') {
    if (c.use_bidirectional_attention === true) bad(file, 'use_bidirectional_attention: bidirectional Gemma (embedding models) is not supported');
    if (c.sliding_window === undefined) window = 4096;
    const pattern = type === 'gemma2' ? 2 : (c.sliding_window_pattern ?? 6);
    kinds ??= Array.from({ length: n }, (_, i) => ((i + 1) % pattern !== 0 ? 'sliding_attention' : 'full_attention'));
  } else if (type === 'qwen3' || type === 'qwen3_moe') {
    if (c.use_sliding_window !== true) window = null;
    const first = c.max_window_layers ?? 28;
    kinds ??= Array.from({ length: n }, (_, i) => (window !== null && i >= first ? 'sliding_attention' : 'full_attention'));
  } else if (type === 'phi3') {
    kinds = Array.from({ length: n }, () => (window === null ? 'full_attention' : 'sliding_attention'));
  } else {
    return undefined;
  }
  if (kinds.length !== n) bad(file, `field 'layer_types': ${String(kinds.length)} entries for ${String(n)} layers`);
  const unknown = kinds.find((k) => k !== 'sliding_attention' && k !== 'full_attention');
  if (unknown !== undefined) bad(file, `field 'layer_types': '${unknown}' is not supported (sliding_attention, full_attention)`);
  if (window !== null && window < 1) bad(file, `field 'sliding_window': must be a positive integer, got ${String(window)}`);
  // A window at least the model's length never hides a key (Phi-4-mini's 262144).
  const effective = window !== null && window < c.max_position_embeddings ? window : null;
  const out = kinds.map((k) => (k === 'sliding_attention' ? effective : null));
  return out.some((x) => x !== null) ? out : undefined;
}

/**
 * Parses an HF `config.json` of a supported decoder family (`SUPPORTED_MODEL_TYPES`: Llama, Mistral
 * with or without sliding windows, Qwen2, Mixtral, Qwen3, Qwen3-MoE, OLMo 2, Phi-3 / Phi-4-mini,
 * Gemma 2, Gemma 3 text) exactly as transformers 5.17 reads it, defaults included.
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
  // Gemma 3's multimodal wrapper (gemma-3-4b and up) serves as its text model: the text_config's
  // fields, the wrapper's token ids where the text config has none.
  const wrapper = raw as { model_type?: unknown; text_config?: unknown; eos_token_id?: unknown; bos_token_id?: unknown } | null;
  if (wrapper?.model_type === 'gemma3' && typeof wrapper.text_config === 'object' && wrapper.text_config !== null) {
    raw = { eos_token_id: wrapper.eos_token_id, bos_token_id: wrapper.bos_token_id, ...(wrapper.text_config as Record<string, unknown>), model_type: 'gemma3_text', architectures: ['Gemma3ForConditionalGeneration'] };
  }
  const type = (raw as { model_type?: unknown } | null)?.model_type;
  if (typeof type !== 'string' || !SUPPORTED.has(type)) {
    const arch = (raw as { architectures?: unknown } | null)?.architectures;
    const hint = type === 'gemma3' ? '; a gemma3 config needs its text_config' : '';
    throw new ModelError(ModelCode.UNSUPPORTED_ARCH, `${file}: model_type ${JSON.stringify(type)}${Array.isArray(arch) ? ` (${arch.join(', ')})` : ''} is not a supported architecture (supported: ${SUPPORTED_MODEL_TYPES.join(', ')})${hint}`);
  }
  const parsed = schema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    bad(file, `field '${issue.path.join('.')}': ${issue.message}`);
  }
  const c = parsed.data;
  const gemma = type === 'gemma2' || type === 'gemma3_text';
  const hiddenAct = parseActivation(file, gemma ? (c.hidden_activation ?? 'gelu_pytorch_tanh') : c.hidden_act);
  if (!gemma && hiddenAct !== 'silu') bad(file, `hidden_act '${c.hidden_act}' is not supported for ${type} (silu)`);
  if (type === 'qwen2' && c.use_sliding_window === true) bad(file, 'use_sliding_window: Qwen2 windows only the layers past max_window_layers, which is not supported');
  const windowed = c.sliding_window !== null && c.sliding_window !== undefined && c.use_sliding_window !== false && (type === 'mistral' || type === 'mixtral');
  if (windowed && c.sliding_window! < 1) bad(file, `field 'sliding_window': must be a positive integer, got ${String(c.sliding_window)}`);
  const numKvHeads = c.num_key_value_heads ?? c.num_attention_heads;
  // Defaults as transformers' config classes: Qwen3(-MoE) 128, Gemma 2/3 256, others hidden / heads.
  const headDim = c.head_dim ?? (type === 'qwen3' || type === 'qwen3_moe' ? 128 : gemma ? 256 : c.hidden_size / c.num_attention_heads);
  if (!Number.isInteger(headDim)) bad(file, `hidden_size ${String(c.hidden_size)} is not divisible by num_attention_heads ${String(c.num_attention_heads)}`);
  if (c.num_attention_heads % numKvHeads !== 0) bad(file, 'num_attention_heads must be a multiple of num_key_value_heads');
  const dicts = ropeDicts(file, c);
  const { theta, rope } = parseRope(file, c, dicts.global, type === 'gemma3_text' ? 1000000 : 10000);
  const local = type === 'gemma3_text' ? parseRope(file, { ...c, rope_theta: c.rope_local_base_freq ?? 10000 }, dicts.local ?? {}, c.rope_local_base_freq ?? 10000) : undefined;
  const partial = type === 'phi3' ? (dicts.global?.partial_rotary_factor ?? c.partial_rotary_factor ?? 1) : 1;
  const rotaryDim = Math.trunc(headDim * partial);
  if (rotaryDim % 2 !== 0 || rotaryDim < 2) bad(file, `partial_rotary_factor ${String(partial)} gives ${String(rotaryDim)} rotary dims of head_dim ${String(headDim)}: must be even and at least 2`);
  if (rope.type === 'longrope' && (rope.shortFactor.length !== rotaryDim / 2 || rope.longFactor.length !== rotaryDim / 2)) {
    bad(file, `rope short_factor / long_factor have ${String(rope.shortFactor.length)} / ${String(rope.longFactor.length)} entries; ${String(rotaryDim)} rotary dims need ${String(rotaryDim / 2)}`);
  }
  const layerWindows = layerWindowsOf(file, c);
  // Gemma 2's config defaults soft-capping on (30 / 50); Gemma 3's off.
  const finalSoftcap = c.final_logit_softcapping === undefined ? (type === 'gemma2' ? 30 : null) : c.final_logit_softcapping;
  const attnSoftcap = c.attn_logit_softcapping === undefined ? (type === 'gemma2' ? 50 : null) : c.attn_logit_softcapping;
  const eos = c.eos_token_id;
  const family: Partial<LlamaConfig> = {
    ...(hiddenAct !== 'silu' ? { hiddenAct } : {}),
    ...(gemma
      ? {
          normOffset: true,
          normLayout: 'sandwich' as const,
          embedScale: Math.fround(Math.sqrt(c.hidden_size)),
          attentionScale: (c.query_pre_attn_scalar ?? 256) ** -0.5,
          ...(finalSoftcap === null ? {} : { finalSoftcap }),
          ...(attnSoftcap === null ? {} : { attnSoftcap }),
        }
      : {}),
    ...(type === 'gemma3_text' || type === 'qwen3' || type === 'qwen3_moe' ? { qkNorm: 'head' as const } : {}),
    ...(type === 'olmo2' ? { qkNorm: 'projection' as const, normLayout: 'post' as const } : {}),
    ...(type === 'phi3' ? { fusedQkv: true, fusedGateUp: true } : {}),
    ...(rotaryDim !== headDim ? { rotaryDim } : {}),
    ...(layerWindows === undefined ? {} : { layerWindows }),
    ...(local === undefined ? {} : { localRope: { theta: local.theta, rope: local.rope } }),
  };
  return {
    ...family,
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
    // Absent: transformers' config defaults (Gemma 2/3 tie, the others do not).
    tieWordEmbeddings: c.tie_word_embeddings ?? gemma,
    attentionBias: c.attention_bias,
    mlpBias: c.mlp_bias,
    qkvBias: type === 'qwen2',
    maxPositions: c.max_position_embeddings,
    eosTokenIds: eos === null || eos === undefined ? [] : Array.isArray(eos) ? eos : [eos],
    bosTokenId: c.bos_token_id ?? undefined,
    ...(type === 'mixtral' ? { moe: parseMoe(file, c) } : type === 'qwen3_moe' ? parseQwen3Moe(file, c) : {}),
    ...(windowed && c.sliding_window! < c.max_position_embeddings ? { slidingWindow: c.sliding_window! } : {}),
  };
}

function parseMoe(file: string, c: z.infer<typeof schema>): MoeShape {
  if (c.num_local_experts === undefined || c.num_experts_per_tok === undefined) bad(file, 'mixtral needs num_local_experts and num_experts_per_tok');
  if (c.num_experts_per_tok > c.num_local_experts) bad(file, 'num_experts_per_tok exceeds num_local_experts');
  return { numExperts: c.num_local_experts, topK: c.num_experts_per_tok };
}

function parseQwen3Moe(file: string, c: z.infer<typeof schema>): { moe?: MoeShape } {
  const experts = c.num_experts ?? c.num_local_experts ?? 0;
  const mlpOnly = new Set(c.mlp_only_layers ?? []);
  const step = c.decoder_sparse_step ?? 1;
  const layers = Array.from({ length: c.num_hidden_layers }, (_, l) => !mlpOnly.has(l) && experts > 0 && (l + 1) % step === 0);
  if (!layers.some((x) => x)) return {};
  const topK = c.num_experts_per_tok ?? 8;
  if (topK > experts) bad(file, 'num_experts_per_tok exceeds num_experts');
  if (c.moe_intermediate_size === undefined) bad(file, 'qwen3_moe needs moe_intermediate_size');
  return { moe: { numExperts: experts, topK, intermediateSize: c.moe_intermediate_size, normalize: c.norm_topk_prob ?? false, layers } };
}

/**
 * The rotary tables of a parsed config for `buildLlamaGraph` (`rotary` option): the global
 * layers' frequencies over the rotary dims, longrope's long factors and attention factor, and the
 * sliding layers' own base (Gemma 3).
 */
export function rotaryTablesFor(config: LlamaConfig): RotaryTables {
  const rd = config.rotaryDim ?? config.headDim;
  const rope = config.rope;
  const local = config.localRope === undefined ? undefined : ropeInvFreqFor(rd, config.localRope.theta, config.localRope.rope);
  const localPart = local === undefined ? {} : { localInvFreq: local };
  if (rope.type !== 'longrope') return { invFreq: ropeInvFreqFor(rd, config.ropeTheta, rope), ...localPart };
  return {
    invFreq: ropeInvFreqFor(rd, config.ropeTheta, rope),
    long: { invFreq: longropeInvFreq(rd, config.ropeTheta, rope.longFactor), originalMax: rope.originalMaxPositions },
    ...(rope.attentionFactor === 1 ? {} : { scale: rope.attentionFactor }),
    ...localPart,
  };
}

/** The graph options every caller of `buildLlamaGraph` passes for a parsed config: rotary tables, the window table's length, Qwen2's q/k/v bias. */
export function familyGraphOptions(config: LlamaConfig): { rotary: RotaryTables; windowLimit: number; qkvBias: boolean } {
  return { rotary: rotaryTablesFor(config), windowLimit: Math.max(config.maxPositions, 1), qkvBias: config.qkvBias };
}

function longropeInvFreq(dim: number, theta: number, factors: readonly number[]): number[] {
  const f = Math.fround;
  return Array.from({ length: dim / 2 }, (_, i) => f(1 / f(f(factors[i]!) * f(f(theta) ** f((2 * i) / dim)))));
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
    case 'longrope':
      return longropeInvFreq(headDim, theta, rope.shortFactor);
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
