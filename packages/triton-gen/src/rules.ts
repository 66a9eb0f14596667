import type { OpKey } from '@stageml/ir';
import { type KernelRule, hostReasonOf, kernelRule, unsupportedRule } from '@stageml/kernel-patterns';

/** How the Triton backend handles one op (the shared kernel-backend rule shape). */
export type TritonRule = KernelRule;

const kernel = kernelRule;

/** An op the Triton backend emits no kernel for, with the reason (`TRITON_UNSUPPORTED_OP` in strict mode). */
export function unsupported(reason: string): TritonRule {
  return unsupportedRule(reason);
}

const ELEMENTWISE = unsupported('elementwise ops are not fused yet: the host executor runs them between kernels');
const ROUTING = unsupported('routing and normalization run on the host executor; triton-gen emits GEMM-family kernels');
const SHAPE = unsupported('layout ops run on the host executor (the kernels read contiguous row-major operands)');
const OUTSIDE = 'outside a LoRA, bank or MoE pattern it runs on the host executor';

// NOTE: this table looks like @stageml/sm90-native's on purpose (a duplicate the duplicates report lists
// and we keep): each backend states its own rule and reason per op, in its own exhaustive table; the
// shared rule shape and helpers live in @stageml/kernel-patterns.
// NOTE: a primitive op's `kernel` entry names the kernels it ends up inside as part of a chain that
// kernel-patterns' serving rules fold into a serving op (`loraLinear`, `gatheredLoraLinear`,
// `loraScatterAdd`, `groupedLoraMatmul`); the generators read those ops, never primitive chains.

/**
 * The Triton backend's rule for every registry op. A complete mapped type checked with
 * `satisfies`: adding an op to `OPS` fails this file's build until it is handled here.
 */
export const tritonRules = {
  constant: kernel(['loraLinear', 'bankGrouped', 'moeLora'], 'only scalar LoRA scales are inlined into kernels'),
  iota: ROUTING,
  randomUniform: unsupported('random ops stay on the host executor (no RNG state in kernels)'),
  add: kernel(['loraLinear', 'bankGathered', 'moeLora'], `the residual sum is fused only into LoRA kernels; ${OUTSIDE}`),
  sub: ELEMENTWISE,
  mul: kernel(['loraLinear', 'bankGrouped', 'bankGathered', 'moeLora'], `the LoRA scale is fused into kernels; ${OUTSIDE}`),
  div: ELEMENTWISE,
  pow: ELEMENTWISE,
  maximum: ELEMENTWISE,
  minimum: ELEMENTWISE,
  neg: ELEMENTWISE,
  abs: ELEMENTWISE,
  exp: ELEMENTWISE,
  log: ELEMENTWISE,
  sqrt: ELEMENTWISE,
  rsqrt: ELEMENTWISE,
  tanh: ELEMENTWISE,
  sigmoid: ELEMENTWISE,
  silu: ELEMENTWISE,
  gelu: ELEMENTWISE,
  sin: ELEMENTWISE,
  cos: ELEMENTWISE,
  equal: ELEMENTWISE,
  notEqual: ELEMENTWISE,
  less: ELEMENTWISE,
  lessEqual: ELEMENTWISE,
  greater: ELEMENTWISE,
  greaterEqual: ELEMENTWISE,
  where: ELEMENTWISE,
  cast: ELEMENTWISE,
  matmul: kernel(['bankGathered'], `batched matmuls are lowered as BGMV shrink/expand; ${OUTSIDE}`),
  linear: kernel(['loraLinear', 'bankGrouped', 'bankGathered'], 'every linear is a kernel (plain or fused with its LoRA)'),
  groupedMatmul: kernel(['moeLora'], 'every grouped matmul is a kernel (plain or fused with its expert LoRA)'),
  quantizedLinear: unsupported('no weight-only quantized GEMM kernel yet: the host executor runs it (onnxruntime MatMulNBits)'),
  sum: ROUTING,
  mean: ROUTING,
  max: ROUTING,
  argmax: ROUTING,
  softmax: ROUTING,
  rmsNorm: unsupported('normalization is not fused yet: the host executor runs it'),
  layerNorm: unsupported('normalization is not fused yet: the host executor runs it'),
  reshape: kernel(['bankGathered'], `a reshape is folded only into BGMV scales; ${OUTSIDE}`),
  transpose: SHAPE,
  broadcastTo: SHAPE,
  concat: SHAPE,
  slice: SHAPE,
  gather: kernel(['bankGathered'], `gathers of stacked factors are folded into BGMV kernels; ${OUTSIDE}`),
  indexSelect: kernel(['bankGrouped'], `row selections are folded into SGMV kernels; ${OUTSIDE}`),
  scatterAdd: kernel(['bankGrouped'], `scatter-adds of LoRA deltas are folded into SGMV kernels; ${OUTSIDE}`),
  topk: ROUTING,
  rotary: unsupported('rotary embedding is not fused yet: the host executor runs it'),
  attention: unsupported('attention kernels are out of scope for triton-gen (LoRA/MoE GEMMs only)'),
  quantizedLoraBank: unsupported('the host executor runs it (fused on cpu-native, elsewhere through its decomposition); no bank-kernel pattern reads int8 factor tables yet'),
  loraBank: unsupported('the host executor runs it (fused or through its decomposition); triton-gen emits bank kernels for the bankGathered/bankGrouped patterns kernel-patterns recognises in staged residuals'),
  loraLinear: kernel(['loraLinear'], 'every loraLinear op is one fused LoRA-linear kernel'),
  cachedAttention: unsupported('attention kernels are out of scope for triton-gen (LoRA/MoE GEMMs only)'),
  loraBankLinear: unsupported('the host executor runs it (the bank kernel on the torch worker, elsewhere through its decomposition)'),
  gatheredLoraLinear: kernel(['bankGathered'], 'every gatheredLoraLinear op is one BGMV kernel'),
  loraScatterAdd: kernel(['bankGrouped'], 'a chain of SGMV steps over a linear of the same x is one SGMV kernel; a step outside such a chain runs on the host executor (through its decomposition)'),
  groupedLoraMatmul: kernel(['moeLora'], 'every groupedLoraMatmul op is one MoE-LoRA kernel'),
  skipRmsNorm: unsupported('normalization is not fused: the host executor runs it'),
} satisfies Readonly<Record<OpKey, TritonRule>>;

/** Why the backend leaves an op node of kind `op` to the host executor. */
export function hostReason(op: OpKey): string {
  return hostReasonOf(tritonRules, op);
}
