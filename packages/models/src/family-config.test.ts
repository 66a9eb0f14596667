// The families' config.json fields as published (Qwen3-8B, Qwen3-30B-A3B, OLMo-2-1124-7B,
// Phi-4-mini-instruct, gemma-3-4b-it, gemma-2-2b), parsed as transformers 5.17 reads them, and their
// full-size graphs built from shapes alone (parameter counts as published).
import { graphParams } from '@stageml/ir';
import { describe, expect, it } from 'vitest';
import { type LlamaConfig, SUPPORTED_MODEL_TYPES, buildLlamaGraph, familyGraphOptions, parseLlamaConfig, rotaryTablesFor } from './index.js';
import { GEMMA3_4B, OLMO2_7B, PHI4_MINI, QWEN3_30B_A3B, QWEN3_8B } from './published-configs.test-data.js';

// Phi-4-mini-instruct's fields; its 48 short/long factors abbreviated to values of the same shape.
const GEMMA2_2B = {
  architectures: ['Gemma2ForCausalLM'], attention_bias: false, attn_logit_softcapping: 50.0, bos_token_id: 2, cache_implementation: 'hybrid', eos_token_id: [1, 107],
  final_logit_softcapping: 30.0, head_dim: 256, hidden_act: 'gelu_pytorch_tanh', hidden_activation: 'gelu_pytorch_tanh', hidden_size: 2304,
  intermediate_size: 9216, max_position_embeddings: 8192, model_type: 'gemma2', num_attention_heads: 8, num_hidden_layers: 26, num_key_value_heads: 4,
  pad_token_id: 0, query_pre_attn_scalar: 256, rms_norm_eps: 1e-6, rope_theta: 10000.0, sliding_window: 4096, vocab_size: 256000,
};

const parse = (c: object): LlamaConfig => parseLlamaConfig(JSON.stringify(c));
/** Parameters of the full-size graph (weights never materialized). */
function paramCount(cfg: LlamaConfig): number {
  const g = buildLlamaGraph(cfg, familyGraphOptions(cfg));
  return graphParams(g).reduce((n, p) => n + (g.values[p.results[0]!]!.type.shape as number[]).reduce((a, d) => a * d, 1), 0);
}

