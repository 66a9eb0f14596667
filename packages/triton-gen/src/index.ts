/**
 * @packageDocumentation
 * `@stageml/triton-gen`: Triton kernels generated from residual graphs.
 *
 * - `recognizeResidual` (from `@stageml/kernel-patterns`) folds the residual's chains into serving
 *   ops and reads the kernels from them: fused LoRA linears (and plain linears), SGMV banks with
 *   mixed ranks and base-only rows, BGMV banks, and MoE expert GEMMs with expert LoRA.
 * - `generateTriton` emits, for each pattern, a kernel module specialized to the pattern's static
 *   dims and dtype (the row count stays a run-time value; autotuning is keyed by a row bucket, so
 *   no batch size recompiles), a launcher, and a check-and-bench script; plus a shared module,
 *   `check_all.py` and `manifest.json`.
 * - `tritonRules` is the backend's exhaustive table over `OPS`.
 *
 * Invariants: generation is a pure function of the graph (deterministic text, golden-tested);
 * kernels take contiguous row-major f16/bf16/f32 operands and accumulate in fp32; every error is a
 * `TritonError` with a stable `TRITON_*` code.
 */
export { TritonCode, TritonError } from './errors.js';
export type { TritonErrorCode } from './errors.js';
export { recognizeResidual } from './patterns.js';
// The kernel spec types (ResidualKernel, LoraLinearKernel, …) of @stageml/kernel-patterns.
export type * from './patterns.js';
export { hostReason, tritonRules, unsupported } from './rules.js';
export type { TritonRule } from './rules.js';
export { isTritonDType, rankPad } from './python.js';
export type { TritonDType, TritonKernel } from './python.js';
export { EXPAND_CONFIGS, GEMM_CONFIGS, MOE_CONFIGS, SHRINK_CONFIGS, emitKernelModule } from './emit-kernels.js';
export { emitLauncher } from './emit-launch.js';
export { BENCH_ROWS, emitCheck } from './emit-check.js';
export { emitCommonModule } from './emit-common.js';
export { generateTriton, generateTritonFromBundle, writeGenerated } from './generate.js';
export type { HostOp, TritonOptions, TritonOutput, TritonWriteOptions } from './generate.js';
