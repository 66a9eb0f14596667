import type { HostTensor } from '@stageml/ir';
import { PlanCode, PlanError } from './errors.js';

/** One LoRA module's factors as PEFT stores them: A [r, in], B [out, r] and the scale s (D = s·B·A). */
export interface LoraFactorsInput {
  readonly A: HostTensor;
  readonly B: HostTensor;
  readonly scale: number;
}

/** What storing one module's factors as int8 with a scale per rank row changes (`loraFactorQuantBound`). */
export interface LoraFactorQuantBound {
  /** ‖D̂ − D‖_F, D = s·B·A, D̂ the product of the factors `quantizeFactorRows` stores (measured in float64, with 2⁻²⁴‖D̂‖_F for f32 arithmetic). */
  readonly frobenius: number;
  /** The a-priori bound on ‖D̂ − D‖_F from the scheme alone (any factors of these row maxima and norms). */
  readonly apriori: number;
  /** ‖W + D‖_F, the layer's effective weight (‖D‖_F when no base weight is given). */
  readonly reference: number;
  /** frobenius / reference: bounds the RMS relative output error of the layer for isotropic inputs. */
  readonly relative: number;
}

const F32_U = 2 ** -24;

/** Largest code magnitude of int8 factors (the restricted symmetric range [−127, 127]). */
export const FACTOR_CODE_MAX = 127;

/**
 * The int8 factor scheme (`adapterDtype: 'int8'`), one scale per row: quantizes `rows` rows of
 * `width` values of `src` (row-major from 0) into `codes` at `codeStart` and their scales into
 * `scales` at `scaleStart`: scale = f32(max|row| / 127), code = round(v / scale) clamped to
 * [−127, 127] (−128 unused, so a zero row is zero codes with scale 0). Every element moves by at
 * most scale / 2. Returns the largest absolute error (code·scale − v).
 */
export function quantizeFactorRows(src: ArrayLike<number>, rows: number, width: number, codes: Int8Array, codeStart: number, scales: Float32Array, scaleStart: number): number {
  let worst = 0;
  for (let r = 0; r < rows; r++) {
    const base = r * width;
    let max = 0;
    for (let i = 0; i < width; i++) max = Math.max(max, Math.abs(src[base + i]!));
    // NOTE: codes are computed against the stored (f32) scale, so code·scale is what kernels use.
    const scale = Math.fround(max / FACTOR_CODE_MAX);
    scales[scaleStart + r] = scale;
    const dst = codeStart + base;
    if (scale === 0) {
      codes.fill(0, dst, dst + width);
      continue;
    }
    for (let i = 0; i < width; i++) {
      const v = src[base + i]!;
      const q = Math.max(-FACTOR_CODE_MAX, Math.min(FACTOR_CODE_MAX, Math.round(v / scale)));
      codes[dst + i] = q;
      worst = Math.max(worst, Math.abs(v - q * scale));
    }
  }
  return worst;
}

function dims2(t: HostTensor, what: string): [number, number] {
  if (t.shape.length !== 2) throw new PlanError(PlanCode.BAD_QUANT_CONFIG, `${what} must be a matrix, got shape [${t.shape.join(', ')}]`);
  return t.shape as [number, number];
}

/**
 * What int8 adapter factors (`adapterDtype: 'int8'`, `stageml serve --adapter-dtype int8`) change
 * in one LoRA layer. The slot tables hold, per rank row k, a_k = A[k, :] and b_k = s·B[:, k] (the
 * scale folded into B), each quantized over its own row by `quantizeFactorRows`, so every element
 * moves by at most half a step, δ_k = max|row| / 254 · (1 + 2⁻²³) (the f32 scale), and a row of n
 * elements by ‖e_k‖₂ ≤ √n·δ_k. D = Σ_k b_k a_kᵀ is a sum of rank-one terms and ‖u vᵀ‖_F = ‖u‖‖v‖,
 * so a priori
 *
 *   ‖D̂ − D‖_F ≤ Σ_k ‖b_k‖‖e^A_k‖ + ‖e^B_k‖‖a_k‖ + ‖e^B_k‖‖e^A_k‖   (`apriori`)
 *
 * and a posteriori (`frobenius`, the smaller of the two) the factors are quantized as the engine
 * does and ‖D̂ − D‖_F is measured in float64. The layer's output moves by ‖(D̂ − D)·x‖ ≤
 * ‖D̂ − D‖_F‖x‖; against its output (W + D)·x the relative error is, for isotropic x, at most
 * ‖D̂ − D‖_F / ‖W + D‖_F (`relative`) — the base weights' gate measure (`weightQuantizationError`),
 * so the two sum into one first-order prediction of the logits' relative error (layers in series
 * add to first order). Factors whose shapes disagree are PLAN_BAD_QUANT_CONFIG.
 */
