import type { GraphBuilder, Value } from '@stageml/ir';

/** LoRA factors as graph values: Δy = scale · linear(linear(x, A), B, biasB). */
export interface LoraValues {
  /** A [r, in]. */
  readonly A: Value;
  /** B [out, r]. */
  readonly B: Value;
  /** Scale s. */
  readonly scale: number;
  /** Bias of B [out] (`lora_bias`), scaled with the delta as PEFT does. */
  readonly biasB?: Value;
}

/** How a LoRA delta is applied: kept low-rank (`residual`) or folded into the weight (`merged`). */
export type LoraForm = 'residual' | 'merged';

/**
 * A linear layer with an optional LoRA adapter, in either form:
 *
 * - residual: y = x·Wᵀ + b + s·((x·Aᵀ)·Bᵀ + b_B) — what PEFT computes, cheap per request for small r;
 * - merged:   y = x·(W + s·B·A)ᵀ + (b + s·b_B) — one GEMM per request; the merged weight depends
 *   only on adapter-stage values, so specialization folds it once.
 *
 * Both forms are plain IR, so the rewriter and planner can turn one into the other.
 */
export function loraLinear(b: GraphBuilder, x: Value, w: Value, bias: Value | undefined, lora: LoraValues | undefined, form: LoraForm = 'residual'): Value {
  if (lora === undefined) return b.linear(x, w, bias);
  const s = b.scalar(lora.scale, w.type.dtype);
  if (form === 'merged') {
    const merged = b.add(w, b.mul(b.matmul(lora.B, lora.A), s));
    const mergedBias = lora.biasB === undefined ? bias : bias === undefined ? b.mul(lora.biasB, s) : b.add(bias, b.mul(lora.biasB, s));
    return b.linear(x, merged, mergedBias);
  }
  const base = b.linear(x, w, bias);
  const delta = b.linear(b.linear(x, lora.A), lora.B, lora.biasB);
  return b.add(base, b.mul(delta, s));
}
