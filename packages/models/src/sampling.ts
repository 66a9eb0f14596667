import { seededRandom } from '@stageml/ir';
import { ModelCode, ModelError } from './errors.js';

/** One token's log-probability (natural log, of the model's raw distribution). */
export interface TokenLogprob {
  readonly id: number;
  readonly logprob: number;
}

/** What a picker reports for each token it picks, when asked to (`onPick`). */
export interface PickInfo extends TokenLogprob {
  /** The `topLogprobs` most likely tokens, most likely first (ties: lowest id). */
  readonly top: readonly TokenLogprob[];
}

/**
 * Per-request logits processing, applied before greedy or sampled picking, as vLLM applies its
 * sampling parameters: `logitBias` (added), `repetitionPenalty` (HF's: positive logits of
 * tokens seen in the prompt or output divided by it, negative ones multiplied),
 * `frequencyPenalty` (minus penalty × count in the output) and `presencePenalty` (minus penalty
 * once a token occurred in the output). Log-probabilities are of the raw logits.
 */
export interface LogitsProcessing {
  /** Added to the logit of each listed token id. */
  readonly logitBias?: Readonly<Record<number, number>>;
  /** In [-2, 2] (OpenAI's range): subtracted once per distinct output token. */
  readonly presencePenalty?: number;
  /** In [-2, 2]: subtracted per occurrence in the output. */
  readonly frequencyPenalty?: number;
  /** > 0 (1: off). */
  readonly repetitionPenalty?: number;
  /** Prompt ids, for the repetition penalty. */
  readonly promptIds?: readonly number[];
  /** Called with the picked token, its log-probability and the top ones. */
  readonly onPick?: (info: PickInfo) => void;
  /** How many top log-probabilities `onPick` receives (default 0). */
  readonly topLogprobs?: number;
}

/** How the next token is chosen. */
export type SamplingOptions = LogitsProcessing &
  (
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
      }
  );

function bad(msg: string): never {
  throw new ModelError(ModelCode.BAD_OPTIONS, msg);
}

/** Checks sampling options; bad values are `MODEL_BAD_OPTIONS`. */
export function checkSampling(s: SamplingOptions): void {
  const inRange = (v: number | undefined, lo: number, hi: number) => v === undefined || (Number.isFinite(v) && v >= lo && v <= hi);
  if (!inRange(s.presencePenalty, -2, 2)) bad(`presence penalty must be in [-2, 2], got ${String(s.presencePenalty)}`);
  if (!inRange(s.frequencyPenalty, -2, 2)) bad(`frequency penalty must be in [-2, 2], got ${String(s.frequencyPenalty)}`);
  if (s.repetitionPenalty !== undefined && !(s.repetitionPenalty > 0 && Number.isFinite(s.repetitionPenalty))) bad(`repetition penalty must be a positive number, got ${String(s.repetitionPenalty)}`);
  if (s.topLogprobs !== undefined && !(Number.isInteger(s.topLogprobs) && s.topLogprobs >= 0)) bad(`top logprobs must be a non-negative integer, got ${String(s.topLogprobs)}`);
  for (const [k, v] of Object.entries(s.logitBias ?? {})) {
    if (!/^\d+$/.test(k)) bad(`logit bias key '${k}' is not a token id`);
    if (!inRange(v, -100, 100)) bad(`logit bias of token ${k} must be in [-100, 100], got ${String(v)}`);
  }
  if (s.greedy === true) return;
  if (s.temperature !== undefined && !(s.temperature > 0 && Number.isFinite(s.temperature))) {
    bad(`temperature must be a positive number, got ${String(s.temperature)}`);
  }
  if (s.topK !== undefined && !(Number.isInteger(s.topK) && s.topK >= 0)) bad(`top-k must be a non-negative integer, got ${String(s.topK)}`);
  if (s.topP !== undefined && !(s.topP > 0 && s.topP <= 1)) bad(`top-p must be in (0, 1], got ${String(s.topP)}`);
}

/** Index of the first maximum (ties: lowest index, as torch.argmax). */
export function argmaxOf(logits: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < logits.length; i++) if (logits[i]! > logits[best]!) best = i;
  return best;
}

/** Log-softmax of `logits` in float64. */
export function logSoftmax(logits: ArrayLike<number>): Float64Array {
  let max = -Infinity;
  for (const v of Array.from(logits)) if (v > max) max = v;
  let sum = 0;
  for (const v of Array.from(logits)) sum += Math.exp(v - max);
  const lse = max + Math.log(sum);
  const out = new Float64Array(logits.length);
  for (let i = 0; i < logits.length; i++) out[i] = logits[i]! - lse;
  return out;
}

/** The `k` largest entries of `values` as {id, logprob}, largest first (ties: lowest id). */
export function topOf(values: ArrayLike<number>, k: number): TokenLogprob[] {
  const top: TokenLogprob[] = [];
  if (k <= 0) return top;
  for (let i = 0; i < values.length; i++) {
    const v = values[i]!;
    if (top.length === k && v <= top[k - 1]!.logprob) continue;
    let at = top.length;
    while (at > 0 && top[at - 1]!.logprob < v) at--;
    top.splice(at, 0, { id: i, logprob: v });
    if (top.length > k) top.pop();
  }
  return top;
}

/**
 * A token picker with its own seeded stream and history: called once per generated token with
 * that step's logits, it returns the chosen id (and reports it to `onPick` when set).
 */
export type TokenPicker = (logits: ArrayLike<number>) => number;

function hasProcessing(s: LogitsProcessing): boolean {
  return (
    Object.keys(s.logitBias ?? {}).length > 0 ||
    (s.presencePenalty ?? 0) !== 0 ||
    (s.frequencyPenalty ?? 0) !== 0 ||
    (s.repetitionPenalty ?? 1) !== 1
  );
}

/**
 * Makes a picker: logits processing (bias, penalties; see `LogitsProcessing`), then greedy argmax,
 * or sampling in HF's order — temperature, then top-k, then top-p (nucleus, always keeping the
 * most likely token), then a draw from the renormalized softmax.
 */
export function makePicker(s: SamplingOptions): TokenPicker {
  checkSampling(s);
  const choose = s.greedy === true ? argmaxOf : sampler(s);
  const process = hasProcessing(s);
  if (!process && s.onPick === undefined) return choose;
  const counts = new Map<number, number>();
  const seen = new Set<number>(s.promptIds ?? []);
  const bias = Object.entries(s.logitBias ?? {}).map(([k, v]) => [Number(k), v] as const);
  return (logits) => {
    let x: ArrayLike<number> = logits;
    if (process) {
      const y = Float64Array.from(logits);
      for (const [id, v] of bias) if (id < y.length) y[id] = y[id]! + v;
      const rep = s.repetitionPenalty ?? 1;
      if (rep !== 1) for (const id of seen) if (id < y.length) y[id] = y[id]! > 0 ? y[id]! / rep : y[id]! * rep;
      for (const [id, c] of counts) {
        if (id < y.length) y[id] = y[id]! - (s.frequencyPenalty ?? 0) * c - (s.presencePenalty ?? 0);
      }
      x = y;
    }
    const id = choose(x);
    counts.set(id, (counts.get(id) ?? 0) + 1);
    seen.add(id);
    if (s.onPick !== undefined) {
      const lp = logSoftmax(logits);
      s.onPick({ id, logprob: lp[id]!, top: topOf(lp, s.topLogprobs ?? 0) });
    }
    return id;
  };
}

function sampler(s: Exclude<SamplingOptions, { readonly greedy: true }>): TokenPicker {
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
