import { attr } from '../attrs.js';
import { type Dim, dimAdd, dimEquals, dimProduct, dimToString } from '../dim.js';
import { allocData, rounderFor } from '../dtype.js';
import { defineOp, dtypeError, evalError, shapeError } from '../op-def.js';
import type { HostTensor } from '../tensor.js';
import { sizeOf } from '../tensor.js';
import { type TensorType, shapeToString } from '../types.js';
import { requireFloat, requireRank } from './common.js';

/** Bytes one block of `blockSize` `bits`-bit codes takes (two 4-bit codes per byte, low nibble first). */
export function quantBlockBytes(bits: number, blockSize: number): number {
  return Math.ceil((blockSize * bits) / 8);
}

/** Blocks of one weight row: ⌈inFeatures / blockSize⌉. */
export function quantBlocks(inFeatures: number, blockSize: number): number {
  return Math.ceil(inFeatures / blockSize);
}

/** Bytes of one row of packed zero points: ⌈blocks · bits / 8⌉. */
export function quantZeroPointBytes(bits: number, blocks: number): number {
  return Math.ceil((blocks * bits) / 8);
}

/** Code `j` of a packed byte row (`bits` = 8: byte j; 4: nibble j, low nibble first). */
export function unpackCode(data: ArrayLike<number>, offset: number, j: number, bits: number): number {
  if (bits === 8) return data[offset + j]!;
  const byte = data[offset + (j >> 1)]!;
  return (j & 1) === 0 ? byte & 0x0f : byte >> 4;
}

function checkAttrs(bits: number, blockSize: number, inFeatures: number): void {
  if (bits !== 4 && bits !== 8) dtypeError('quantizedLinear', `bits must be 4 or 8, got ${String(bits)}`);
  if (!Number.isSafeInteger(blockSize) || blockSize < 1) shapeError('quantizedLinear', `blockSize must be a positive integer, got ${String(blockSize)}`);
  if (!Number.isSafeInteger(inFeatures) || inFeatures < 1) shapeError('quantizedLinear', `inFeatures must be a positive integer, got ${String(inFeatures)}`);
  if (bits === 4 && blockSize % 2 !== 0) shapeError('quantizedLinear', `4-bit blocks hold whole bytes: blockSize must be even, got ${String(blockSize)}`);
}

function requireU8(t: TensorType, what: string): void {
  if (t.dtype !== 'u8') dtypeError('quantizedLinear', `${what} must be u8, got ${t.dtype}`);
}

/**
 * y = x · dequantize(q)ᵀ: a linear layer whose [out, in] weight is stored as `bits`-bit unsigned
 * codes in blocks of `blockSize` consecutive inputs of a row, one scale (and zero point) per
 * block: w[o, i] = (code[o, i] − zp[o, ⌊i / blockSize⌋]) · scale[o, ⌊i / blockSize⌋]. The zero
 * point defaults to 2^(bits−1) (symmetric). The layout is onnxruntime's `MatMulNBits`:
 * `qweight` u8 [out, blocks, blockBytes] (4-bit: two codes per byte, low nibble first; the last
 * block zero-padded), `scales` [out, blocks] in x's dtype, `zeroPoints` u8 [out, ⌈blocks·bits/8⌉]
 * packed the same way. Per-channel quantization is `blockSize = inFeatures`.
 */
