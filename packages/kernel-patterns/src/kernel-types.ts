// The kernel specs `recognizeResidual` returns: plain data, shared by every GPU backend.
import type { TensorType } from '@stageml/ir';

/** Element types a residual kernel may compute in (backends narrow this further). */
export type PatternDType = TensorType['dtype'];

/** One adapter's LoRA factors inside a recognized pattern, by value name. */
export interface LoraFactors {
  /** A: [r, in] (per expert [E, r, in] in MoE patterns). */
  readonly a: string;
  /** B: [out, r] (per expert [E, out, r]). */
  readonly b: string;
  /** Rank r. */
  readonly rank: number;
  /** Scale s (1 when the graph applies none). */
  readonly scale: number;
  /** Bias of B [out] (`lora_bias`), scaled with the delta. */
  readonly biasB?: string | undefined;
}

/** Fields every kernel spec has. */
export interface KernelCommon {
  /** Unique identifier of the kernel (Python/C identifier). */
  readonly name: string;
  /** Value the kernel computes. */
  readonly output: string;
  /** Element type of operands and result. */
  readonly dtype: PatternDType;
  /** Contraction (input) dim K. */
  readonly inDim: number;
  /** Output dim N. */
  readonly outDim: number;
  /** Printed row count (product of x's leading dims, usually symbolic: `batch`). */
  readonly rows: string;
  /** Activation operand [..., K]. */
  readonly x: string;
  /** Indices of the op nodes the kernel replaces. */
  readonly nodes: readonly number[];
}

/** y = x·Wᵀ + b + s·((x·Aᵀ)·Bᵀ + b_B): a linear with an optional single LoRA adapter. */
export interface LoraLinearKernel extends KernelCommon {
  readonly kind: 'loraLinear';
  /** W [out, in]. */
  readonly w: string;
  /** Bias [out]. */
  readonly bias?: string | undefined;
  /** The adapter (absent: a plain linear). */
  readonly lora?: LoraFactors | undefined;
}

/** One SGMV group: the rows (i64 [n]) that use one adapter. */
export interface BankGroup extends LoraFactors {
  /** Row-index value (along axis 0 of x). */
  readonly rowsValue: string;
}

/** SGMV: y = x·Wᵀ + b; y[rows_g] += s_g·(x[rows_g]·A_gᵀ)·B_gᵀ for every group g (mixed ranks). */
export interface BankGroupedKernel extends KernelCommon {
  readonly kind: 'bankGrouped';
  readonly w: string;
  readonly bias?: string | undefined;
  /** Groups in graph order; ranks may differ. */
  readonly groups: readonly BankGroup[];
}

/** BGMV: y[i] = x[i]·Wᵀ + b + s[a_i]·(x[i]·A[a_i]ᵀ)·B[a_i]ᵀ with stacked factors. */
export interface BankGatheredKernel extends KernelCommon {
  readonly kind: 'bankGathered';
  readonly w: string;
  readonly bias?: string | undefined;
  /** Stacked A [L, r, in]. */
  readonly a: string;
  /** Stacked B [L, out, r]. */
  readonly b: string;
  /** Per-adapter scales [L]. */
  readonly scales: string;
  /** Adapter index of each leading row (i64 [batch]). */
  readonly ids: string;
  /** Adapters L in the stack. */
  readonly numAdapters: number;
  /** Stack rank r (smaller adapters are zero-padded). */
  readonly rank: number;
  /** Rows per id: the product of x's dims between the batch axis and K (often 1). */
  readonly rowsPerId: number;
}

/** MoE expert GEMM: y[n] = x[n]·W_{g_n}ᵀ + s·(x[n]·A_{g_n}ᵀ)·B_{g_n}ᵀ, rows routed to experts g. */
export interface MoeLoraKernel extends KernelCommon {
  readonly kind: 'moeLora';
  /** Expert weights: [E, out, in] when `transposeW`, else [E, in, out]. */
  readonly w: string;
  /** Layout flag of `w`. */
  readonly transposeW: boolean;
  /** Expert index of each row (i64 [rows]). */
  readonly experts: string;
  /** Experts E. */
  readonly numExperts: number;
  /** Expert LoRA (A [E, r, in], B [E, out, r]); absent: base experts only. */
  readonly lora?: LoraFactors | undefined;
}

/** A kernel-sized piece of a residual graph. */
export type ResidualKernel = LoraLinearKernel | BankGroupedKernel | BankGatheredKernel | MoeLoraKernel;

/** Kind tag of a residual kernel. */
export type ResidualKernelKind = ResidualKernel['kind'];

/** A structural match that cannot become a kernel (a dim the kernels specialize on is symbolic). */
export interface PatternRejection {
  /** Root node of the match. */
  readonly node: number;
  /** Value the match computes. */
  readonly value: string;
  /** What is wrong. */
  readonly message: string;
}

/** What `recognizeResidual` found. */
export interface Recognition {
  /** Kernels, in graph order of their outputs. */
  readonly kernels: readonly ResidualKernel[];
  /** Op nodes no kernel covers (scalar constants consumed by kernels are covered). */
  readonly uncovered: readonly number[];
  /** Matches that were dropped. */
  readonly rejected: readonly PatternRejection[];
}
