import { type Graph, GraphBuilder, IrCode, IrError, type Value } from '@stageml/ir';
import { moeBlock } from '@stageml/moe';

/** The shape-defining fields of a Llama-family decoder (names follow HF `LlamaConfig`, camelCased). */
export interface LlamaShape {
  /** Vocabulary size. */
  readonly vocabSize: number;
  /** Model width. */
  readonly hiddenSize: number;
  /** MLP width. */
  readonly intermediateSize: number;
  /** Decoder layers. */
  readonly numLayers: number;
  /** Query heads. */
  readonly numHeads: number;
  /** Key/value heads (grouped-query attention when fewer than query heads). */
  readonly numKvHeads: number;
  /** Per-head width; defaults to hiddenSize / numHeads. */
  readonly headDim?: number;
  /** RMSNorm epsilon. */
  readonly rmsNormEps?: number;
  /** RoPE base. */
  readonly ropeTheta?: number;
  /** Whether lm_head shares the embedding matrix. */
  readonly tieWordEmbeddings?: boolean;
  /** Bias on q/k/v/o projections. */
  readonly attentionBias?: boolean;
  /** Bias on gate/up/down projections. */
  readonly mlpBias?: boolean;
  /** Routed experts instead of a dense MLP (Mixtral); `intermediateSize` is then per expert. */
  readonly moe?: { readonly numExperts: number; readonly topK: number };
}

/** Sizes of one MoE layer. */
export interface MoeLayerShape {
  readonly numExperts: number;
  readonly topK: number;
  readonly hidden: number;
  readonly intermediate: number;
}

/**
 * Makes the MoE MLP of one layer over token rows x [T, H]; `module` is the HF module path
 * (`model.layers.0.mlp`). The default reads `<module>.gate.weight` [E, H],
 * `<module>.experts.gate_up_proj` [E, 2I, H] and `<module>.experts.down_proj` [E, H, I].
 */
export type ExpertsFactory = (b: GraphBuilder, module: string, x: Value, shape: MoeLayerShape) => Value;

/** The base MoE layer (no adapter). */
export const plainExperts: ExpertsFactory = (b, module, x, s) =>
  moeBlock(
    b,
    x,
    {
      router: b.param(`${module}.gate.weight`, ['f32', [s.numExperts, s.hidden]]),
      gateUp: b.param(`${module}.experts.gate_up_proj`, ['f32', [s.numExperts, 2 * s.intermediate, s.hidden]]),
      down: b.param(`${module}.experts.down_proj`, ['f32', [s.numExperts, s.hidden, s.intermediate]]),
    },
    { topK: s.topK, normalize: true },
  );

/** Projections a LoRA adapter can target, by their HF module names. */
export const LLAMA_PROJECTIONS = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] as const;

/** One of `LLAMA_PROJECTIONS`. */
export type LlamaProjection = (typeof LLAMA_PROJECTIONS)[number];

/** LoRA factors attached as parameters: y = x·Wᵀ + scale·(x·Aᵀ)·Bᵀ on each targeted projection. */
export interface LlamaLoraShape {
  /** Rank r of A [r, in] and B [out, r]. */
  readonly rank: number;
  /** Scale s (lora_alpha / r, or / √r with rsLoRA). */
  readonly scale: number;
  /** Targeted projections (default: all seven). */
  readonly targets?: readonly LlamaProjection[];
}

/**
 * Makes the linear layer of one module: `x·Wᵀ (+ b)` with parameters `<module>.weight` and
 * `<module>.bias`, or any variant (LoRA residual or merged, a mixed-adapter bank). `module` is the
 * HF module path (`model.layers.0.self_attn.q_proj`).
 */
export type LinearFactory = (b: GraphBuilder, module: string, x: Value, inDim: number, outDim: number, bias: boolean) => Value;

/** The plain linear layer: parameters `<module>.weight` [out, in] and optionally `<module>.bias`. */
export const plainLinear: LinearFactory = (b, module, x, inDim, outDim, bias) =>
  b.linear(x, b.param(`${module}.weight`, ['f32', [outDim, inDim]]), bias ? b.param(`${module}.bias`, ['f32', [outDim]]) : undefined);