export const quantizedLinear = defineOp({
  key: 'quantizedLinear',
  summary: 'Linear layer over a weight stored as 4- or 8-bit block-quantized codes with per-block scales and zero points (MatMulNBits layout).',
  semantics: 'y[…, o] = Σᵢ x[…, i] · (code[o, i] − zp[o, ⌊i/B⌋]) · scale[o, ⌊i/B⌋],  zp = 2^(bits−1) when absent',
  operands: ['x', 'qweight', 'scales', 'zeroPoints?'],
  attrs: {
    bits: attr.int({ default: 8 }),
    blockSize: attr.int({ min: 1 }),
    inFeatures: attr.int({ min: 1 }),
  },
  traits: ['contraction'],
  infer: ([x, q, s, zp], a) => {
    checkAttrs(a.bits, a.blockSize, a.inFeatures);
    requireFloat('quantizedLinear', x!);
    requireRank('quantizedLinear', x!, 1, 'x');
    requireU8(q!, 'qweight');
    if (s!.dtype !== x!.dtype) dtypeError('quantizedLinear', `scales must have x's dtype ${x!.dtype}, got ${s!.dtype}`);
    const blocks = quantBlocks(a.inFeatures, a.blockSize);
    const bb = quantBlockBytes(a.bits, a.blockSize);
    if (q!.shape.length !== 3 || !dimEquals(q!.shape[1]!, blocks) || !dimEquals(q!.shape[2]!, bb)) {
      shapeError('quantizedLinear', `qweight must be [out, ${String(blocks)}, ${String(bb)}] for ${String(a.inFeatures)} inputs in blocks of ${String(a.blockSize)} at ${String(a.bits)} bits, got ${shapeToString(q!.shape)}`);
    }
    const out: Dim = q!.shape[0]!;
    if (s!.shape.length !== 2 || !dimEquals(s!.shape[0]!, out) || !dimEquals(s!.shape[1]!, blocks)) {
      shapeError('quantizedLinear', `scales must be [${dimToString(out)}, ${String(blocks)}], got ${shapeToString(s!.shape)}`);
    }
    if (zp !== undefined) {
      requireU8(zp, 'zeroPoints');
      const zb = quantZeroPointBytes(a.bits, blocks);
      if (zp.shape.length !== 2 || !dimEquals(zp.shape[0]!, out) || !dimEquals(zp.shape[1]!, zb)) {
        shapeError('quantizedLinear', `zeroPoints must be [${dimToString(out)}, ${String(zb)}], got ${shapeToString(zp.shape)}`);
      }
    }
    const inX = x!.shape[x!.shape.length - 1]!;
    if (!dimEquals(inX, a.inFeatures)) shapeError('quantizedLinear', `x ${shapeToString(x!.shape)} does not have inFeatures = ${String(a.inFeatures)} inputs`);
    return [{ dtype: x!.dtype, shape: [...x!.shape.slice(0, -1), out] }];
  },
  // Dequantizing costs two flops per weight (subtract, multiply); the product 2·rows·out·in.
  flops: ([x, q], _res, a) => {
    const rows = dimProduct(x!.shape.slice(0, -1));
    return dimAdd(dimProduct([2, rows, q!.shape[0]!, a.inFeatures]), dimProduct([2, q!.shape[0]!, a.inFeatures]));
  },
  evaluate: ([x, q, s, zp], a) => [evalQuantizedLinear(x!, q!, s!, zp, a.bits, a.blockSize, a.inFeatures)],
});

/** The dense [out, in] weight a quantized linear's operands stand for (reference dequantization). */
export function dequantizeWeight(q: HostTensor, s: HostTensor, zp: HostTensor | undefined, bits: number, blockSize: number, inFeatures: number): Float64Array {
  const out = q.shape[0]!;
  const blocks = quantBlocks(inFeatures, blockSize);
  const bb = quantBlockBytes(bits, blockSize);
  const zb = quantZeroPointBytes(bits, blocks);
  if (q.shape[1] !== blocks || q.shape[2] !== bb || s.shape[0] !== out || s.shape[1] !== blocks) evalError('quantizedLinear', 'operand shapes differ from the attributes at run time');
  const w = new Float64Array(out * inFeatures);
  const mid = 2 ** (bits - 1);
  for (let o = 0; o < out; o++) {
    for (let blk = 0; blk < blocks; blk++) {
      const scale = s.data[o * blocks + blk]!;
      const z = zp === undefined ? mid : unpackCode(zp.data, o * zb, blk, bits);
      const base = (o * blocks + blk) * bb;
      const hi = Math.min(blockSize, inFeatures - blk * blockSize);
      for (let j = 0; j < hi; j++) w[o * inFeatures + blk * blockSize + j] = (unpackCode(q.data, base, j, bits) - z) * scale;
    }
  }
  return w;
}

function evalQuantizedLinear(x: HostTensor, q: HostTensor, s: HostTensor, zp: HostTensor | undefined, bits: number, blockSize: number, inFeatures: number): HostTensor {
  const inDim = x.shape[x.shape.length - 1]!;
  if (inDim !== inFeatures) shapeError('quantizedLinear', `x has ${String(inDim)} inputs at run time, the weight ${String(inFeatures)}`);
  const outDim = q.shape[0]!;
  const w = dequantizeWeight(q, s, zp, bits, blockSize, inFeatures);
  // Dequantized weights round to x's dtype first: the semantics is dequantize, then linear.
  const round = rounderFor(x.dtype);
  for (let i = 0; i < w.length; i++) w[i] = round(w[i]!);
  const rows = sizeOf(x.shape.slice(0, -1));
  const out = allocData(x.dtype, rows * outDim);
  const xd = x.data;
  for (let r = 0; r < rows; r++) {
    for (let o = 0; o < outDim; o++) {
      let acc = 0;
      const xb = r * inDim;
      const wb = o * inDim;
      for (let i = 0; i < inDim; i++) acc += xd[xb + i]! * w[wb + i]!;
      out[r * outDim + o] = round(acc);
    }
  }
  return { dtype: x.dtype, shape: [...x.shape.slice(0, -1), outDim], data: out };
}

