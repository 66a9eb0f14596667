/**
 * @packageDocumentation
 * `@stageml/kernel-patterns`: the kernel-sized shapes of residual graphs, written in the rewrite
 * pattern language (`m.*` of `@stageml/rewrite`) and shared by every GPU code generator
 * (`@stageml/triton-gen`, `@stageml/sm90-native`).
 *
 * - `recognizeResidual(graph)` finds fused LoRA linears (and plain linears), SGMV banks, BGMV banks
 *   and MoE expert GEMMs (with or without expert LoRA) and returns plain-data kernel specs, the
 *   matches it had to drop (a symbolic dim a kernel specializes on) and the nodes no kernel covers.
 * - The shapes themselves (`LORA_LINEAR`, `BANK_GROUP_STEP`, `BANK_GATHERED`, `MOE_LORA`,
 *   `loraDelta`) are exported as patterns, so other tools can match them too.
 * - `servingOpRules` / `foldServingOps(graph)`: the rewrite rules that turn residual primitives into
 *   the serving ops of the IR registry (`add.fold-lora-linear`: PEFT's residual LoRA chain →
 *   `loraLinear`), so backends lower ops from their tables instead of recognising primitives;
 *   `recognizeResidual` reads a `loraLinear` op as one fused LoRA-linear kernel.
 * - The rule shape every kernel backend's exhaustive op table uses (`KernelRule`, `kernelRule`,
 *   `unsupportedRule`, `hostReasonOf`), and `byKernelFamily`, the per-family emitter dispatch.
 */
export { recognizeResidual } from './recognize.js';
export { foldGatheredLoraLinear, foldGroupedLoraMatmul, foldLoraLinear, foldLoraScatterAdd, foldServingOps, servingOpRules } from './serving-rules.js';
export type { FoldedServingOps } from './serving-rules.js';
export { hostReasonOf, kernelRule, unsupportedRule } from './kernel-rules.js';
export { byKernelFamily } from './kernel-family.js';
export type { KernelFamilyEmitters } from './kernel-family.js';
export type { KernelRule, KernelRuleTable } from './kernel-rules.js';
export type {
  BankGatheredKernel,
  BankGroup,
  BankGroupedKernel,
  KernelCommon,
  LoraFactors,
  LoraLinearKernel,
  MoeLoraKernel,
  PatternDType,
  PatternRejection,
  Recognition,
  ResidualKernel,
  ResidualKernelKind,
} from './kernel-types.js';
