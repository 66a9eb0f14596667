import { EngineCode, EngineError } from './errors.js';

/**
 * Int8 LoRA factors with a scale per row (`adapterDtype: 'int8'`): symmetric, per rank row of A
 * [r, in] and of the scaled B [r, out] as the slot tables hold them,
 *
 *   scale = max_i |w[i]| / 127,   code[i] = round(w[i] / scale) ∈ [−127, 127],   ŵ[i] = code[i]·scale
 *
 * so |w[i] − ŵ[i]| ≤ scale / 2 = max|w| / 254 for every element (round to nearest; −128 is never
 * used, so the range is symmetric and a zero row stays all-zero codes with scale 0 — the
 * `zeroTail` promise survives quantization). The error this puts on the logits is bounded by
 * `@stageml/planner`'s `loraFactorQuantBound`.
 */

/** Largest code magnitude (the restricted symmetric range [−127, 127]). */
export const FACTOR_CODE_MAX = 127;

/**
 * Quantizes `rows` rows of `width` values of `src` (row-major from 0) into `codes` at `codeStart`
 * and their scales into `scales` at `scaleStart`; returns the largest absolute rounding error
 * (what the bound promises: ≤ max|row| / 254 per row).
 */
export function quantizeFactorRows(src: Float32Array, rows: number, width: number, codes: Int8Array, codeStart: number, scales: Float32Array, scaleStart: number): number {
  let worst = 0;
  for (let r = 0; r < rows; r++) {
    const base = r * width;
    let max = 0;
    for (let i = 0; i < width; i++) max = Math.max(max, Math.abs(src[base + i]!));
    // NOTE: the stored scale is f32; codes are computed against that rounded scale, so the
    // dequantized value the kernels compute (code · f32 scale) is the one whose error is checked.
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

/** Dequantizes `rows` rows of `width` codes (the inverse of `quantizeFactorRows`, in f32). */
export function dequantizeFactorRows(codes: Int8Array, codeStart: number, scales: Float32Array, scaleStart: number, rows: number, width: number): Float32Array {
  const out = new Float32Array(rows * width);
  for (let r = 0; r < rows; r++) {
    const s = scales[scaleStart + r]!;
    for (let i = 0; i < width; i++) out[r * width + i] = codes[codeStart + r * width + i]! * s;
  }
  return out;
}

/**
 * Whether an engine stores int8 factors (`adapterDtype: 'int8'`), after checking it can: an f32
 * compute dtype (`dtype` as asked; `checkpoint` is checked once resolved, `checkInt8Dtype`), host
 * slot tables and no MoE expert adapters. Anything else is `ENGINE_BAD_OPTIONS` naming the flag —
 * never a silent fallback to f32 tables, which would read four times the bytes promised.
 */
export function checkInt8Factors(adapterDtype: string, dtype: string, hasMoe: boolean, onDevice: boolean): boolean {
  if (adapterDtype !== 'int8') return false;
  if (dtype !== 'f32' && dtype !== 'checkpoint') throw new EngineError(EngineCode.BAD_OPTIONS, `adapterDtype 'int8' (--adapter-dtype int8) needs an f32 engine, got dtype '${dtype}' (use adapterDtype 'same' for ${dtype} factors)`);
  if (onDevice) throw new EngineError(EngineCode.BAD_OPTIONS, "adapterDtype 'int8' (--adapter-dtype int8) keeps the slot tables on the host; the executor's device tables (onDevice) hold float factors only");
  if (hasMoe) throw new EngineError(EngineCode.BAD_OPTIONS, "adapterDtype 'int8' (--adapter-dtype int8) covers plain projections; a MoE model's expert tables hold float factors only");
  return true;
}

/** With int8 factors, checks the resolved compute dtype (`dtype: 'checkpoint'` read from the checkpoint) is f32. */
export function checkInt8Dtype(int8: boolean, dtype: string): void {
  if (int8 && dtype !== 'f32') throw new EngineError(EngineCode.BAD_OPTIONS, `adapterDtype 'int8' (--adapter-dtype int8) needs an f32 engine; the checkpoint's dtype resolved to '${dtype}'`);
}
