/**
 * @packageDocumentation
 * `@stageml/sm90-native`: CUDA C++ for sm_90a generated from residual graphs.
 *
 * - `generateCuda` finds the LoRA, bank (SGMV/BGMV) and MoE-LoRA patterns of a residual (the
 *   recognizer is shared with `@stageml/triton-gen`) and emits one translation unit per pattern:
 *   tensor-core kernels (mma.sync m16n8k16, ldmatrix, cp.async pipelines; bf16/f16 in, fp32
 *   accumulate) instantiated with the pattern's static dims, plus host launchers that check every
 *   CUDA call and the last error after each launch, registered for the `native/` torch extension.
 * - `compileCuda`/`parsePtxasReport` run nvcc for sm_90a and read ptxas's register/spill report.
 * - `sm90Rules` is the backend's exhaustive table over `OPS`.
 *
 * Invariants: generation is deterministic text (golden-tested); kernels read contiguous row-major
 * operands whose in/out dims and ranks are multiples of 8; every error is an `Sm90Error` with a
 * stable `SM90_*` code.
 */
export { Sm90Code, Sm90Error } from './errors.js';
export type { Sm90ErrorCode } from './errors.js';
export { hostReason, sm90Rules, unsupported } from './rules.js';
export type { Sm90Rule } from './rules.js';
export { GEMM_TILES, GROUPED_BLOCK_M, MOE_TILE, cudaRankPad, emitCudaUnit, fitStages, unitHash } from './emit.js';
export type { GemmConfig, RegistryEntry, Sm90DType, Sm90Kernel } from './emit.js';
export { MAX_RANK, generateCuda, generateCudaFromBundle, writeCudaDir } from './generate.js';
export type { CudaHostOp, CudaOptions, CudaOutput, CudaWriteOptions } from './generate.js';
export { compileCuda, compileCudaAsync, nvccCommand, parsePtxasReport } from './nvcc.js';
export type { NvccOptions, NvccResult, NvccTarget, PtxasEntry } from './nvcc.js';
export { ABI_HEADER } from './cuda-abi.js';
export { GEMM_TEMPLATES } from './cuda-gemm.js';
export { GROUPED_TEMPLATES } from './cuda-grouped.js';
