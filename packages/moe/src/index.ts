/**
 * @packageDocumentation
 * `@stageml/moe`: mixture-of-experts for StageML.
 *
 * - `moeBlock`: a routed MoE MLP (router → softmax → top-k → renormalize → SwiGLU experts) as IR
 *   with grouped execution: one `groupedMatmul` per expert projection over the (token, slot) rows,
 *   never a loop over tokens.
 * - Per-expert LoRA on every expert projection: `unpackParameterFactors` / `expertLoraFor` read
 *   PEFT `target_parameters` adapters on fused expert tensors.
 * - `referenceMoe`: the per-token oracle (plain loops, f64 accumulation) the grouped blocks are
 *   tested against.
 * - MoE plans: per (adapter, layer, expert, projection) `materialize` | `residual` | `fallback`,
 *   as versioned JSON (`stageml.moe-plan` v1) validated against the model's shape with
 *   `MOE_BAD_PLAN` errors naming the JSON path; `moeBlockWithPlan` executes exactly the plan.
 * - `buildStagedMoeLayer`: a planned layer annotated on `base < adapter < tenant < request <
 *   routing < token`, so specialization at `adapter` folds materialized experts once.
 *
 * Invariants: every plan choice computes the same function (W_e + s·B_e·A_e on each expert); a
 * plan's choices change only where and when the delta is computed, never how often it counts.
 */
export { MoeCode, MoeError, MoePlanError } from './errors.js';
export type { MoeErrorCode } from './errors.js';
export { moeBlock } from './block.js';
export type { ExpertLoraValues, ExpertProjection, MoeBlockOptions, MoeParams } from './block.js';
export { expertLoraFor, unpackParameterFactors } from './expert-lora.js';
export type { ExpertLora, ExpertShapes } from './expert-lora.js';
export { referenceMoe, referenceRoute } from './reference.js';
export type { ReferenceExpertLora, ReferenceMoeOptions, ReferenceMoeParams, TokenRoute } from './reference.js';
export {
  EXPERT_PROJECTIONS,
  MOE_PLAN_CHOICES,
  MOE_PLAN_FORMAT,
  MOE_PLAN_VERSION,
  buildMoePlan,
  checkMoePlan,
  describeMoeAdapter,
  layerPlanOf,
  moePlanToJson,
  parseMoePlan,
  validateMoePlan,
} from './plan.js';
export type { LayerPlan, MoeAdapterDescription, MoeLayerDescription, MoeModelShape, MoePlan, MoePlanChoice, MoePlanUnit } from './plan.js';
export { moeBlockWithPlan, routeTokens } from './plan-block.js';
export type { ExpertFactorValues, MoePlanBlockOptions, MoePlanParams, MoeRouting, PlannedExpertLora } from './plan-block.js';
export { buildStagedMoeLayer, moeLeafName } from './staging.js';
export type { StagedMoeLayer, StagedMoeLayerSpec } from './staging.js';
