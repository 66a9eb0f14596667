import { quantizeFactorRows } from '@stageml/planner';
import { EngineCode, EngineError } from './errors.js';

// Int8 LoRA factors (`adapterDtype: 'int8'`): the scheme and its error bound live in
// `@stageml/planner` (`quantizeFactorRows`, `loraFactorQuantBound`), so what the slot tables
// store is exactly what the bound analyses.
export { quantizeFactorRows };

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