/** How `quantizeWeight` quantizes: bits, block size and whether zero points are stored. */
export interface WeightQuantOptions {
  /** 8 or 4. */
  readonly bits: 4 | 8;
  /** Inputs per block; `inFeatures` (or more) is per-channel. */
  readonly blockSize: number;
  /**
   * Symmetric (default): scale = max|w| / (2^(bits−1) − 1), codes q + 2^(bits−1) with q in the
   * restricted range [−(2^(bits−1) − 1), 2^(bits−1) − 1], no zero points (the planner's scheme).
   * Asymmetric: scale = (max − min) / (2^bits − 1), a u8 zero point per block.
   */
  readonly symmetric?: boolean;
}

/** A weight packed for `quantizedLinear`: its three (or two) operands and attributes. */
export interface PackedWeight {
  /** Codes u8 [out, blocks, blockBytes]. */
  readonly qweight: HostTensor;
  /** Scales f32 [out, blocks]. */
  readonly scales: HostTensor;
  /** Zero points u8 [out, ⌈blocks·bits/8⌉] (asymmetric only). */
  readonly zeroPoints: HostTensor | undefined;
  /** The op's attributes. */
  readonly attrs: { readonly bits: 4 | 8; readonly blockSize: number; readonly inFeatures: number };
}

function roundEven(v: number): number {
  const f = Math.floor(v);
  const d = v - f;
  if (d < 0.5) return f;
  if (d > 0.5) return f + 1;
  return f % 2 === 0 ? f : f + 1;
}

function packInto(dst: Uint8Array, offset: number, j: number, code: number, bits: number): void {
  if (bits === 8) dst[offset + j] = code;
  else dst[offset + (j >> 1)] = dst[offset + (j >> 1)]! | ((j & 1) === 0 ? code : code << 4);
}

/**
 * Quantizes a row-major [out, in] weight (any float storage: f32, or bf16/f16 values as stored)
 * into `quantizedLinear`'s operands. Rounding is half to even; scales are rounded to f32 before
 * the codes are computed, so dequantization reproduces exactly what the codes mean.
 */
export function quantizeWeight(w: ArrayLike<number>, out: number, inFeatures: number, opts: WeightQuantOptions): PackedWeight {
  const { bits, blockSize } = opts;
  checkAttrs(bits, blockSize, inFeatures);
  if (w.length !== out * inFeatures) shapeError('quantizeWeight', `weight has ${String(w.length)} values, [${String(out)}, ${String(inFeatures)}] needs ${String(out * inFeatures)}`);
  const symmetric = opts.symmetric ?? true;
  const blocks = quantBlocks(inFeatures, blockSize);
  const bb = quantBlockBytes(bits, blockSize);
  const zb = quantZeroPointBytes(bits, blocks);
  const q = new Uint8Array(out * blocks * bb);
  const s = new Float32Array(out * blocks);
  const zp = symmetric ? undefined : new Uint8Array(out * zb);
  const mid = 2 ** (bits - 1);
  const qmax = mid - 1;
  const top = 2 ** bits - 1;
  for (let o = 0; o < out; o++) {
    for (let blk = 0; blk < blocks; blk++) {
      const lo = o * inFeatures + blk * blockSize;
      const n = Math.min(blockSize, inFeatures - blk * blockSize);
      const base = (o * blocks + blk) * bb;
      if (symmetric) {
        let amax = 0;
        for (let j = 0; j < n; j++) amax = Math.max(amax, Math.abs(w[lo + j]!));
        const scale = Math.fround(Math.max(amax, 1e-12) / qmax);
        s[o * blocks + blk] = scale;
        for (let j = 0; j < n; j++) packInto(q, base, j, Math.max(-qmax, Math.min(qmax, roundEven(w[lo + j]! / scale))) + mid, bits);
        // Padding codes dequantize to 0.
        for (let j = n; j < blockSize; j++) packInto(q, base, j, mid, bits);
      } else {
        let mn = 0;
        let mx = 0;
        for (let j = 0; j < n; j++) {
          mn = Math.min(mn, w[lo + j]!);
          mx = Math.max(mx, w[lo + j]!);
        }
        const scale = Math.fround(Math.max(mx - mn, 1e-12) / top);
        const z = Math.max(0, Math.min(top, roundEven(-mn / scale)));
        s[o * blocks + blk] = scale;
        packInto(zp!, o * zb, blk, z, bits);
        for (let j = 0; j < n; j++) packInto(q, base, j, Math.max(0, Math.min(top, roundEven(w[lo + j]! / scale) + z)), bits);
        for (let j = n; j < blockSize; j++) packInto(q, base, j, z, bits);
      }
    }
  }
  return {
    qweight: { dtype: 'u8', shape: [out, blocks, bb], data: q },
    scales: { dtype: 'f32', shape: [out, blocks], data: s },
    zeroPoints: zp === undefined ? undefined : { dtype: 'u8', shape: [out, zb], data: zp },
    attrs: { bits, blockSize, inFeatures },
  };
}
