import { type Graph, GraphBuilder, IrCode, IrError, type Value, parseDim } from '@stageml/ir';
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
  /**
   * Routed experts instead of a dense MLP (Mixtral, Qwen3-MoE). `intermediateSize` is per expert
   * unless `intermediateSize` is given here (then it is the dense layers' width).
   */
  readonly moe?: {
    readonly numExperts: number;
    readonly topK: number;
    /** Per-expert MLP width (Qwen3-MoE's `moe_intermediate_size`); default `intermediateSize`. */
    readonly intermediateSize?: number;
    /** Renormalize the top-k routing weights (Mixtral: true; Qwen3-MoE: `norm_topk_prob`); default true. */
    readonly normalize?: boolean;
    /** Which layers are MoE (the others are dense); default all. */
    readonly layers?: readonly boolean[];
  };
  /** MLP activation: `silu` (default), `gelu_tanh` (Gemma's `gelu_pytorch_tanh`) or `gelu` (exact). */
  readonly hiddenAct?: 'silu' | 'gelu_tanh' | 'gelu';
  /** RMSNorm scales by `1 + w` (Gemma) instead of `w`. */
  readonly normOffset?: boolean;
  /**
   * Where the decoder layer normalizes: `pre` (Llama: `x + f(norm(x))`), `post` (OLMo 2:
   * `x + norm(f(x))`, norms `post_attention_layernorm` / `post_feedforward_layernorm`) or
   * `sandwich` (Gemma 2/3: `x + norm(f(norm(x)))`, with `pre_feedforward_layernorm` too).
   */
  readonly normLayout?: 'pre' | 'post' | 'sandwich';
  /**
   * RMSNorm on queries and keys before rotary: `head` (Qwen3, Gemma 3: per head over `headDim`,
   * `self_attn.q_norm` / `k_norm`) or `projection` (OLMo 2: over the whole projection).
   */
  readonly qkNorm?: 'head' | 'projection';
  /** One fused `self_attn.qkv_proj` [q; k; v] (Phi-3) instead of q/k/v projections. */
  readonly fusedQkv?: boolean;
  /** One fused `mlp.gate_up_proj` [gate; up] (Phi-3) instead of gate/up projections. */
  readonly fusedGateUp?: boolean;
  /** Rotary dims per head (partial rotary, Phi-3's `partial_rotary_factor`); default `headDim`. */
  readonly rotaryDim?: number;
  /** Embedding scale (Gemma: √hidden rounded to f32); default none. */
  readonly embedScale?: number;
  /** Attention score scale (Gemma: `query_pre_attn_scalar^-0.5`); default `headDim^-0.5`. */
  readonly attentionScale?: number;
  /** Attention logit soft-capping `tanh(s / c) · c` (Gemma 2's `attn_logit_softcapping`). */
  readonly attnSoftcap?: number;
  /** Final logit soft-capping `tanh(z / c) · c` (Gemma 2/3's `final_logit_softcapping`). */
  readonly finalSoftcap?: number;
  /**
   * Per-layer sliding windows (Gemma's `layer_types`, Phi-3's and Qwen3's `sliding_window`): a
   * query at position p of a windowed layer sees the keys in cache slots p − w < j ≤ p. `null` for
   * a global layer. The mask is built in the graph from `position_ids`; it needs `windowLimit`.
   */
  readonly layerWindows?: readonly (number | null)[];
}

/** Sizes of one MoE layer. */
export interface MoeLayerShape {
  readonly numExperts: number;
  readonly topK: number;
  readonly hidden: number;
  readonly intermediate: number;
  /** Renormalize the top-k routing weights (default true). */
  readonly normalize?: boolean;
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
    { topK: s.topK, normalize: s.normalize ?? true },
  );

/** Projections a LoRA adapter can target, by their HF module names. */
export const LLAMA_PROJECTIONS = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] as const;

/** The linear modules of one decoder layer of `cfg` (fused `qkv_proj` / `gate_up_proj` for Phi-3), by HF name. */
export function layerProjections(cfg: Pick<LlamaShape, 'fusedQkv' | 'fusedGateUp'>): string[] {
  return [...(cfg.fusedQkv === true ? ['qkv_proj'] : ['q_proj', 'k_proj', 'v_proj']), 'o_proj', ...(cfg.fusedGateUp === true ? ['gate_up_proj'] : ['gate_proj', 'up_proj']), 'down_proj'];
}