/** Options of `buildLlamaGraph`. */
export interface LlamaGraphOptions {
  /** Graph name (default `llama`). */
  readonly name?: string;
  /** Attach the same-shaped LoRA factors to every targeted projection (benchmarks, shape studies). */
  readonly lora?: LlamaLoraShape;
  /** How each projection is built (default `plainLinear`); overrides `lora`. */
  readonly linear?: LinearFactory;
  /**
   * Take a KV cache: inputs `past_key.<l>` / `past_value.<l>` f32[batch, kv_heads, past, head_dim]
   * and outputs `present_key.<l>` / `present_value.<l>` with `past + seq` positions. Attention is
   * causal aligned to the end, so the same graph does prefill (past = 0) and decode.
   */
  readonly kvCache?: boolean;
  /** How each MoE layer is built (default `plainExperts`). */
  readonly experts?: ExpertsFactory;
  /** Rotary inverse frequencies (default: θ^(−2i/d) with `ropeTheta`). */
  readonly invFreq?: readonly number[];
  /** Bias on q/k/v only (Qwen2). */
  readonly qkvBias?: boolean;
  /**
   * Take an additive key mask `attention_mask` f32[batch, past + seq] (0 to attend, a large
   * negative number to ignore a key, as HF builds from a 0/1 mask), applied on top of causality:
   * padding and tokens a caller wants ignored.
   */
  readonly attentionMask?: boolean;
  /**
   * With `attentionMask`: the mask is per query, f32[batch, seq, past + seq], so a caller can
   * express sliding-window attention (Mistral) on top of causality.
   */
  readonly perQueryMask?: boolean;
  /**
   * Serving-engine KV form (implies a KV cache): inputs `past_key.<l>` / `past_value.<l>` are
   * position-major f32[batch, past, kv_heads, head_dim] (a sequence's filled prefix is contiguous,
   * so a resident buffer is fed without copying) and the outputs are only this step's keys/values
   * `new_key.<l>` / `new_value.<l>` f32[batch, seq, kv_heads, head_dim], which the caller appends
   * in place; each layer's attention is one `cachedAttention` op over the cache and the step's keys.
   */
  readonly residentKv?: boolean;
  /** Output `logits` f32[batch, vocab] for the last position only (prefill needs no more). */
  readonly lastLogitsOnly?: boolean;
}

function check(cond: boolean, msg: string): void {
  if (!cond) throw new IrError(IrCode.BAD_ATTR, `llama config: ${msg}`);
}

/** Rotary inverse frequencies θ^(−2i/d), i < d/2 (HF default rope). */
export function ropeInvFreq(headDim: number, theta: number): number[] {
  return Array.from({ length: headDim / 2 }, (_, i) => 1 / theta ** ((2 * i) / headDim));
}

function loraFactory(lora: LlamaLoraShape): LinearFactory {
  const targets = new Set<string>(lora.targets ?? LLAMA_PROJECTIONS);
  return (b, module, x, inDim, outDim, bias) => {
    const base = plainLinear(b, module, x, inDim, outDim, bias);
    if (!targets.has(module.slice(module.lastIndexOf('.') + 1))) return base;
    const A = b.param(`${module}.lora_A.weight`, ['f32', [lora.rank, inDim]]);
    const B = b.param(`${module}.lora_B.weight`, ['f32', [outDim, lora.rank]]);
    return b.add(base, b.mul(b.linear(b.linear(x, A), B), b.scalar(lora.scale)));
  };
}

/**
 * Builds a Llama-family decoder forward pass as IR over symbolic `batch` and `seq` (and `past`
 * with a KV cache), with parameters named as in HF checkpoints
 * (`model.layers.0.self_attn.q_proj.weight`). Inputs: `input_ids` i64[batch, seq] and
 * `position_ids` i64[batch, seq]. Output: `logits` f32[batch, seq, vocab]. Only shapes are needed,
 * so a 7B-shaped graph builds without weights.
 */
