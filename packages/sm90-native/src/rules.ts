import type { OpKey } from '@stageml/ir';
import { type KernelRule, hostReasonOf, kernelRule, unsupportedRule } from '@stageml/kernel-patterns';

/** How the sm90 backend handles one op (the shared kernel-backend rule shape). */
export type Sm90Rule = KernelRule;

const kernel = kernelRule;

/** An op the sm90 backend emits no kernel for, with the reason (`SM90_UNSUPPORTED_OP` in strict mode). */
export function unsupported(reason: string): Sm90Rule {
  return unsupportedRule(reason);
}

const ELEMENTWISE = unsupported('elementwise ops are not fused into the tensor-core kernels: the host executor runs them');
const ROUTING = unsupported('routing and normalization run on the host executor; sm90-native emits GEMM-family kernels');
const SHAPE = unsupported('layout ops run on the host executor (the kernels read contiguous row-major operands)');
const OUTSIDE = 'outside a LoRA, bank or MoE pattern it runs on the host executor';

// NOTE: this table looks like @stageml/triton-gen's on purpose (a duplicate the duplicates report lists
// and we keep): each backend states its own rule and reason per op, in its own exhaustive table; the
// shared rule shape and helpers live in @stageml/kernel-patterns.
// NOTE: a primitive op's `kernel` entry names the kernels it ends up inside as part of a chain that
// kernel-patterns' serving rules fold into a serving op (`loraLinear`, `gatheredLoraLinear`,
// `loraScatterAdd`, `groupedLoraMatmul`); the generators read those ops, never primitive chains.

/**
 * The sm90 backend's rule for every registry op: a complete mapped type checked with
 * `satisfies`, so adding an op to `OPS` fails this file's build until it is handled here.
 */
export const sm90Rules = {
  constant: kernel(['loraLinear', 'bankGrouped', 'moeLora'], 'only scalar LoRA scales are folded into kernels'),
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
  linear: kernel(['loraLinear', 'bankGrouped', 'bankGathered'], 'every f16/bf16 linear is a kernel (plain or fused with its LoRA)'),
  groupedMatmul: kernel(['moeLora'], 'every f16/bf16 grouped matmul is a kernel (plain or fused with its expert LoRA)'),
  quantizedLinear: unsupported('no sm_90a weight-only quantized GEMM yet: the host executor runs it'),
  sum: ROUTING,
  mean: ROUTING,
  max: ROUTING,
  argmax: ROUTING,
  softmax: ROUTING,
  rmsNorm: unsupported('normalization is not fused: the host executor runs it'),
  layerNorm: unsupported('normalization is not fused: the host executor runs it'),
  reshape: kernel(['bankGathered'], `a reshape is folded only into BGMV scales; ${OUTSIDE}`),
  transpose: SHAPE,
  broadcastTo: SHAPE,
  concat: SHAPE,
  slice: SHAPE,
  gather: kernel(['bankGathered'], `gathers of stacked factors are folded into BGMV kernels; ${OUTSIDE}`),
  indexSelect: kernel(['bankGrouped'], `row selections are folded into SGMV kernels; ${OUTSIDE}`),
  scatterAdd: kernel(['bankGrouped'], `scatter-adds of LoRA deltas are folded into SGMV kernels; ${OUTSIDE}`),
  topk: ROUTING,
  rotary: unsupported('rotary embedding is not fused: the host executor runs it'),
  attention: unsupported('attention kernels are out of scope for sm90-native (LoRA/MoE GEMMs only)'),
  quantizedLoraBank: unsupported('the host executor runs it (fused on cpu-native, elsewhere through its decomposition); no bank-kernel pattern reads int8 factor tables yet'),
  loraBank: unsupported('the host executor runs it (fused or through its decomposition); sm90-native emits bank kernels for the bankGathered/bankGrouped patterns kernel-patterns recognises in staged residuals'),
  loraLinear: kernel(['loraLinear'], 'every loraLinear op is one fused LoRA-linear kernel'),
  cachedAttention: unsupported('attention kernels are out of scope for sm90-native (LoRA/MoE GEMMs only)'),
  loraBankLinear: unsupported('the host executor runs it (the bank kernel on the torch worker, elsewhere through its decomposition)'),
  gatheredLoraLinear: kernel(['bankGathered'], 'every gatheredLoraLinear op is one BGMV kernel'),
  loraScatterAdd: kernel(['bankGrouped'], 'a chain of SGMV steps over a linear of the same x is one SGMV kernel; a step outside such a chain runs on the host executor (through its decomposition)'),
  groupedLoraMatmul: kernel(['moeLora'], 'every groupedLoraMatmul op is one MoE-LoRA kernel'),
  skipRmsNorm: unsupported('normalization is not fused: the host executor runs it'),
} satisfies Readonly<Record<OpKey, Sm90Rule>>;

/** Why the backend leaves an op node of kind `op` to the host executor. */
export function hostReason(op: OpKey): string {
  return hostReasonOf(sm90Rules, op);
}