/** Rotary tables of a model: the inverse frequencies of global layers and the variants of some families. */
export interface RotaryTables {
  /** Inverse frequencies [rotaryDim / 2] (longrope: the short factors'). */
  readonly invFreq: readonly number[];
  /** Multiplier of cos and sin (longrope's attention factor); default 1. */
  readonly scale?: number;
  /** Longrope: the long factors' frequencies, used for a row whose largest position + 1 exceeds `originalMax`. */
  readonly long?: { readonly invFreq: readonly number[]; readonly originalMax: number };
  /** Frequencies of the sliding-window layers (Gemma 3's `rope_local_base_freq`); default `invFreq`. */
  readonly localInvFreq?: readonly number[];
}

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
  /**
   * A tied model (`tieWordEmbeddings`) still reads its head from a parameter `lm_head.weight` of its
   * own (the caller gives it the embedding's tensor): what lets an adapter replace the head alone
   * (PEFT `modules_to_save: ["lm_head"]` on a tied model).
   */
  readonly separateHead?: boolean;
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
  /** Full rotary tables (longrope, per-layer-type bases); overrides `invFreq`. */
  readonly rotary?: RotaryTables;
  /**
   * Largest cache length a windowed or soft-capped graph serves (its key-slot table is a constant
   * of this length); default 8192.
   */
  readonly windowLimit?: number;
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

