/**
 * @packageDocumentation
 * `@stageml/kernel-patterns`: the rewrite rules that fold a residual's primitive chains into the
 * serving ops of the IR registry, and the kernel specs every GPU code generator
 * (`@stageml/triton-gen`, `@stageml/sm90-native`) reads from those ops.
 *
 * - `servingOpRules` / `foldServingOps(graph)`: PEFT's residual LoRA layer → `loraLinear`
 *   (`add.fold-lora-linear`), the BGMV bank → `gatheredLoraLinear`, each SGMV group →
 *   `loraScatterAdd`, a MoE expert projection with expert LoRA → `groupedLoraMatmul`; each op
 *   decomposes into its chain, so folding changes no executor's numerics.
 * - `recognizeResidual(graph)` folds, then reads op nodes only: LoRA linears (and plain linears),
 *   SGMV chains, BGMV ops and MoE expert GEMMs (with or without expert LoRA) as plain-data kernel
 *   specs, reported in the input graph's node indices, with the kernels it had to drop (a symbolic
 *   dim a kernel specializes on) and the nodes no kernel covers. No generator matches primitives.
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
