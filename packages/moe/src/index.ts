/**
 * @packageDocumentation
 * `@stageml/moe`: mixture-of-experts for StageML.
 *
 * - `moeBlock`: a routed MoE MLP (router → softmax → top-k → renormalize → SwiGLU experts) as IR
 *   with grouped execution: one `groupedMatmul` per expert projection over the (token, slot) rows,
 *   never a loop over tokens.
 * - Per-expert LoRA on every expert projection: `unpackParameterFactors` / `expertLoraFor` read
 *   PEFT `target_parameters` adapters on fused expert tensors.
 */
export { MoeCode, MoeError } from './errors.js';
export type { MoeErrorCode } from './errors.js';
export { moeBlock } from './block.js';
export type { ExpertLoraValues, ExpertProjection, MoeBlockOptions, MoeParams } from './block.js';
export { expertLoraFor, unpackParameterFactors } from './expert-lora.js';
export type { ExpertLora, ExpertShapes } from './expert-lora.js';