/** Additive mask value of an ignored key (float32's lowest, as HF uses). */
const MASK_VALUE = -3.4028234663852886e38;

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
 * so a 7B-shaped graph builds without weights. The shape's family fields (`LlamaShape`: q/k norms,
 * norm layout, fused projections, partial rotary, per-layer windows, soft-capping, …) make the
 * Qwen3, Qwen3-MoE, OLMo 2, Phi-3, Gemma 2 and Gemma 3 decoders; their new math is composed from
 * existing ops (masks from a sliced slot table and clamped differences, soft-capped attention from
 * matmul/tanh/softmax, longrope's table choice as a 0/1 weight), so every executor runs it.
 */
export function buildLlamaGraph(cfg: LlamaShape, opts: LlamaGraphOptions = {}): Graph {
  const H = cfg.hiddenSize;
  const nh = cfg.numHeads;
  const nkv = cfg.numKvHeads;
  const hd = cfg.headDim ?? H / nh;
  const rd = cfg.rotaryDim ?? hd;
  for (const [k, v] of Object.entries({ vocabSize: cfg.vocabSize, hiddenSize: H, intermediateSize: cfg.intermediateSize, numLayers: cfg.numLayers, numHeads: nh, numKvHeads: nkv, headDim: hd, rotaryDim: rd })) {
    check(Number.isSafeInteger(v) && v > 0, `${k} must be a positive integer, got ${String(v)}`);
  }
  check(nh % nkv === 0, `numHeads ${String(nh)} must be a multiple of numKvHeads ${String(nkv)}`);
  check(rd % 2 === 0 && rd <= hd, `rotaryDim ${String(rd)} must be even and at most headDim ${String(hd)}`);
  const windows = cfg.layerWindows;
  check(windows === undefined || (windows.length === cfg.numLayers && windows.every((w) => w === null || (Number.isSafeInteger(w) && w > 0))), 'layerWindows must give each layer a positive window or null');
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

  // cos/sin tables [batch, 1, seq, rd], shared by the layers of each kind (global, sliding).
  const rotary = opts.rotary ?? { invFreq: opts.invFreq ?? ropeInvFreq(rd, cfg.ropeTheta ?? 10000) };
  check(rotary.invFreq.length === rd / 2, `rotary tables have ${String(rotary.invFreq.length)} frequencies, rotaryDim ${String(rd)} needs ${String(rd / 2)}`);
  const posF = b.scope('rope', () => b.reshape(b.cast(pos, 'f32'), ['batch', 'seq', 1]));
  const tables = (name: string, inv: readonly number[], long?: RotaryTables['long']): readonly [Value, Value] =>
    b.scope(name, () => {
      let invV = b.constant([...inv], 'f32', [rd / 2]);
      if (long !== undefined) {
        // Longrope: a row whose largest position + 1 exceeds the original length takes the long
        // factors. A row's positions increase, so its last is its largest; the choice is a 0/1
        // weight (clamped difference of integers), exact in arithmetic every executor runs.
        const lastPos = b.slice(posF, 1, -1);
        const beyond = b.minimum(b.maximum(b.sub(lastPos, b.scalar(long.originalMax - 1)), b.scalar(0)), b.scalar(1));
        invV = b.add(b.mul(invV, b.sub(b.scalar(1), beyond)), b.mul(b.constant([...long.invFreq], 'f32', [rd / 2]), beyond));
      }
      const freqs = b.mul(posF, invV);
      const emb = b.reshape(b.concat([freqs, freqs], -1), ['batch', 1, 'seq', rd]);
      const scale = rotary.scale ?? 1;
      return scale === 1 ? ([b.cos(emb), b.sin(emb)] as const) : ([b.mul(b.cos(emb), b.scalar(scale)), b.mul(b.sin(emb), b.scalar(scale))] as const);
    });
  const globalRope = tables('rope', rotary.invFreq, rotary.long);
  const localRope = rotary.localInvFreq === undefined ? globalRope : tables('rope_local', rotary.localInvFreq);
  const rotate = (x: Value, [cos, sin]: readonly [Value, Value]): Value => {
    if (rd === hd) return b.rotary(x, cos, sin);
    return b.concat([b.rotary(b.slice(x, 3, 0, rd), cos, sin), b.slice(x, 3, rd, hd)], 3);
  };

  // Masks built in the graph (sliding windows, and causality for soft-capped attention): key slots
  // 0..keys-1 from a constant table sliced to the key length, compared to each query's position by
  // clamped differences (exact on integers), so every executor runs them with arithmetic only.
  const needsSlots = windows?.some((w) => w !== null) === true || cfg.attnSoftcap !== undefined;
  const slotInfo = needsSlots
    ? b.scope('mask', () => {
        const limit = opts.windowLimit ?? 8192;
        const table = b.constant(Array.from({ length: limit }, (_, i) => i), 'f32', [limit]);
        const slots = b.reshape(b.slice(table, 0, 0, parseDim(keyLen)), [1, 1, 1, -1]);
        // Each query's own cache slot, the new positions at the end of the keys (as the attention
        // op's causality aligns them): past + i.
        const qSlots = b.reshape(b.slice(table, 0, cached ? parseDim('past') : 0, parseDim(keyLen)), [1, 1, 'seq', 1]);
        const q = b.reshape(posF, ['batch', 1, 'seq', 1]);
        // Each key's position, what a window compares with the query's: a cached key's is its slot,
        // a new key's is its token's `position_ids` entry. (A row whose cache is shorter than the
        // batch's `past`, or whose chunk is shorter than the step's, has padding slots before its
        // new keys: a new key's slot then exceeds its position, and a slot-based window would reach
        // that many keys further back.)
        const keyPos = cached
          ? b.concat([b.broadcastTo(b.reshape(b.slice(table, 0, 0, parseDim('past')), [1, 1, 1, -1]), ['batch', 1, 1, 'past']), b.reshape(posF, ['batch', 1, 1, 'seq'])], 3)
          : slots;
        return { slots, qSlots, q, keyPos };
      })
    : undefined;
  const windowMaskOf = new Map<number, Value>();
  /** Additive mask [batch, 1, seq, keys]: 0 where p − w < pos(j) (the key's position), else a large negative number. */
  const windowMask = (w: number): Value => {
    let m = windowMaskOf.get(w);
    if (m === undefined) {
      const { keyPos, q } = slotInfo!;
      // visible = clamp(pos(j) − (p − w), 0, 1) ∈ {0, 1}; mask = (1 − visible) · MASKED.
      const visible = b.minimum(b.maximum(b.sub(keyPos, b.sub(q, b.scalar(w))), b.scalar(0)), b.scalar(1));
      m = b.mul(b.sub(b.scalar(1), visible), b.scalar(MASK_VALUE));
      m = keyMask === undefined ? m : b.minimum(m, keyMask);
      windowMaskOf.set(w, m);
    }
    return m;
  };
  /** Causality as the attention op's (key j visible to query i iff j ≤ past + i) as an additive mask, for the composed (soft-capped) attention. */
  const causalMask = (): Value => {
    const { slots, qSlots } = slotInfo!;
    const visible = b.minimum(b.maximum(b.add(b.sub(qSlots, slots), b.scalar(1)), b.scalar(0)), b.scalar(1));
    return b.mul(b.sub(b.scalar(1), visible), b.scalar(MASK_VALUE));
  };
  const scale = cfg.attentionScale;
  const attend = (q: Value, k: Value, v: Value, mask: Value | undefined): Value => {
    if (cfg.attnSoftcap === undefined) return b.attention(q, k, v, { causal: true, ...(scale === undefined ? {} : { scale }) }, mask);
    // Soft-capped attention as a composition: scores = tanh(q·kᵀ·scale / c)·c + mask, softmax, ·v.
    const group = nh / nkv;
    const expand = (t: Value): Value => (group === 1 ? t : b.reshape(b.broadcastTo(b.reshape(t, ['batch', nkv, 1, -1, hd]), ['batch', nkv, group, keyLen, hd]), ['batch', nh, -1, hd]));
    const c = cfg.attnSoftcap;
    let s = b.mul(b.matmul(q, b.transpose(expand(k), [0, 1, 3, 2])), b.scalar(scale ?? 1 / Math.sqrt(hd)));
    s = b.mul(b.tanh(b.div(s, b.scalar(c))), b.scalar(c));
    const causal = causalMask();
    s = b.add(s, mask === undefined ? causal : b.minimum(causal, mask));
    return b.matmul(b.softmax(s, -1), expand(v));
  };

  const normWeight = (name: string, width: number): Value => {
    const w = b.param(name, ['f32', [width]]);
    return cfg.normOffset === true ? b.add(w, b.scalar(1)) : w;
  };
  const norm = (x: Value, name: string, width: number): Value => b.rmsNorm(x, normWeight(name, width), eps);
  // A residual add whose sum is normalized next: one `skipRmsNorm` (the sum and the normed sum).
  const addNorm = (x: Value, residual: Value, name: string): [Value, Value] => b.skipRmsNorm(x, residual, normWeight(name, H), eps);
  const act = (x: Value): Value => (cfg.hiddenAct === 'gelu_tanh' ? b.gelu(x, 'tanh') : cfg.hiddenAct === 'gelu' ? b.gelu(x) : b.silu(x));
  const layout = cfg.normLayout ?? 'pre';
  const heads = (x: Value, n: number): Value => b.reshape(x, ['batch', 'seq', n, hd]);
  const presents: { k: Value; v: Value }[] = [];

  let h = b.gather(embed, ids);
  if (cfg.embedScale !== undefined) h = b.mul(h, b.scalar(cfg.embedScale));
  // The next layer's (or the final) normed input, where the previous layer's last add computed it.
  let normedIn: Value | undefined;
  for (let l = 0; l < cfg.numLayers; l++) {
    const prefix = `model.layers.${String(l)}`;
    const window = windows?.[l] ?? null;
    h = b.scope(`layers.${String(l)}`, () => {
      const attnIn = layout === 'post' ? h : (normedIn ?? norm(h, `${prefix}.input_layernorm.weight`, H));
      normedIn = undefined;
      const ap = `${prefix}.self_attn`;
      const ab = cfg.attentionBias === true;
      const qkvb = ab || opts.qkvBias === true;
      let qp: Value, kp: Value, vp: Value;
      if (cfg.fusedQkv === true) {
        const qkv = linear(b, `${ap}.qkv_proj`, attnIn, H, (nh + 2 * nkv) * hd, qkvb);
        qp = b.slice(qkv, 2, 0, nh * hd);
        kp = b.slice(qkv, 2, nh * hd, (nh + nkv) * hd);
        vp = b.slice(qkv, 2, (nh + nkv) * hd, (nh + 2 * nkv) * hd);
      } else {
        qp = linear(b, `${ap}.q_proj`, attnIn, H, nh * hd, qkvb);
        kp = linear(b, `${ap}.k_proj`, attnIn, H, nkv * hd, qkvb);
        vp = linear(b, `${ap}.v_proj`, attnIn, H, nkv * hd, qkvb);
      }
      if (cfg.qkNorm === 'projection') {
        qp = norm(qp, `${ap}.q_norm.weight`, nh * hd);
        kp = norm(kp, `${ap}.k_norm.weight`, nkv * hd);
      }
      let qh = heads(qp, nh);
      let kh = heads(kp, nkv);
      if (cfg.qkNorm === 'head') {
        qh = norm(qh, `${ap}.q_norm.weight`, hd);
        kh = norm(kh, `${ap}.k_norm.weight`, hd);
      }
      const rope = window === null ? globalRope : localRope;
      const q = rotate(b.transpose(qh, [0, 2, 1, 3]), rope);
      let k = rotate(b.transpose(kh, [0, 2, 1, 3]), rope);
      let v = b.transpose(heads(vp, nkv), [0, 2, 1, 3]);
      const cache = past?.[l];
      const mask = window === null ? keyMask : windowMask(window);
      let attn: Value;
      if (cache !== undefined && resident && cfg.attnSoftcap === undefined && window === null) {
        // The position-major resident cache and this step's keys/values in one op: executors that
        // own the cache read it in place; the others expand it to transpose + concat + attention.
        // (Soft-capped or windowed attention composes its own scores over the concatenation below.)
        presents.push({ k: b.transpose(k, [0, 2, 1, 3]), v: b.transpose(v, [0, 2, 1, 3]) });
        attn = b.cachedAttention(q, cache.k, cache.v, k, v, { causal: true, ...(scale === undefined ? {} : { scale }) }, mask);
      } else {
        if (cache !== undefined) {
          // A resident cache arrives position-major ([batch, past, heads, dim]), as cachedAttention reads it.
          if (resident) presents.push({ k: b.transpose(k, [0, 2, 1, 3]), v: b.transpose(v, [0, 2, 1, 3]) });
          k = b.concat([resident ? b.transpose(cache.k, [0, 2, 1, 3]) : cache.k, k], 2);
          v = b.concat([resident ? b.transpose(cache.v, [0, 2, 1, 3]) : cache.v, v], 2);
          if (!resident) presents.push({ k, v });
        }
        attn = attend(q, k, v, mask);
      }
      const merged = b.reshape(b.transpose(attn, [0, 2, 1, 3]), ['batch', 'seq', nh * hd]);
      let attnOut = linear(b, `${ap}.o_proj`, merged, nh * hd, H, ab);
      if (layout !== 'pre') attnOut = norm(attnOut, `${prefix}.post_attention_layernorm.weight`, H);
      const post = layout === 'post' ? b.add(h, attnOut) : undefined;
      const [h1, mlpIn] = post !== undefined ? [post, post] : addNorm(h, attnOut, `${prefix}.${layout === 'pre' ? 'post_attention_layernorm' : 'pre_feedforward_layernorm'}.weight`);
      const mp = `${prefix}.mlp`;
      let mlpOut: Value;
      if (cfg.moe !== undefined && cfg.moe.layers?.[l] !== false) {
        const rows = b.reshape(mlpIn, [-1, H]);
        const shape: MoeLayerShape = { numExperts: cfg.moe.numExperts, topK: cfg.moe.topK, hidden: H, intermediate: cfg.moe.intermediateSize ?? cfg.intermediateSize, normalize: cfg.moe.normalize ?? true };
        mlpOut = b.reshape((opts.experts ?? plainExperts)(b, mp, rows, shape), ['batch', 'seq', H]);
      } else {
        const mb = cfg.mlpBias === true;
        const I = cfg.intermediateSize;
        let gate: Value, up: Value;
        if (cfg.fusedGateUp === true) {
          const gu = linear(b, `${mp}.gate_up_proj`, mlpIn, H, 2 * I, mb);
          gate = b.slice(gu, 2, 0, I);
          up = b.slice(gu, 2, I, 2 * I);
        } else {
          gate = linear(b, `${mp}.gate_proj`, mlpIn, H, I, mb);
          up = linear(b, `${mp}.up_proj`, mlpIn, H, I, mb);
        }
        mlpOut = linear(b, `${mp}.down_proj`, b.mul(act(gate), up), I, H, mb);
      }
      if (layout !== 'pre') mlpOut = norm(mlpOut, `${prefix}.post_feedforward_layernorm.weight`, H);
      // The residual sum and, where the next norm reads it whole, that norm (the next layer's input
      // norm; the final norm unless only the last position's logits are wanted).
      const next =
        l + 1 < cfg.numLayers ? (layout === 'post' ? undefined : `model.layers.${String(l + 1)}.input_layernorm.weight`) : opts.lastLogitsOnly === true ? undefined : 'model.norm.weight';
      if (next === undefined) return b.add(h1, mlpOut);
      const [sum, normed] = addNorm(h1, mlpOut, next);
      normedIn = normed;
      return sum;
    });
  }
  const last = opts.lastLogitsOnly === true ? b.reshape(b.slice(h, 1, -1), ['batch', H]) : h;
  const normed = normedIn ?? norm(last, 'model.norm.weight', H);
  const head = cfg.tieWordEmbeddings === true && opts.separateHead !== true ? embed : b.param('lm_head.weight', ['f32', [cfg.vocabSize, H]]);
  let logits = b.linear(normed, head);
  if (cfg.finalSoftcap !== undefined) logits = b.mul(b.tanh(b.div(logits, b.scalar(cfg.finalSoftcap))), b.scalar(cfg.finalSoftcap));
  b.output('logits', logits);
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
