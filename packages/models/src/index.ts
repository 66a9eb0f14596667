/**
 * @packageDocumentation
 * `@stageml/models`: model families as StageML IR, and Hugging Face checkpoints end to end.
 *
 * - `buildLlamaGraph`: Llama-family decoders (GQA, rotary, SwiGLU) over symbolic dims, optionally
 *   with a KV cache, with parameters named as in HF checkpoints and a `LinearFactory` hook for
 *   LoRA (single adapter, residual or merged) and mixed-adapter banks.
 * - `parseLlamaConfig`: HF `config.json` of the supported families (`SUPPORTED_MODEL_TYPES`: llama,
 *   mistral, qwen2, mixtral, qwen3, qwen3_moe, olmo2, phi3, gemma2, gemma3_text; rope
 *   default/linear/llama3/longrope); `familyGraphOptions` gives the graph options they need.
 * - `stagedModelGraph`: a checkpoint directory (single or sharded safetensors) and at most one
 *   PEFT adapter as the annotated forward graph with its values, ready to specialize.
 * - Running models is the serving engine's (`@stageml/engine`: `Engine`, `generateWithEngine`);
 *   this package gives it the graphs, the tokenizer and the token picker: `makePicker` (greedy and
 *   sampled decoding; logits processing — penalties, logit bias — and log-probabilities) and the
 *   `GenerateOptions` / `GenerateResult` a generation takes and gives.
 * - `IncrementalDetokenizer`: UTF-8-safe streaming text (vLLM's incremental detokenization).
 * - `applyChatTemplate`: chat templates (`chat_template.jinja`, named templates) rendered with Jinja.
 */
export { ModelCode, ModelError } from './errors.js';
export type { ModelErrorCode } from './errors.js';
export { LLAMA_7B_GQA_SHAPE, LLAMA_PROJECTIONS, buildLlamaGraph, layerProjections, plainLinear, ropeInvFreq } from './llama-graph.js';
export type { ExpertsFactory, LinearFactory, LlamaGraphOptions, LlamaLoraShape, LlamaProjection, LlamaShape, MoeLayerShape, RotaryTables } from './llama-graph.js';
export { SUPPORTED_MODEL_TYPES, familyGraphOptions, parseLlamaConfig, readLlamaConfig, ropeInvFreqFor, rotaryTablesFor } from './hf-config.js';
export { hfLlamaRounding, roundedTensor, topoOrder } from './hf-rounding.js';
export type { CastValueType, OpEmitter } from './hf-rounding.js';
export type { LlamaConfig, MoeShape, RopeScaling } from './hf-config.js';
export { adapterParamName, expertParamName, loraExperts, singleAdapterLinear } from './linear-factories.js';
export { loadChatTemplates, loadTokenizer } from './tokenizer.js';
export { readParam } from './checkpoint-map.js';
export type { EncodeOptions, TextTokenizer } from './tokenizer.js';
export { IncrementalDetokenizer } from './detokenizer.js';
export { applyChatTemplate, chatTemplateOf, encodeChat, renderChatTemplate } from './chat-template.js';
export type { ChatTemplateMessage, ChatTemplateOptions } from './chat-template.js';
export { argmaxOf, checkSampling, descendingOrder, isPlainGreedy, logSoftmax, makePicker, maskLogits, maskedArgmax, pickPlan, processLogits, samplePick, topOf, topOrder } from './sampling.js';
export type { LogitsProcessing, LogitsState, PickInfo, PickPlan, SamplingOptions, TokenConstraint, TokenLogprob, TokenPicker } from './sampling.js';
export type { GenerateOptions, GenerateResult } from './generate.js';
export { stagedModelGraph, type StagedModelGraph, type StagedModelOptions } from './bundle-graph.js';
export { GGML_TYPE, decodeGgml, encodeGgml, fromF16, ggufModuleName, parseGguf, permuteRotaryRows, writeGguf, writeLlamaGguf, writeLoraGguf } from './gguf.js';
export type { GgmlTypeName, GgufFile, GgufLoraModule, GgufTensor, GgufValue } from './gguf.js';
