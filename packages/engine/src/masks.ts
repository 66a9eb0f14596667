import { MASKED } from './kv.js';

/**
 * Sliding-window attention for one decode query: `mask` is a row's additive key mask whose first
 * `cached` entries are its cached positions and whose last entry is the new (attended) token; keys
 * more than `window - 1` attended tokens before it are masked in place (HF's `sliding_window`;
 * padding is not counted).
 */
export function windowKeys(mask: Float32Array, cached: number, window: number): void {
  let attended = 0;
  for (let j = 0; j < cached; j++) if (mask[j] === 0) attended++;
  // The new token's attended index is `attended`; key j (attended index a_j) stays when attended - a_j < window.
  let a = 0;
  for (let j = 0; j < cached; j++) {
    if (mask[j] !== 0) continue;
    if (attended - a >= window) mask[j] = MASKED;
    a++;
  }
}

/**
 * Sliding-window attention for a prefill chunk: from the key mask f32[past + count] (cached
 * positions, then the chunk's own), the per-query mask f32[count, past + count] in which query i
 * (position past + i) keeps attended keys within `window - 1` attended tokens before it (a padding
 * query counts from the last attended token before it). Causality is the attention op's own.
 */
export function windowedQueries(keyMask: Float32Array, past: number, count: number, window: number): Float32Array {
  const keys = past + count;
  const index = new Int32Array(keys);
  let n = 0;
  for (let j = 0; j < keys; j++) index[j] = keyMask[j] === 0 ? n++ : -1;
  const out = new Float32Array(count * keys).fill(MASKED);
  for (let i = 0; i < count; i++) {
    const q = past + i;
    let qi = index[q]!;
    for (let j = q - 1; qi < 0 && j >= 0; j--) if (index[j]! >= 0) qi = index[j]!;
    if (qi < 0) qi = 0;
    for (let j = 0; j <= q; j++) if (index[j]! >= 0 && qi - index[j]! < window) out[i * keys + j] = 0;
  }
  return out;
}
