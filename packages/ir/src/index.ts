/**
 * @packageDocumentation
 * `@stageml/ir`: StageML's typed tensor IR, usable on its own by any compiler.
 *
 * - dtypes and symbolic shapes (`Dim`: integers or polynomials over named sizes);
 * - one op registry (`OPS`): operands, typed attributes, shape/dtype inference, effects, FLOP and
 *   byte costs and reference semantics, read by every consumer;
 * - graphs of SSA values in topological order (inputs, parameters whose data lives in a weight
 *   store, op applications, named outputs), built by `GraphBuilder`/`traceGraph`;
 * - `verifyGraph` with coded errors pointing at nodes; a generic text form (`printGraph` /
 *   `parseGraph`, exact round trip) and versioned JSON; a pass manager; and the reference
 *   interpreter (`interpret`), the numeric oracle of the project.
 *
 * Invariants: graphs are immutable plain data; passes return new graphs; every error thrown for
 * bad input is an `IrError` with a stable `IR_*` code.
 */
export { IrCode, IrError, StageError } from './errors.js';
export type { IrErrorCode, NodeRef, StageErrorOptions } from './errors.js';
export { ERROR_CLASSES, classifyError, errorCodeInfo, errorMessage, registerErrorCodes, registeredErrorCodes } from './error-classes.js';
export type { ErrorClass, ErrorClassInfo, ErrorClassTable, ErrorCodeInfo, ErrorCodeSpec } from './error-classes.js';
export {
  DTYPES,
  allocData,
  dtypeBytes,
  exactIn,
  f16Bits,
  f16FromBits,
  isDType,
  isFloatDType,
  isIntDType,
  parseDType,
  roundBf16,
  roundF16,
  roundFloat32InPlace,
  rounderFor,
} from './dtype.js';
export type { DType, FloatDType, TensorData } from './dtype.js';
export {
  checkDim,
  dimAdd,
  dimDivExact,
  dimEquals,
  dimMul,
  dimProduct,
  dimSub,
  dimAsSymbol,
  dimSymbols,
  dimToString,
  evalDim,
  isStaticDim,
  isSymbolName,
  parseDim,
  substituteDim,
  dimSum,
  sym,
} from './dim.js';
export type { Dim, DimBindings, DimTerm, SymDim } from './dim.js';
export {
  broadcastShapes,
  concreteShape,
  f32,
  isStaticType,
  normalizeAxis,
  numElements,
  parseType,
  shapeEquals,
  shapeToString,
  tensorType,
  typeBytes,
  typeEquals,
  typeToString,
} from './types.js';
export type { TensorType } from './types.js';
export { attr, concretizeAttrs, isDefaultAttr, normalizeAttrs } from './attrs.js';
export type { AttrInput, AttrSchema, AttrSpec, AttrTsType, AttrValue, AttrValues } from './attrs.js';
export { broadcastStrides, forEachIndex, hostTensor, scalar, sizeOf, stridesOf, toArray, zeros } from './tensor.js';
export type { HostTensor } from './tensor.js';
export { defineOp, operandArity, snakeCase } from './op-def.js';
export type { Decomposition, Effect, EvalContext, OpCost, OpDef, OpSpec, Trait } from './op-def.js';
export { OPS, OP_KEYS, isOpKey, opDef, opKeyByName, registerOp } from './ops/index.js';
export { type LoraBankForm, type LoraBankOperands, type LoraLinearOperands, loraBankOperands, loraLinearOperands } from './ops/serving.js';
export { type QuantizedLoraBankOperands, quantizedLoraBankOperands } from './ops/quant-serving.js';
export { type LoraBankLinearOperands, loraBankLinearOperands } from './ops/serving-fused.js';
export { OP_GROUPS, TRAITS, hasTrait, opsWithTrait } from './op-groups.js';
export { COMPOSITE_OPS, expandComposites, expandDecomposed } from './decompose.js';
export { dequantizeWeight, quantBlockBytes, quantBlocks, quantZeroPointBytes, quantizeWeight, unpackCode } from './ops/quant.js';
export type { PackedWeight, WeightQuantOptions } from './ops/quant.js';
export type { AttrsIn, AttrsOf, OpKey } from './ops/index.js';
export { graphInputs, graphOps, graphParams, graphStats, resultOf, valueType, valueUsers } from './graph.js';
export type { Graph, GraphNode, GraphOutput, InputNode, OpNode, ParamNode, SourceSpan, ValueId, ValueInfo } from './graph.js';
export { GraphBuilder, internKeyReplacer, traceGraph } from './builder.js';
export type { ApplyOptions, BuilderOptions, Value } from './builder.js';
export { checkGraph, verifyGraph } from './verify.js';
export { printAttr, printFloat, printGraph, printName } from './print.js';
export { parseGraph, stripSpans } from './parse.js';
export type { ParseOptions } from './parse.js';
export { GRAPH_JSON_FORMAT, GRAPH_JSON_VERSION, deserializeGraph, graphToJson, serializeGraph } from './json.js';
export type { GraphJson } from './json.js';
export { PassManager } from './pass.js';
export type { Pass, PassManagerOptions, PassRunResult, PassTiming } from './pass.js';
export { asWeightStore, bindDims, evaluateNode, interpret, recordWeightStore, seededRandom } from './interpret.js';
export { jsonDepth } from './json-depth.js';
export type { InterpretOptions, WeightStore } from './interpret.js';
export { evalCost, graphCost } from './cost.js';
export { decomposedRule, isDecomposedRule, isUnsupportedRule, unsupportedRule } from './backend-rule.js';
export type { DecomposedRule, UnsupportedRule } from './backend-rule.js';
export type { GraphCost } from './cost.js';