export function loraFactorQuantBound(f: LoraFactorsInput, weight?: HostTensor): LoraFactorQuantBound {
  const [r, inF] = dims2(f.A, 'A');
  const [out, rb] = dims2(f.B, 'B');
  if (rb !== r) throw new PlanError(PlanCode.BAD_QUANT_CONFIG, `B [${String(out)}, ${String(rb)}] does not have A's rank ${String(r)}`);
  if (weight !== undefined) {
    const [wo, wi] = dims2(weight, 'weight');
    if (wo !== out || wi !== inF) throw new PlanError(PlanCode.BAD_QUANT_CONFIG, `weight [${String(wo)}, ${String(wi)}] does not match the factors' [${String(out)}, ${String(inF)}]`);
  }
  // The rows as the slot tables hold them: a_k = A[k, :], b_k = s·B[:, k].
  const a = Float64Array.from({ length: r * inF }, (_, i) => Number(f.A.data[i]));
  const b = new Float64Array(r * out);
  for (let k = 0; k < r; k++) for (let o = 0; o < out; o++) b[k * out + o] = f.scale * Number(f.B.data[o * r + k]);
  const dequantized = (rows: Float64Array, width: number): Float64Array => {
    const codes = new Int8Array(r * width);
    const scales = new Float32Array(r);
    quantizeFactorRows(rows, r, width, codes, 0, scales, 0);
    return Float64Array.from(codes, (q, i) => q * scales[Math.floor(i / width)]!);
  };
  const aHat = dequantized(a, inF);
  const bHat = dequantized(b, out);
  const step = (1 / 254) * (1 + 2 * F32_U);
  let apriori = 0;
  for (let k = 0; k < r; k++) {
    const norm = (v: Float64Array, w: number): { max: number; l2: number } => {
      let max = 0;
      let l2 = 0;
      for (let i = k * w; i < (k + 1) * w; i++) {
        max = Math.max(max, Math.abs(v[i]!));
        l2 += v[i]! * v[i]!;
      }
      return { max, l2: Math.sqrt(l2) };
    };
    const na = norm(a, inF);
    const nb = norm(b, out);
    const eA = Math.sqrt(inF) * na.max * step;
    const eB = Math.sqrt(out) * nb.max * step;
    apriori += nb.l2 * eA + eB * na.l2 + eB * eA;
  }
  apriori *= 1 + 1e-12;
  // ‖D̂ − D‖_F, ‖D̂‖_F and ‖W + D‖_F row by row in float64.
  let e2 = 0;
  let hat2 = 0;
  let ref2 = 0;
  const d = new Float64Array(inF);
  const dh = new Float64Array(inF);
  for (let o = 0; o < out; o++) {
    d.fill(0);
    dh.fill(0);
    for (let k = 0; k < r; k++) {
      const bk = b[k * out + o]!;
      const bh = bHat[k * out + o]!;
      for (let i = 0; i < inF; i++) {
        d[i] = d[i]! + bk * a[k * inF + i]!;
        dh[i] = dh[i]! + bh * aHat[k * inF + i]!;
      }
    }
    for (let i = 0; i < inF; i++) {
      e2 += (dh[i]! - d[i]!) ** 2;
      hat2 += dh[i]! ** 2;
      const w = (weight === undefined ? 0 : Number(weight.data[o * inF + i])) + d[i]!;
      ref2 += w * w;
    }
  }
  const frobenius = Math.min(apriori, (Math.sqrt(e2) + F32_U * Math.sqrt(hat2)) * (1 + 1e-12));
  const reference = Math.sqrt(ref2);
  return { frobenius, apriori, reference, relative: reference > 0 ? frobenius / reference : frobenius > 0 ? Number.POSITIVE_INFINITY : 0 };
}
