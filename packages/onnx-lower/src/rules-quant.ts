import type { AttrsOf, TensorType } from '@stageml/ir';
import { quantBlocks } from '@stageml/ir';

import type { OnnxGraphBuilder } from './builder.js';
import { conform } from './convert.js';
import { type ComputeElemType, ElemType, computeType } from './dtypes.js';
import { OnnxCode, OnnxLowerError } from './errors.js';
import { type Lowering, lowering } from './rule.js';

/** The onnxruntime contrib-op domain (`MatMulNBits`, `SkipSimplifiedLayerNormalization`, …). */
export const MS_DOMAIN = 'com.microsoft';

/**
 * Whether a quantized linear lowers to onnxruntime's `com.microsoft` MatMulNBits: 4 or 8 bits,
 * a power-of-two block of at least 16 inputs (its kernels' constraint), f32 compute. Other
 * configurations dequantize with standard ops and multiply (correct, much slower).
 */
export function usesMatMulNBits(attrs: AttrsOf<'quantizedLinear'>, x: TensorType): boolean {
  const bs = attrs.blockSize;
  return (attrs.bits === 4 || attrs.bits === 8) && bs >= 16 && (bs & (bs - 1)) === 0 && x.dtype === 'f32';
}

/**
 * Unpacks byte codes [.., n] (compute-typed) into float codes [.., n·8/bits]: 8-bit codes are the
 * bytes; 4-bit bytes hold two codes, low nibble first.
 */
function unpack(b: OnnxGraphBuilder, bytes: string, bits: number, lead: readonly number[], n: number, t: ComputeElemType): string {
  const f = b.cast(bytes, t);
  if (bits === 8) return f;
  const hi = b.op('Floor', [b.op('Div', [f, b.scalar(16, t)])]);
  const lo = b.op('Sub', [f, b.op('Mul', [hi, b.scalar(16, t)])]);
  const pairs = b.op('Concat', [b.op('Unsqueeze', [lo, b.int64s([-1])]), b.op('Unsqueeze', [hi, b.int64s([-1])])], { axis: -1 });
  return b.op('Reshape', [pairs, b.int64s([...lead, n * 2])]);
}

/** Options of `quantizedLinearLowering`. */
export interface QuantizedLinearLoweringOptions {
  /**
   * MatMulNBits' `accuracy_level`: 4 (default) quantizes each activation block to int8 and runs
   * integer dot products (VNNI/AVX-512 kernels, what llama.cpp's Q8_0/Q4_0 paths do; relative
   * error ~4e-4 against the reference, bounded by `@stageml/planner`'s
   * `quantizedLinearErrorBound` with `int8Activations`); 0 computes in f32 (exact to float
   * rounding, but onnxruntime 1.30's 8-bit f32 path dequantizes the whole weight per call: ~30×
   * slower than f32 MatMul).
   */
  readonly accuracyLevel?: 0 | 4;
}

/**
 * y = x · dequantize(q)ᵀ. Eligible configurations (see `usesMatMulNBits`) are one MatMulNBits
 * node (accuracy level 0: dequantized f32 arithmetic) reading the u8 codes, scales and packed zero
 * points in their IR layout, which is MatMulNBits'. Others unpack the codes with standard ops,
 * dequantize ((code − zp)·scale per block), cut the padding and run MatMul.
 */
export function quantizedLinearLowering(opts: QuantizedLinearLoweringOptions = {}): Lowering<'quantizedLinear'> {
  const accuracyLevel = opts.accuracyLevel ?? 4;
  return lowering<'quantizedLinear'>(({ b, inputs, operands, attrs, native }) => {
  const [x, q, s, zp] = inputs;
  const out = b.resolve(operands[1]!.shape[0]!);
  const K = attrs.inFeatures;
  const blocks = quantBlocks(K, attrs.blockSize);
  const u8 = (i: number, name: string): string => (native?.[i] === true ? name : b.cast(name, ElemType.UINT8));
  if (usesMatMulNBits(attrs, operands[0]!) && typeof out === 'number') {
    const ins = [x!, u8(1, q!), b.op('Reshape', [s!, b.int64s([-1])])];
    if (zp !== undefined) ins.push(b.op('Reshape', [u8(3, zp), b.int64s([-1])]));
    return [b.msOp('MatMulNBits', ins, { K, N: out, bits: attrs.bits, block_size: attrs.blockSize, accuracy_level: accuracyLevel })];
  }
  if (typeof out !== 'number') throw new OnnxLowerError(OnnxCode.BAD_GRAPH, 'quantizedLinear needs a static number of outputs');
  const bs = attrs.blockSize;
  const t = computeType(operands[0]!.dtype);
  const codes = unpack(b, q!, attrs.bits, [out, blocks], Math.ceil((bs * attrs.bits) / 8), t); // [out, blocks, ≥bs]
  const cut = b.op('Slice', [codes, b.int64s([0]), b.int64s([bs]), b.int64s([2])]);
  const zpf = zp === undefined
    ? b.scalar(2 ** (attrs.bits - 1), t)
    : b.op('Unsqueeze', [b.op('Slice', [unpack(b, zp, attrs.bits, [out], Math.ceil((blocks * attrs.bits) / 8), t), b.int64s([0]), b.int64s([blocks]), b.int64s([1])]), b.int64s([-1])]);
  const deq = b.op('Mul', [b.op('Sub', [cut, zpf]), b.op('Unsqueeze', [s!, b.int64s([-1])])]);
  const flat = b.op('Slice', [b.op('Reshape', [deq, b.int64s([out, blocks * bs])]), b.int64s([0]), b.int64s([K]), b.int64s([1])]);
  // The semantics rounds the dequantized weight to x's dtype before the product.
  const w = conform(b, flat, operands[0]!.dtype);
  return [b.op('MatMul', [x!, b.op('Transpose', [w], { perm: [1, 0] })])];
  });
}

/** The default lowering: MatMulNBits at accuracy level 4 (int8 activations) where eligible. */
export const quantizedLinear = quantizedLinearLowering();
