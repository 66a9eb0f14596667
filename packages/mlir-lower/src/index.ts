/**
 * @packageDocumentation
 * `@stageml/mlir-lower`: StageML residual graphs as MLIR text.
 *
 * - `lowerToMlir(graph, constants, options)`: one `func.func` in the func, arith, math, linalg,
 *   tensor and scf dialects of upstream MLIR 19; every registry op has a rule or an
 *   `unsupported(reason)` entry in `mlirRules` (an exhaustive table over `OpKey`).
 * - Symbolic dims are `?`, computed from the arguments' `tensor.dim`s; broadcasting is in indexing
 *   maps; NaN and ±∞ are hex bit patterns; small constants are `dense<…>` literals and large ones
 *   function arguments or `dense_resource` blobs, never megabytes of text in the body.
 * - `findMlirTools`, `verifyMlir` and `runMlirOnCpu` drive `mlir-opt` and `mlir-cpu-runner`
 *   (the verification pipeline is `LLVM_PIPELINE`), returning discriminated results.
 *
 * Invariants: lowering is deterministic (same graph, constants and options give the same text);
 * errors are `LowerError`s with stable `LOWER_*` codes (or the `IR_*` codes of an invalid graph).
 */
export { LowerCode, LowerError } from './errors.js';
export type { LowerErrorCode } from './errors.js';
export { lowerFunction, lowerToMlir, printModule } from './lower.js';
export type { ConstantsMode, MlirArgument, MlirFunction, MlirLowerOptions, MlirModule, MlirResource, MlirResult } from './lower.js';
export { mlirRules, mlirRuleOf } from './rules.js';
export { isUnsupported, unsupported } from './rule.js';
export type { MlirRule, MlirRuleFn, RuleContext, UnsupportedRule } from './rule.js';
export { FunctionEmitter, sanitizeName } from './emitter.js';
export type { GenericOperand, GenericSpec, ValueRef } from './emitter.js';
export { denseAttr, resourceBlob } from './literals.js';
export { elementType, scalarLiteral, tensorTypeOf } from './types.js';
export { LLVM_PIPELINE, executeOnCpu, findMlirTools, verifyMlir } from './toolchain.js';
export type { FindToolsResult, MlirTools, ToolResult, VerifyOptions } from './toolchain.js';
export { buildRunnerModule, parseRunnerOutput, runMlirOnCpu } from './cpu-runner.js';
export type { CpuRunResult, RunnerCall } from './cpu-runner.js';
