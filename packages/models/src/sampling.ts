import { seededRandom } from '@stageml/ir';
import { ModelCode, ModelError } from './errors.js';

/** How the next token is chosen. */
export type SamplingOptions =
  | { readonly greedy: true }
  | {
      readonly greedy?: false;
      /** Softmax temperature (> 0; default 1). */
      readonly temperature?: number;
      /** Keep only the k most likely tokens (0 or undefined: all). */
      readonly topK?: number;
      /** Keep the smallest set of most likely tokens whose probability reaches p (1: all). */
      readonly topP?: number;
      /** Seed of the sampling stream (default 0). */
      readonly seed?: number;
    };

/** Checks sampling options; bad values are `MODEL_BAD_OPTIONS`. */
export function checkSampling(s: SamplingOptions): void {
  if (s.greedy === true) return;
  if (s.temperature !== undefined && !(s.temperature > 0 && Number.isFinite(s.temperature))) {
    throw new ModelError(ModelCode.BAD_OPTIONS, `temperature must be a positive number, got ${String(s.temperature)}`);
  }
  if (s.topK !== undefined && !(Number.isInteger(s.topK) && s.topK >= 0)) {
    throw new ModelError(ModelCode.BAD_OPTIONS, `top-k must be a non-negative integer, got ${String(s.topK)}`);
  }
  if (s.topP !== undefined && !(s.topP > 0 && s.topP <= 1)) {
    throw new ModelError(ModelCode.BAD_OPTIONS, `top-p must be in (0, 1], got ${String(s.topP)}`);
  }
}

/** Index of the first maximum (ties: lowest index, as torch.argmax). */
export function argmaxOf(logits: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < logits.length; i++) if (logits[i]! > logits[best]!) best = i;
  return best;
}

/** A token picker with its own seeded stream. */
export type TokenPicker = (logits: ArrayLike<number>) => number;

/**
 * Makes a picker: greedy argmax, or sampling in HF's order — temperature, then top-k, then top-p
 * (nucleus, always keeping the most likely token), then a draw from the renormalized softmax.
 */
export function makePicker(s: SamplingOptions): TokenPicker {
  checkSampling(s);
  if (s.greedy === true) return argmaxOf;
  const rand = seededRandom(s.seed ?? 0);
  const temperature = s.temperature ?? 1;
  return (logits) => {
    const n = logits.length;
    const order = Array.from({ length: n }, (_, i) => i).sort((a, b) => logits[b]! - logits[a]! || a - b);
    const k = s.topK === undefined || s.topK === 0 ? n : Math.min(s.topK, n);
    const max = logits[order[0]!]! / temperature;
    const probs = order.slice(0, k).map((i) => Math.exp(logits[i]! / temperature - max));
    const total = probs.reduce((a, p) => a + p, 0);
    let keep = probs.length;
    if (s.topP !== undefined && s.topP < 1) {
      let acc = 0;
      for (let i = 0; i < probs.length; i++) {
        acc += probs[i]! / total;
        if (acc >= s.topP) {
          keep = i + 1;
          break;
        }
      }
    }
    const kept = probs.slice(0, keep);
    const mass = kept.reduce((a, p) => a + p, 0);
    let u = rand() * mass;
    for (let i = 0; i < kept.length; i++) {
      u -= kept[i]!;
      if (u < 0) return order[i]!;
    }
    return order[kept.length - 1]!;
  };
}
