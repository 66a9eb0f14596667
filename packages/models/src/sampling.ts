import { seededRandom } from '@stageml/ir';
import { type RowProcessing, firstMaxIndex } from '@stageml/runtime';
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
  /**
   * A per-request constraint on the next token (structured outputs): before each pick, logits of
   * ids outside its `mask()` become -Infinity (after the processing above); the picked id is
   * then passed to its `accept`. A constrained picker picks on the host (it has no `pickPlan`).
   */
  readonly constraint?: TokenConstraint;
}

/**
 * What a picker needs of a decoding constraint (`GrammarMatcher` of `@stageml/structured` is one):
 * the allowed next ids as a bitmask (bit `id % 32` of word `id >> 5`), and the picked id.
 */
export interface TokenConstraint {
  /** Allowed next ids; ids past the mask's words are not allowed. */
  mask(): Uint32Array;
  /** Takes the picked id into the constraint's state. */
  accept(id: number): void;
  /** Whether the constrained text is complete and nothing may follow (the request ends: `stop`). */
  readonly finished: boolean;
}

/**
 * `logits` with every id outside `mask` at -Infinity, in float64 (a copy). A mask that allows no
 * id of the logits is `MODEL_BAD_OPTIONS` (the constraint cannot continue with this vocabulary).
 */
export function maskLogits(logits: ArrayLike<number>, mask: Uint32Array): Float64Array {
  const y = Float64Array.from(logits);
  let allowed = 0;
  for (let id = 0; id < y.length; id++) {
    if ((((mask[id >>> 5] ?? 0) >>> (id & 31)) & 1) === 0) y[id] = -Infinity;
    else allowed++;
  }
  if (allowed === 0) bad('the decoding constraint allows no token of the vocabulary here');
  return y;
}

/**
 * The greedy pick under a constraint without the masked copy `maskLogits` makes: the first id of
 * the greatest logit among the ids `mask` allows (what `argmaxOf(maskLogits(logits, mask))` picks),
 * visiting only the allowed ids. A mask that allows no id of the logits is `MODEL_BAD_OPTIONS`.
 */
export function maskedArgmax(logits: ArrayLike<number>, mask: Uint32Array): number {
  const n = logits.length;
  const words = Math.min(mask.length, (n + 31) >>> 5);
  let best = -1;
  let bv = -Infinity;
  for (let w = 0; w < words; w++) {
    let bits = mask[w]! | 0;
    while (bits !== 0) {
      const low = bits & -bits;
      bits ^= low;
      const id = (w << 5) + 31 - Math.clz32(low);
      if (id >= n) break;
      const v = logits[id]!;
      if (best < 0 || v > bv) {
        best = id;
        bv = v;
      }
    }
  }
  if (best < 0) bad('the decoding constraint allows no token of the vocabulary here');
  return best;
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
        /**
         * Min-p (vLLM's `min_p`): keep only tokens whose probability, after temperature, is at least
         * this share of the most likely token's (0 or undefined: all). Picks with it are made on the
         * host (the picker has no `pickPlan`).
         */
        readonly minP?: number;
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
  if (s.minP !== undefined && !(s.minP >= 0 && s.minP <= 1)) bad(`min-p must be in [0, 1], got ${String(s.minP)}`);
}

/** Index of the first maximum (ties: lowest index, as torch.argmax). */
export function argmaxOf(logits: ArrayLike<number>): number {
  return firstMaxIndex(logits);
}