export function buildLlamaGraph(cfg: LlamaShape, opts: LlamaGraphOptions = {}): Graph {
  const H = cfg.hiddenSize;
  const nh = cfg.numHeads;
  const nkv = cfg.numKvHeads;
  const hd = cfg.headDim ?? H / nh;
  for (const [k, v] of Object.entries({ vocabSize: cfg.vocabSize, hiddenSize: H, intermediateSize: cfg.intermediateSize, numLayers: cfg.numLayers, numHeads: nh, numKvHeads: nkv, headDim: hd })) {
    check(Number.isSafeInteger(v) && v > 0, `${k} must be a positive integer, got ${String(v)}`);
  }
  check(nh % nkv === 0, `numHeads ${String(nh)} must be a multiple of numKvHeads ${String(nkv)}`);
  check(hd % 2 === 0, `headDim ${String(hd)} must be even for rotary embeddings`);
  const eps = cfg.rmsNormEps ?? 1e-6;
  const linear = opts.linear ?? (opts.lora === undefined ? plainLinear : loraFactory(opts.lora));
  const b = new GraphBuilder(opts.name ?? 'llama');

  const ids = b.input('input_ids', ['i64', ['batch', 'seq']]);
  const pos = b.input('position_ids', ['i64', ['batch', 'seq']]);
  const resident = opts.residentKv === true;
  const cached = opts.kvCache === true || resident;
  const past = cached
    ? Array.from({ length: cfg.numLayers }, (_, l) => {
        const shape = resident ? ['batch', 'past', nkv, hd] : ['batch', nkv, 'past', hd];
        const k = b.input(`past_key.${String(l)}`, ['f32', shape]);
        const v = b.input(`past_value.${String(l)}`, ['f32', shape]);
        return { k, v };
      })
    : undefined;
  const keyLen = cached ? 'past + seq' : 'seq';
  const keyMask = opts.attentionMask !== true
    ? undefined
    : opts.perQueryMask === true
      ? b.reshape(b.input('attention_mask', ['f32', ['batch', 'seq', keyLen]]), ['batch', 1, 'seq', -1])
      : b.reshape(b.input('attention_mask', ['f32', ['batch', keyLen]]), ['batch', 1, 1, -1]);
  const embed = b.param('model.embed_tokens.weight', ['f32', [cfg.vocabSize, H]]);

  // cos/sin tables [batch, 1, seq, hd], shared by every layer.
  const [cos, sin] = b.scope('rope', () => {
    const inv = b.constant(opts.invFreq ?? ropeInvFreq(hd, cfg.ropeTheta ?? 10000), 'f32', [hd / 2]);
    const p = b.reshape(b.cast(pos, 'f32'), ['batch', 'seq', 1]);
    const freqs = b.mul(p, inv);
    const emb = b.reshape(b.concat([freqs, freqs], -1), ['batch', 1, 'seq', hd]);
    return [b.cos(emb), b.sin(emb)] as const;
  });

  const heads = (x: Value, n: number): Value => b.transpose(b.reshape(x, ['batch', 'seq', n, hd]), [0, 2, 1, 3]);
  const presents: { k: Value; v: Value }[] = [];

  let h = b.gather(embed, ids);
  for (let l = 0; l < cfg.numLayers; l++) {
    const prefix = `model.layers.${String(l)}`;
    h = b.scope(`layers.${String(l)}`, () => {
      const attnIn = b.rmsNorm(h, b.param(`${prefix}.input_layernorm.weight`, ['f32', [H]]), eps);
      const ap = `${prefix}.self_attn`;
      const ab = cfg.attentionBias === true;
      const qkvb = ab || opts.qkvBias === true;
      const q = b.rotary(heads(linear(b, `${ap}.q_proj`, attnIn, H, nh * hd, qkvb), nh), cos, sin);
      let k = b.rotary(heads(linear(b, `${ap}.k_proj`, attnIn, H, nkv * hd, qkvb), nkv), cos, sin);
      let v = heads(linear(b, `${ap}.v_proj`, attnIn, H, nkv * hd, qkvb), nkv);
      const cache = past?.[l];
      let attn: Value;
      if (cache !== undefined && resident) {
        // The position-major resident cache and this step's keys/values in one op: executors that
        // own the cache read it in place; the others expand it to transpose + concat + attention.
        presents.push({ k: b.transpose(k, [0, 2, 1, 3]), v: b.transpose(v, [0, 2, 1, 3]) });
        attn = b.cachedAttention(q, cache.k, cache.v, k, v, { causal: true }, keyMask);
      } else {
        if (cache !== undefined) {
          k = b.concat([cache.k, k], 2);
          v = b.concat([cache.v, v], 2);
          presents.push({ k, v });
        }
        attn = b.attention(q, k, v, { causal: true }, keyMask);
      }
      const merged = b.reshape(b.transpose(attn, [0, 2, 1, 3]), ['batch', 'seq', nh * hd]);
      const h1 = b.add(h, linear(b, `${ap}.o_proj`, merged, nh * hd, H, ab));
      const mlpIn = b.rmsNorm(h1, b.param(`${prefix}.post_attention_layernorm.weight`, ['f32', [H]]), eps);
      const mp = `${prefix}.mlp`;
      if (cfg.moe !== undefined) {
        const rows = b.reshape(mlpIn, [-1, H]);
        const moe = (opts.experts ?? plainExperts)(b, mp, rows, { numExperts: cfg.moe.numExperts, topK: cfg.moe.topK, hidden: H, intermediate: cfg.intermediateSize });
        return b.add(h1, b.reshape(moe, ['batch', 'seq', H]));
      }
      const mb = cfg.mlpBias === true;
      const gate = b.silu(linear(b, `${mp}.gate_proj`, mlpIn, H, cfg.intermediateSize, mb));
      const up = linear(b, `${mp}.up_proj`, mlpIn, H, cfg.intermediateSize, mb);
      return b.add(h1, linear(b, `${mp}.down_proj`, b.mul(gate, up), cfg.intermediateSize, H, mb));
    });
  }
  const last = opts.lastLogitsOnly === true ? b.reshape(b.slice(h, 1, -1), ['batch', H]) : h;
  const normed = b.rmsNorm(last, b.param('model.norm.weight', ['f32', [H]]), eps);
  const head = cfg.tieWordEmbeddings === true ? embed : b.param('lm_head.weight', ['f32', [cfg.vocabSize, H]]);
  b.output('logits', b.linear(normed, head));
  presents.forEach((p, l) => {
    b.output(`${resident ? 'new' : 'present'}_key.${String(l)}`, p.k);
    b.output(`${resident ? 'new' : 'present'}_value.${String(l)}`, p.v);
  });
  return b.build();
}

/** Llama-2-7B's shape with grouped-query attention (8 kv heads), as the benchmark uses. */
export const LLAMA_7B_GQA_SHAPE: LlamaShape = {
  vocabSize: 32000,
  hiddenSize: 4096,
  intermediateSize: 11008,
  numLayers: 32,
  numHeads: 32,
  numKvHeads: 8,
  rmsNormEps: 1e-5,
  ropeTheta: 10000,
};
