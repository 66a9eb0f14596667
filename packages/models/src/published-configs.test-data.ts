// config.json fields of published checkpoints (Qwen3-8B, Qwen3-30B-A3B, OLMo-2-1124-7B,
// Phi-4-mini-instruct, gemma-3-4b-it) as the Hugging Face hub has them for transformers 5.17 —
// Phi-4-mini's 48 short/long rope factors abbreviated to values of the same shape. Test data read
// by family-config.test.ts and bench/published-configs.ts; not exported by the package.

/** Qwen3-8B's config.json. */
export const QWEN3_8B = {
  architectures: ['Qwen3ForCausalLM'], attention_bias: false, attention_dropout: 0.0, bos_token_id: 151643, eos_token_id: 151645, head_dim: 128, hidden_act: 'silu',
  hidden_size: 4096, initializer_range: 0.02, intermediate_size: 12288, max_position_embeddings: 40960, max_window_layers: 36, model_type: 'qwen3',
  num_attention_heads: 32, num_hidden_layers: 36, num_key_value_heads: 8, rms_norm_eps: 1e-6, rope_scaling: null, rope_theta: 1000000,
  sliding_window: null, tie_word_embeddings: false, torch_dtype: 'bfloat16', use_cache: true, use_sliding_window: false, vocab_size: 151936,
};

/** Qwen3-30B-A3B (128 experts, 8 routed)'s config.json. */
export const QWEN3_30B_A3B = {
  architectures: ['Qwen3MoeForCausalLM'], attention_bias: false, bos_token_id: 151643, decoder_sparse_step: 1, eos_token_id: 151645, head_dim: 128, hidden_act: 'silu',
  hidden_size: 2048, intermediate_size: 6144, max_position_embeddings: 40960, max_window_layers: 48, mlp_only_layers: [], model_type: 'qwen3_moe',
  moe_intermediate_size: 768, norm_topk_prob: true, num_attention_heads: 32, num_experts: 128, num_experts_per_tok: 8, num_hidden_layers: 48,
  num_key_value_heads: 4, output_router_logits: false, rms_norm_eps: 1e-6, rope_scaling: null, rope_theta: 1000000.0, router_aux_loss_coef: 0.001,
  sliding_window: null, tie_word_embeddings: false, use_sliding_window: false, vocab_size: 151936,
};

/** OLMo-2-1124-7B's config.json. */
export const OLMO2_7B = {
  architectures: ['Olmo2ForCausalLM'], attention_bias: false, attention_dropout: 0.0, eos_token_id: 100257, hidden_act: 'silu', hidden_size: 4096,
  intermediate_size: 11008, max_position_embeddings: 4096, model_type: 'olmo2', num_attention_heads: 32, num_hidden_layers: 32, num_key_value_heads: 32,
  pad_token_id: 100277, rms_norm_eps: 1e-6, rope_scaling: null, rope_theta: 500000, tie_word_embeddings: false, vocab_size: 100352,
};

/** Phi-4-mini-instruct's config.json. */
export const PHI4_MINI = {
  architectures: ['Phi3ForCausalLM'], attention_bias: false, attention_dropout: 0.0, bos_token_id: 199999, embd_pdrop: 0.0, eos_token_id: 199999, full_attn_mod: 1,
  hidden_act: 'silu', hidden_size: 3072, initializer_range: 0.02, intermediate_size: 8192, interpolate_factor: 1, lm_head_bias: false,
  max_position_embeddings: 131072, mlp_bias: false, model_type: 'phi3', num_attention_heads: 24, num_hidden_layers: 32, num_key_value_heads: 8,
  original_max_position_embeddings: 4096, pad_token_id: 199999, partial_rotary_factor: 0.75, resid_pdrop: 0.0, rms_norm_eps: 1e-5,
  rope_scaling: { long_factor: Array.from({ length: 48 }, (_, i) => 1 + i / 2), short_factor: Array.from({ length: 48 }, (_, i) => 1 + i / 100), type: 'longrope' },
  rope_theta: 10000.0, sliding_window: 262144, tie_word_embeddings: true, torch_dtype: 'bfloat16', use_cache: true, vocab_size: 200064,
};

/** gemma-3-4b-it (its text model in `text_config`)'s config.json. */
export const GEMMA3_4B = {
  architectures: ['Gemma3ForConditionalGeneration'], boi_token_index: 255999, eoi_token_index: 256000, eos_token_id: [1, 106], image_token_index: 262144,
  initializer_range: 0.02, mm_tokens_per_image: 256, model_type: 'gemma3',
  text_config: {
    hidden_size: 2560, intermediate_size: 10240, model_type: 'gemma3_text', num_hidden_layers: 34, rope_scaling: { factor: 8.0, rope_type: 'linear' },
    sliding_window: 1024, head_dim: 256, num_attention_heads: 8, num_key_value_heads: 4, query_pre_attn_scalar: 256, rope_theta: 1000000.0,
    rope_local_base_freq: 10000.0, sliding_window_pattern: 6, vocab_size: 262208, rms_norm_eps: 1e-6, max_position_embeddings: 131072,
    hidden_activation: 'gelu_pytorch_tanh', final_logit_softcapping: null, attn_logit_softcapping: null,
  },
  vision_config: { hidden_size: 1152, model_type: 'siglip_vision_model' },
};
