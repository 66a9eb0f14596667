/**
 * @packageDocumentation
 * `@stageml/onnx-lower`: StageML IR → ONNX.
 *
 * - `lowerToOnnx(graph, { weights })` lowers a (residual) graph to an ONNX model of opset
 *   `ONNX_OPSET` (default domain; `com.microsoft` MatMulNBits for quantized linears): parameters become initializers, inputs keep their names
 *   with symbolic dims as `dim_param` (computed at run time from input shapes where ops need them),
 *   and every op lowers through `ONNX_RULES`, an exhaustive table over `OpKey`.
 * - `ONNX_FUSED_RULES` (opt-in, onnxruntime only): rmsNorm, residual add + rmsNorm, rotary and
 *   causal attention as onnxruntime's fused kernels where their semantics provably match.
 * - `encodeOnnx` / `writeOnnx` serialize with `@bufbuild/protobuf` and the official onnx.proto
 *   schema (package `onnx-buf`), inline or with large initializers as ONNX external data.
 *
 * Invariants: each IR dtype travels in its compute type (`computeType`: f16/bf16 as float32, i8/u8
 * as int32, holding values of the narrow type, rounded or wrapped after every op), so results
 * equal the reference interpreter's within float tolerance; the input graph is never modified;
 * every error is an `OnnxLowerError` with a stable `ONNX_*` code.
 */
export { OnnxCode, OnnxLowerError } from './errors.js';
export type { OnnxErrorCode } from './errors.js';
export { ElemType, computeType, encodeValues, hostBytes, narrowType } from './dtypes.js';
export type { ComputeElemType } from './dtypes.js';
export { OnnxGraphBuilder, SLICE_END } from './builder.js';
export type { InitializerSpec, InputShape } from './builder.js';
export { conform, convert } from './convert.js';
export { exactLowering, lowering, unsupported } from './rule.js';
export type { LowerContext, Lowering, OnnxRule, OnnxRuleTable, Unsupported } from './rule.js';
export { ONNX_FUSED_RULES, ONNX_RULES } from './rules.js';
export { attentionFused, hasEqualHalves, linearWeightMajor, rmsNormFused, rotaryFused } from './rules-fused.js';
export { MS_DOMAIN, quantizedLinearLowering, usesMatMulNBits } from './rules-quant.js';
export type { QuantizedLinearLoweringOptions } from './rules-quant.js';
export { ONNX_IR_VERSION, ONNX_OPSET, lowerToOnnx } from './lower.js';
export type { LowerOnnxOptions, OnnxModel, OnnxTensorSpec } from './lower.js';
export { encodeOnnx, writeOnnx } from './encode.js';
export type { EncodeOnnxOptions, EncodedOnnx, ExternalTensor } from './encode.js';
export type { DimSpec, OnnxAttr } from './proto.js';