describe('published family configs', () => {
  it('Qwen3-8B: per-head q/k norms, head_dim 128, untied, no windows; 8.19B parameters', () => {
    const c = parse(QWEN3_8B);
    expect(c).toMatchObject({ modelType: 'qwen3', headDim: 128, qkNorm: 'head', tieWordEmbeddings: false, ropeTheta: 1000000, eosTokenIds: [151645] });
    expect(c.layerWindows).toBeUndefined();
    expect(paramCount(c) / 1e9).toBeCloseTo(8.19, 2);
    // head_dim absent: transformers' Qwen3Config default (128), not hidden / heads.
    expect(parse({ ...QWEN3_8B, head_dim: undefined, hidden_size: 1024 }).headDim).toBe(128);
    // use_sliding_window: the layers from max_window_layers on are windowed.
    expect(parse({ ...QWEN3_8B, use_sliding_window: true, sliding_window: 4096, max_window_layers: 34 }).layerWindows).toEqual([...Array<null>(34).fill(null), 4096, 4096]);
  });

  it('Qwen3-30B-A3B: 128 experts (top 8, renormalized) of width 768 on every layer; 30.5B parameters', () => {
    const c = parse(QWEN3_30B_A3B);
    expect(c.moe).toMatchObject({ numExperts: 128, topK: 8, intermediateSize: 768, normalize: true });
    expect(c.moe?.layers?.every((x) => x)).toBe(true);
    expect(paramCount(c) / 1e9).toBeCloseTo(30.53, 1);
    // mlp_only_layers / decoder_sparse_step make dense layers (intermediate_size) between MoE ones.
    const mixed = parse({ ...QWEN3_30B_A3B, num_hidden_layers: 4, mlp_only_layers: [0], decoder_sparse_step: 2, norm_topk_prob: false });
    expect(mixed.moe).toMatchObject({ layers: [false, true, false, true], normalize: false });
  });

  it('OLMo-2-1124-7B: norms after attention and MLP, q/k norms over the projection; 7.30B parameters', () => {
    const c = parse(OLMO2_7B);
    expect(c).toMatchObject({ normLayout: 'post', qkNorm: 'projection', headDim: 128, ropeTheta: 500000 });
    expect(paramCount(c) / 1e9).toBeCloseTo(7.3, 1);
  });

  it('Phi-4-mini: fused qkv/gate_up, 96 of 128 rotary dims, longrope (legacy type) with its attention factor; no effective window; 3.84B parameters', () => {
    const c = parse(PHI4_MINI);
    expect(c).toMatchObject({ fusedQkv: true, fusedGateUp: true, rotaryDim: 96, headDim: 128, tieWordEmbeddings: true });
    expect(c.rope).toMatchObject({ type: 'longrope', originalMaxPositions: 4096 });
    expect(c.rope.type === 'longrope' ? c.rope.attentionFactor : 0).toBeCloseTo(Math.sqrt(1 + Math.log(32) / Math.log(4096)), 12);
    expect(c.layerWindows).toBeUndefined();
    const t = rotaryTablesFor(c);
    expect(t.invFreq).toHaveLength(48);
    expect(t.long?.originalMax).toBe(4096);
    expect(t.long?.invFreq[47]).toBeCloseTo(t.invFreq[47]! * (1 + 47 / 100) / (1 + 47 / 2), 6);
    expect(paramCount(c) / 1e9).toBeCloseTo(3.84, 2);
    expect(() => parse({ ...PHI4_MINI, rope_scaling: { ...PHI4_MINI.rope_scaling, long_factor: [1, 2] } })).toThrow(expect.objectContaining({ code: 'MODEL_BAD_CONFIG', message: expect.stringContaining('48') as string }) as Error);
  });

  it('gemma-3-4b-it (multimodal wrapper): its text model with 5 of 6 layers windowed, local/global rope bases, (1 + w) norms, √hidden embeddings', () => {
    const c = parse(GEMMA3_4B);
    expect(c).toMatchObject({ modelType: 'gemma3_text', normOffset: true, normLayout: 'sandwich', qkNorm: 'head', hiddenAct: 'gelu_tanh', headDim: 256, eosTokenIds: [1, 106] });
    expect(c.embedScale).toBe(Math.fround(Math.sqrt(2560)));
    expect(c.attentionScale).toBe(256 ** -0.5);
    expect(c.layerWindows?.filter((w) => w === 1024)).toHaveLength(29);
    expect(c.layerWindows?.[5]).toBeNull();
    expect(c.rope).toEqual({ type: 'linear', factor: 8 });
    expect(c.localRope).toEqual({ theta: 10000, rope: { type: 'default' } });
    const t = rotaryTablesFor(c);
    expect(t.localInvFreq?.[1]).toBeCloseTo(10000 ** (-2 / 256), 6);
    expect(t.invFreq[1]).toBeCloseTo(1000000 ** (-2 / 256) / 8, 6);
    expect(c.finalSoftcap).toBeUndefined();
    // tie_word_embeddings absent (as published): Gemma's config default ties (a regression: it was read as untied).
    expect(c.tieWordEmbeddings).toBe(true);
    // the text part of Gemma 3 4B: 3.88B parameters
    expect(paramCount(c) / 1e9).toBeCloseTo(3.88, 2);
  });

  it("Gemma 2: soft-capping (and its config's defaults when the fields are absent), alternating windows", () => {
    const c = parse(GEMMA2_2B);
    expect(c).toMatchObject({ attnSoftcap: 50, finalSoftcap: 30, normOffset: true });
    expect(c.layerWindows?.slice(0, 4)).toEqual([4096, null, 4096, null]);
    expect(parse({ ...GEMMA2_2B, attn_logit_softcapping: undefined, final_logit_softcapping: undefined })).toMatchObject({ attnSoftcap: 50, finalSoftcap: 30 });
    expect(parse({ ...GEMMA2_2B, final_logit_softcapping: null, attn_logit_softcapping: null }).finalSoftcap).toBeUndefined();
    expect(paramCount(c) / 1e9).toBeCloseTo(2.61, 2);
  });

  it('refuses what it cannot run with coded errors naming the field', () => {
    expect(() => parse({ ...OLMO2_7B, model_type: 'gpt2' })).toThrow(expect.objectContaining({ code: 'MODEL_UNSUPPORTED_ARCH', message: expect.stringContaining(SUPPORTED_MODEL_TYPES.join(', ')) as string }) as Error);
    expect(() => parse({ ...GEMMA2_2B, layer_types: ['sliding_attention', 'chunked_attention', ...Array<string>(24).fill('full_attention')] })).toThrow(
      expect.objectContaining({ code: 'MODEL_BAD_CONFIG', message: expect.stringContaining('chunked_attention') as string }) as Error,
    );
    expect(() => parse({ ...GEMMA2_2B, layer_types: ['full_attention'] })).toThrow(expect.objectContaining({ code: 'MODEL_BAD_CONFIG', message: expect.stringContaining('layer_types') as string }) as Error);
    expect(() => parse({ ...GEMMA2_2B, use_bidirectional_attention: true })).toThrow(expect.objectContaining({ code: 'MODEL_BAD_CONFIG' }) as Error);
    expect(() => parse({ ...GEMMA2_2B, hidden_activation: 'relu' })).toThrow(expect.objectContaining({ code: 'MODEL_BAD_CONFIG', message: expect.stringContaining('relu') as string }) as Error);
    expect(() => parse({ ...QWEN3_30B_A3B, moe_intermediate_size: undefined })).toThrow(expect.objectContaining({ code: 'MODEL_BAD_CONFIG', message: expect.stringContaining('moe_intermediate_size') as string }) as Error);
    expect(() => parse({ ...PHI4_MINI, partial_rotary_factor: 0.01 })).toThrow(expect.objectContaining({ code: 'MODEL_BAD_CONFIG', message: expect.stringContaining('partial_rotary_factor') as string }) as Error);
  });
});