/** Log-softmax of `logits` in float64. */
export function logSoftmax(logits: ArrayLike<number>): Float64Array {
  const n = logits.length;
  let max = -Infinity;
  for (let i = 0; i < n; i++) if (logits[i]! > max) max = logits[i]!;
  let sum = 0;
  for (let i = 0; i < n; i++) sum += Math.exp(logits[i]! - max);
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
 * Whether a picker (of `makePicker`) is plain greedy: the argmax of the raw logits, with no
 * processing and no `onPick`; such a pick can be made where the logits are (`Engine.decodeGreedy`).
 */
export function isPlainGreedy(picker: TokenPicker): boolean {
  return picker === argmaxOf;
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
  const constraint = s.constraint;
  if (!process && s.onPick === undefined && constraint === undefined) return choose;
  const counts = new Map<number, number>();
  const seen = new Set<number>(s.promptIds ?? []);
  const bias = Object.entries(s.logitBias ?? {}).map(([k, v]) => [Number(k), v] as const);
  const rep = s.repetitionPenalty ?? 1;
  const frequency = s.frequencyPenalty ?? 0;
  const presence = s.presencePenalty ?? 0;
  const accept = (id: number): void => {
    counts.set(id, (counts.get(id) ?? 0) + 1);
    seen.add(id);
  };
  const picker: TokenPicker = (logits) => {
    const processed = process ? processLogits(logits, { logitBias: bias, repetitionPenalty: rep, seen, frequencyPenalty: frequency, presencePenalty: presence, counts }) : logits;
    // Greedy under a constraint: the allowed ids' argmax, no masked copy of the vocabulary.
    const id = constraint === undefined ? choose(processed) : s.greedy === true ? maskedArgmax(processed, constraint.mask()) : choose(maskLogits(processed, constraint.mask()));
    accept(id);
    constraint?.accept(id);
    if (s.onPick !== undefined) {
      const lp = logSoftmax(logits);
      s.onPick({ id, logprob: lp[id]!, top: topOf(lp, s.topLogprobs ?? 0) });
    }
    return id;
  };
  const inner = pickPlan(choose);
  if (s.onPick === undefined && constraint === undefined && inner !== undefined) {
    // Processing without log-probabilities: the pick can be made elsewhere from the step's state.
    const processing = (): RowProcessing => ({
      ...(bias.length === 0 ? {} : { logitBias: bias }),
      ...(rep === 1 ? {} : { repetitionPenalty: rep, seen: [...seen] }),
      ...(frequency === 0 && presence === 0 ? {} : { frequencyPenalty: frequency, presencePenalty: presence, counts: [...counts] }),
    });
    PLANS.set(picker, { ...inner, processing, accept });
  }
  return picker;
}

/** What `processLogits` reads: `RowProcessing` with any iterable of seen ids and counts. */
export interface LogitsState {
  readonly logitBias?: Iterable<readonly [number, number]>;
  readonly repetitionPenalty?: number;
  readonly seen?: Iterable<number>;
  readonly frequencyPenalty?: number;
  readonly presencePenalty?: number;
  readonly counts?: Iterable<readonly [number, number]>;
}

/**
 * `logits` after a picker's processing, in float64 (the order `RowProcessing` documents): the
 * arithmetic the torch worker's `sample_rows` repeats for a row sent with its processing.
 */
export function processLogits(logits: ArrayLike<number>, p: LogitsState): Float64Array {
  const y = Float64Array.from(logits);
  for (const [id, v] of p.logitBias ?? []) if (id < y.length) y[id] = y[id]! + v;
  const rep = p.repetitionPenalty ?? 1;
  if (rep !== 1) for (const id of p.seen ?? []) if (id < y.length) y[id] = y[id]! > 0 ? y[id]! / rep : y[id]! * rep;
  const frequency = p.frequencyPenalty ?? 0;
  const presence = p.presencePenalty ?? 0;
  for (const [id, c] of p.counts ?? []) if (id < y.length) y[id] = y[id]! - frequency * c - presence;
  return y;
}

const f32 = new Float32Array(1);
const f32Bits = new Uint32Array(f32.buffer);
const RADIX = 2048;

/** An order-preserving u32 of a value's f32 rounding, smaller for larger values (-0 as 0). */
function descKey(v: number): number {
  f32[0] = v === 0 ? 0 : v;
  const b = f32Bits[0]!;
  return b & 0x80000000 ? b : ~b >>> 0 & 0x7fffffff;
}

/** The exact order (value descending, then index) of a few indices. */
function exactOrder(values: ArrayLike<number>, idx: ArrayLike<number>): number[] {
  return Array.from(idx).sort((a, b) => values[b]! - values[a]! || a - b);
}

/**
 * The indices of `values` by value, largest first, ties by lowest index: the order of
 * `sort((a, b) => values[b] - values[a] || a - b)`, without a comparator. Each value's f32
 * rounding (monotonic, -0 as 0) becomes an order-preserving u32 key; a stable LSD radix sort (three
 * 11-bit digits) from index order keeps ties by index; runs of one key are then ordered exactly
 * where `values` holds more than f32 precision (logits after penalties, in float64). A
 * 128,256-token vocabulary orders in ~7 ms on the CI machine, where the comparator sort took ~70
 * (whole steps: bench/results/sampling.md).
 */
export function descendingOrder(values: ArrayLike<number>): Int32Array {
  const n = values.length;
  let keys = new Uint32Array(n);
  let order = new Int32Array(n);
  for (let i = 0; i < n; i++) {
    keys[i] = descKey(values[i]!);
    order[i] = i;
  }
  let keys2 = new Uint32Array(n);
  let order2 = new Int32Array(n);
  const count = new Int32Array(RADIX);
  for (let shift = 0; shift < 32; shift += 11) {
    count.fill(0);
    for (let i = 0; i < n; i++) count[(keys[i]! >>> shift) & (RADIX - 1)]!++;
    let sum = 0;
    for (let d = 0; d < RADIX; d++) {
      const c = count[d]!;
      count[d] = sum;
      sum += c;
    }
    for (let i = 0; i < n; i++) {
      const k = keys[i]!;
      const at = count[(k >>> shift) & (RADIX - 1)]!++;
      keys2[at] = k;
      order2[at] = order[i]!;
    }
    [keys, keys2] = [keys2, keys];
    [order, order2] = [order2, order];
  }
  if (!(values instanceof Float32Array)) {
    for (let lo = 0; lo < n; ) {
      let hi = lo + 1;
      while (hi < n && keys[hi] === keys[lo]) hi++;
      if (hi - lo > 1) order.set(exactOrder(values, order.subarray(lo, hi)), lo);
      lo = hi;
    }
  }
  return order;
}

/**
 * The first `k` of `descendingOrder(values)`. Where k is small against the vocabulary, without
 * ordering the rest: one pass keeps the k smallest keys in a heap (its root, the k-th key, is the
 * threshold), a second collects every index whose key reaches it (ties at the threshold
 * included), and those few are ordered exactly.
 */
export function topOrder(values: ArrayLike<number>, k: number): Int32Array {
  const n = values.length;
  if (k <= 0) return new Int32Array(0);
  if (k * 16 >= n) return descendingOrder(values).subarray(0, k);
  // A max-heap of the k smallest keys seen so far.
  const heap = new Uint32Array(k);
  let size = 0;
  for (let i = 0; i < n; i++) {
    const key = descKey(values[i]!);
    if (size < k) {
      let c = size++;
      while (c > 0) {
        const p = (c - 1) >> 1;
        if (heap[p]! >= key) break;
        heap[c] = heap[p]!;
        c = p;
      }
      heap[c] = key;
    } else if (key < heap[0]!) {
      let c = 0;
      for (;;) {
        const l = 2 * c + 1;
        if (l >= k) break;
        const r = l + 1;
        const m = r < k && heap[r]! > heap[l]! ? r : l;
        if (heap[m]! <= key) break;
        heap[c] = heap[m]!;
        c = m;
      }
      heap[c] = key;
    }
  }
  const threshold = heap[0]!;
  const picked: number[] = [];
  for (let i = 0; i < n; i++) if (descKey(values[i]!) <= threshold) picked.push(i);
  return Int32Array.from(exactOrder(values, picked).slice(0, k));
}

/**
 * How many of `probs` (largest first, summing to `total`) top-p keeps: the fewest whose share
 * reaches p, at least one (all for p undefined or ≥ 1). Shares are summed one by one in order.
 */
export function nucleusSize(probs: ArrayLike<number>, total: number, topP: number | undefined): number {
  if (topP === undefined || topP >= 1) return probs.length;
  let acc = 0;
  for (let i = 0; i < probs.length; i++) {
    acc += probs[i]! / total;
    if (acc >= topP) return i + 1;
  }
  return probs.length;
}

/**
 * One sampled pick from `logits` with the draw `u` in [0, 1): the token order by logit (largest
 * first, ties the lowest id), then temperature, min-p (0: all; tokens below `minP` times the most
 * likely one's probability are dropped, as vLLM's `min_p`), top-k (0: all), top-p over what is left
 * (1: all; always at least the most likely token), and the first token whose cumulative probability
 * exceeds u of the kept mass.
 * Every sum runs one term at a time in that order, in float64 — the arithmetic the torch worker's
 * `sample_rows` repeats term for term, so an executor that picks where the logits are (`pickPlan`,
 * `Engine.decodeSample`) picks what this does.
 */
export function samplePick(logits: ArrayLike<number>, temperature: number, topK: number, topP: number, u: number, minP = 0): number {
  const n = logits.length;
  const top = topK === 0 ? n : Math.min(topK, n);
  const order = top < n ? topOrder(logits, top) : descendingOrder(logits);
  const max = logits[order[0]!]! / temperature;
  let probs = new Float64Array(top);
  for (let i = 0; i < top; i++) probs[i] = Math.exp(logits[order[i]!]! / temperature - max);
  // NOTE: probs are relative to the most likely token's (probs[0] = 1) and descending, so min-p
  // keeps a prefix: the tokens whose relative probability is at least minP.
  let k = top;
  if (minP > 0) {
    k = 1;
    while (k < top && probs[k]! >= minP) k++;
    probs = probs.subarray(0, k);
  }
  let total = 0;
  for (let i = 0; i < k; i++) total += probs[i]!;
  const keep = nucleusSize(probs, total, topP);
  let mass = 0;
  for (let i = 0; i < keep; i++) mass += probs[i]!;
  let left = u * mass;
  for (let i = 0; i < keep; i++) {
    left -= probs[i]!;
    if (left < 0) return order[i]!;
  }
  return order[keep - 1]!;
}

/**
 * What a plain picker does, so that the pick can be made where the logits are: the argmax of the
 * raw logits (`greedy`), or a draw from the softmax with temperature, top-k and top-p (`sample`),
 * each pick taking one number of the picker's own seeded stream (`draw`). A caller that picks
 * elsewhere calls `draw` once per pick instead of calling the picker, so the stream stays the one
 * the picker would have used: host and executor picks may alternate from step to step.
 */
export type PickPlan = (
  | { readonly kind: 'greedy' }
  | {
      readonly kind: 'sample';
      readonly temperature: number;
      /** 0: every token. */
      readonly topK: number;
      /** 1: every token. */
      readonly topP: number;
      /** The picker's next number in [0, 1) (advances its stream). */
      readonly draw: () => number;
    }
) & {
  /**
   * A picker with logits processing (bias, penalties): the processing of its next pick, from its
   * state now (`processLogits` applies it); the caller picks from the processed logits.
   */
  readonly processing?: () => RowProcessing;
  /** With `processing`: takes a token picked elsewhere into the picker's state (counts, seen). */
  readonly accept?: (id: number) => void;
};

const GREEDY_PLAN: PickPlan = { kind: 'greedy' };
const PLANS = new WeakMap<TokenPicker, PickPlan>();

/**
 * The plan of a picker of `makePicker` without `onPick` (whose log-probabilities need the raw
 * logits on the host), or undefined: such a picker must see the logits. A picker with logits
 * processing carries it (`processing`, `accept`).
 */
export function pickPlan(picker: TokenPicker): PickPlan | undefined {
  return picker === argmaxOf ? GREEDY_PLAN : PLANS.get(picker);
}

function sampler(s: Exclude<SamplingOptions, { readonly greedy: true }>): TokenPicker {
  const rand = seededRandom(s.seed ?? 0);
  const temperature = s.temperature ?? 1;
  const topK = s.topK ?? 0;
  const topP = s.topP ?? 1;
  const minP = s.minP ?? 0;
  const pick: TokenPicker = (logits) => samplePick(logits, temperature, topK, topP, rand(), minP);
  // NOTE: executors pick without min-p (the torch worker's sample_rows, Engine.decodeSample), so a
  // min-p picker has no plan and picks on the host.
  if (minP === 0) PLANS.set(pick, { kind: 'sample', temperature, topK, topP, draw: rand });
  return pick;
}
