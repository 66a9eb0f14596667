import { type HostTensor, dtypeBytes } from '@stageml/ir';
import { type LlamaConfig, ModelCode, ModelError } from '@stageml/models';
import type { CacheRun, CacheStore, CacheStream, RowsInput } from '@stageml/runtime';
import type { EngineDType } from './dtype.js';
import { EngineCode, EngineError } from './errors.js';
import { DecodeStaging, MASKED, SequenceKv, Staging } from './kv.js';
import type { LoraAdapter } from '@stageml/peft';
import type { PlanState } from './plan-state.js';
import { type PrefixCache, type PrefixHit, adapterReachesKv } from './prefix-cache.js';
import { pastRows } from './row-kv.js';
import { Sequence } from './sequence.js';
import { ROW_GROUP_INPUT, ROW_MASK_INPUT, ROW_SLOT_INPUT, TOKEN_SLOT_INPUT } from './slot-linear.js';
import { stagePast } from './steps.js';

/** The inputs of the engine's programs whose leading axis is the batch row (`CacheRun.rowInputs`). */
const ROW_INPUTS: readonly string[] = ['input_ids', 'position_ids', 'attention_mask', ROW_SLOT_INPUT, ROW_MASK_INPUT, ROW_GROUP_INPUT, TOKEN_SLOT_INPUT];

/**
 * The engine's live sequences and where their keys and values are: each sequence's host KV record
 * (`SequenceKv`), the staging buffers several rows' cached prefixes are copied into, and — with
 * resident KV — the executor's caches (`CacheStore`), the cache rows a step appends to, and the
 * tokens each sequence appended (what a rebuild of a lost cache prefills again).
 */
export class SequenceStore {
  readonly live = new Set<Sequence>();
  readonly staging: Staging;
  readonly decodeStaging: DecodeStaging;
  /** Keys' and values' [kv heads, head dim]. */
  readonly kvShape: readonly [number, number];
  /**
   * Whether the host holds each sequence's keys and values: host-fed KV, or resident KV with
   * `hostKvCopy`. Otherwise the executor's cache is the only copy: steps omit the new keys and
   * values from their results, and a lost cache is rebuilt from the sequence's tokens (`history`).
   */
  readonly hostKv: boolean;
  /** The cache streams of every program: each layer's keys and values (appended from `new_*`), the key mask (from the run's tail). */
  readonly streams: readonly CacheStream[];
  /** The programs' new keys and values (`new_*`): the outputs a step omits where the host keeps no KV. */
  readonly kvOutputs: readonly string[];
  /** Per sequence, the tokens its decode steps appended (after its prefilled prompt): what a rebuild prefills again. */
  readonly history = new WeakMap<Sequence, number[]>();
  /** Per loaded adapter, its part of prefix cache keys: '' where it reaches no K/V (it shares the base's blocks), else its name and load version. */
  readonly #prefixKeys = new Map<string, string>();
  #adapterLoads = 0;
  /**
   * The executor's caches where prefix caching keeps KV there (resident KV without a host copy, on
   * an executor that forks caches: the torch worker); undefined where hits copy host KV.
   */
  readonly #deviceCaches: CacheStore | undefined;
  /** Each live sequence by its KV record: a hit on a live holder forks that sequence's cache. */
  readonly #holders = new WeakMap<SequenceKv, Sequence>();
  /** Bytes one position of a sequence's KV takes on the executor (keys and values at the compute dtype, the f32 mask entry). */
  readonly executorBytesPerPosition: number;
  /**
   * Whether multi-row steps feed each row's host KV in place (`RunOptions.rows`, row-kv.ts): the
   * programs read the caches per row (cpu-native). False: rows are copied into the staging buffers.
   */
  rowKv = false;

  constructor(
    readonly config: LlamaConfig,
    /** Compute dtype of the programs (and so of the cached keys and values). */
    readonly dtype: EngineDType,
    /** The executor's caches when sequences' KV lives there (`EngineOptions.residentKv`). */
    readonly caches: CacheStore | undefined,
    hostKvCopy: boolean,
    /** The automatic prefix cache (`EngineOptions.prefixCaching`), or undefined where it is off. */
    readonly prefix: PrefixCache | undefined,
    /** The applied plan (an adapter's merged modules are part of its prefix key). */
    readonly plans: PlanState,
  ) {
    this.hostKv = caches === undefined || hostKvCopy;
    const streams: CacheStream[] = [];
    for (let l = 0; l < config.numLayers; l++) {
      for (const kv of ['key', 'value']) streams.push({ input: `past_${kv}.${String(l)}`, from: `new_${kv}.${String(l)}`, pad: 0 });
    }
    streams.push({ input: 'attention_mask', from: undefined, pad: MASKED });
    this.streams = streams;
    this.kvOutputs = streams.flatMap((st) => (st.from === undefined ? [] : [st.from]));
    this.staging = new Staging(config.numLayers);
    this.decodeStaging = new DecodeStaging(config.numLayers, config.numKvHeads * config.headDim);
    this.kvShape = [config.numKvHeads, config.headDim];
    this.executorBytesPerPosition = 2 * config.numLayers * config.numKvHeads * config.headDim * dtypeBytes(dtype) + 4;
    const forks = caches !== undefined && !this.hostKv && caches.fork !== undefined && caches.keep !== undefined && caches.holds !== undefined ? caches : undefined;
    this.#deviceCaches = forks;
    prefix?.onRelease((id) => {
      forks?.release([id]);
    });
  }

  /**
   * A new live sequence of `prompt` under adapter `name` (undefined: the base), with its KV record
   * and (resident KV) its executor cache: `MODEL_BAD_OPTIONS` for an empty prompt or a bad mask,
   * `MODEL_BAD_TOKEN` for a token outside the vocabulary.
   */
  open(name: string | undefined, prompt: readonly number[], mask: readonly number[] | undefined): Sequence {
    if (prompt.length === 0) throw new ModelError(ModelCode.BAD_OPTIONS, 'the prompt is empty');
    prompt.forEach((t, i) => {
      if (!Number.isInteger(t) || t < 0 || t >= this.config.vocabSize) {
        throw new ModelError(ModelCode.BAD_TOKEN, `token id ${String(t)} at position ${String(i)} is outside the vocabulary [0, ${String(this.config.vocabSize)})`);
      }
    });
    const m = mask ?? prompt.map(() => 1);
    if (m.length !== prompt.length || m.some((v) => v !== 0 && v !== 1)) throw new ModelError(ModelCode.BAD_OPTIONS, `the mask must be ${String(prompt.length)} values of 0 or 1`);
    const seq = new Sequence(name, prompt, m, this.newKv(prompt.length));
    seq.cache = this.caches?.open();
    this.live.add(seq);
    this.#holders.set(seq.kv, seq);
    return seq;
  }

  /** Ends a sequence: frees its KV memory and its hold on the adapter's slot. Idempotent. */
  release(seq: Sequence): void {
    if (seq.released) return;
    seq.released = true;
    this.live.delete(seq);
    this.decodeStaging.forget(seq.kv);
    seq.lease?.release();
    seq.lease = undefined;
    // With KV only on the executor, the prefix cache keeps the sequence's cache there (trimmed
    // to its indexed blocks) instead of this releasing it — unless the executor lost it.
    const dc = this.#deviceCaches;
    const device = dc !== undefined && seq.cache !== undefined && dc.holds!(seq.cache, seq.kv.length) ? { cache: seq.cache, bytesPerPosition: this.executorBytesPerPosition } : undefined;
    const kept = this.prefix?.retire(seq.kv, device);
    if (device !== undefined && kept !== undefined) dc!.keep!(device.cache, kept);
    else if (seq.cache !== undefined) this.caches?.release([seq.cache]);
    this.fitPrefix();
  }

  /**
   * Whether prefix caching serves hits: asked for, the keys and values can be copied (the host
   * holds them, or the executor that holds the only copy forks its caches: the torch worker), and
   * not a longrope model (whose long prompts are one run).
   */
  get prefixActive(): boolean {
    return this.prefix !== undefined && (this.hostKv || this.#deviceCaches !== undefined) && this.config.rope.type !== 'longrope';
  }

  /** Whether the prefix cache's retained KV lives on the executor (`prefixActive` without a host copy). */
  get prefixOnDevice(): boolean {
    return this.prefixActive && this.#deviceCaches !== undefined;
  }

  /** A loaded (or reloaded) adapter: a new version of its prefix key; blocks of an earlier version are dropped. */
  adapterLoaded(adapter: LoraAdapter): void {
    this.adapterUnloaded(adapter.name);
    this.#prefixKeys.set(adapter.name, adapterReachesKv(adapter, this.config.numLayers) ? `${adapter.name}#${String(++this.#adapterLoads)}` : '');
  }

  /** An unloaded adapter: its blocks are dropped (never reused, even by a reload of the same files). */
  adapterUnloaded(name: string): void {
    const key = this.#prefixKeys.get(name);
    this.#prefixKeys.delete(name);
    if (key !== undefined && key !== '') this.prefix?.drop((k) => k.startsWith(`${this.dtype}|${key}|`));
  }

  /**
   * The prefix cache's key of a sequence on `adapter`: the compute dtype, and for an adapter that
   * reaches some layer's K/V its name, load version and the modules the plan merged for it (a
   * merged copy computes the same keys in another order). The base weights never change under a
   * plan here (merges are copies in lanes), so base rows and adapters that reach no K/V share one
   * key. Undefined for an adapter whose key is not settled yet (being loaded): nothing is cached.
   */
  prefixKey(adapter: string | undefined): string | undefined {
    const part = adapter === undefined ? '' : this.#prefixKeys.get(adapter);
    if (part === undefined) return undefined;
    const merged = part === '' ? '' : [...(this.plans.merged(adapter!) ?? [])].sort().join(',');
    return `${this.dtype}|${part}|${merged}`;
  }

  /** Prefix caching: starts `seq` from the longest cached prefix of its prompt and indexes its own blocks from now on. */
  reusePrefix(seq: Sequence): void {
    const p = this.prefix;
    const key = this.prefixKey(seq.adapter);
    if (p === undefined || !this.prefixActive || key === undefined) return;
    const dc = this.#deviceCaches;
    // A restarted worker lost every cache: its retained entries go before anything looks them up.
    if (dc !== undefined) p.prune((id, n) => dc.holds!(id, n));
    const source = (h: PrefixHit): number | undefined => h.cache ?? this.#holders.get(h.from)?.cache;
    const hit = p.lookup(key, seq.prompt, seq.promptMask, dc === undefined ? undefined : (h) => {
      const id = source(h);
      return id !== undefined && dc.holds!(id, h.tokens);
    });
    if (hit !== undefined) {
      seq.kv.copyPrefix(hit.from, hit.tokens);
      if (dc !== undefined) {
        // Forked on the executor; the fresh cache the sequence opened with was never used.
        const fresh = seq.cache!;
        seq.cache = dc.fork!(source(hit)!, hit.tokens);
        dc.release([fresh]);
      }
      seq.prefilled = hit.tokens;
      seq.cachedTokens = hit.tokens;
      let attended = 0;
      for (let i = 0; i < hit.tokens; i++) attended += seq.promptMask[i]!;
      seq.nextPosition = attended;
    }
    p.track(seq.kv, key, seq.prompt, seq.promptMask);
    this.fitPrefix();
  }

  /** After a run appended positions to `s` (`token`: the one a decode row was fed): indexes its newly full blocks. */
  appended(s: Sequence, token?: number): void {
    const p = this.prefix;
    if (p === undefined) return;
    if (token !== undefined) p.fed(s.kv, token);
    // An adapter unloaded under a running sequence has no key: its KV is no longer indexed.
    p.extend(s.kv, this.prefixKey(s.adapter) ?? '\0unloaded');
    // Live KV grew: retained caches give way as it does, so the two stay within the budget.
    if (p.retainedBytes > 0) this.fitPrefix();
  }

  /** Evicts retained prefix caches until they and the live sequences' KV fit the budget. */
  fitPrefix(): void {
    if (this.prefix === undefined) return;
    let live = 0;
    // Where retained KV is on the executor, the live sequences' is counted there too.
    const device = this.#deviceCaches !== undefined;
    for (const s of this.live) live += device ? s.kv.length * this.executorBytesPerPosition : s.kv.bytes;
    this.prefix.fit(live);
  }

  /**
   * A sequence's KV record for a prompt of `positions` positions: room for the prompt and 16 more
   * (allocated at its first write; `Sequence.reserve` refines it), so a long prompt's prefill does
   * not double its buffers chunk after chunk, each growth leaving garbage behind.
   */
  newKv(positions: number): SequenceKv {
    return new SequenceKv(this.config.numLayers, this.kvShape[0] * this.kvShape[1], positions + 16, this.dtype, this.hostKv);
  }

  /** `ENGINE_BAD_SEQUENCE`: `seq` was released. */
  bad(seq: Sequence): never {
    throw new EngineError(EngineCode.BAD_SEQUENCE, `the sequence (adapter ${seq.adapter ?? 'base'}) was released`);
  }

  /** The slot of a live, attached sequence (`ENGINE_BAD_SEQUENCE` otherwise). */
  check(seq: Sequence): number {
    if (seq.released || !this.live.has(seq)) this.bad(seq);
    if (seq.slot === undefined) throw new EngineError(EngineCode.BAD_SEQUENCE, 'the sequence is not attached to a slot yet (call attach)');
    return seq.slot;
  }

  /** The tokens `s`'s decode steps appended so far (kept where the executor's cache is the only KV copy). */
  historyOf(s: Sequence): number[] {
    let h = this.history.get(s);
    if (h === undefined) this.history.set(s, (h = []));
    return h;
  }

  /**
   * The cached prefixes (`past` positions) of `seqs` as the run's `past_*` inputs: with `rowKv`,
   * several rows as per-row views (returned, for `RunOptions.rows`); else staged into `inputs`.
   */
  stagePast(inputs: Record<string, HostTensor>, seqs: readonly Sequence[], past: number): Record<string, RowsInput> | undefined {
    if (this.rowKv && seqs.length > 1) return pastRows(seqs, past, this.kvShape);
    stagePast(inputs, seqs, past, this.kvShape, this.staging);
    return undefined;
  }

  /**
   * The cache rows of a step over `seqs` (resident KV), row r appending `append[r]` [from, count);
   * with a host copy each row can restore a lost cache from it.
   */
  cacheRun(seqs: readonly Sequence[], append: readonly (readonly [number, number])[]): CacheRun {
    const shape = this.kvShape;
    const restore = (s: Sequence) => (): Record<string, HostTensor> => {
      const content: Record<string, HostTensor> = { attention_mask: { dtype: 'f32', shape: [s.kv.length], data: s.kv.maskView() } };
      for (let l = 0; l < this.config.numLayers; l++) {
        const view = s.kv.view(l, shape);
        content[`past_key.${String(l)}`] = { dtype: view.k.dtype, shape: view.k.shape.slice(1), data: view.k.data };
        content[`past_value.${String(l)}`] = { dtype: view.v.dtype, shape: view.v.shape.slice(1), data: view.v.data };
      }
      return content;
    };
    return {
      streams: this.streams,
      rows: seqs.map((s, r) => ({ id: s.cache!, length: s.kv.length, append: append[r]!, ...(s.reserve === undefined ? {} : { reserve: s.reserve }), ...(this.hostKv ? { restore: restore(s) } : {}) })),
      rowInputs: ROW_INPUTS,
    };
  }

  /** A run's new keys and values per layer (none where the host keeps no KV: the run omitted them). */
  outputs(out: Record<string, HostTensor>): { k: Float32Array[]; v: Float32Array[] } {
    const k: Float32Array[] = [];
    const v: Float32Array[] = [];
    for (let l = 0; this.hostKv && l < this.config.numLayers; l++) {
      k.push(out[`new_key.${String(l)}`]!.data as Float32Array);
      v.push(out[`new_value.${String(l)}`]!.data as Float32Array);
    }
    return { k, v };
  }

  /** Bytes of the live sequences' KV: on the host, on the executor, and of the staging buffers. */
  memory(): { readonly kv: number; readonly executorKv: number; readonly staging: number; readonly prefixKv: number } {
    let kv = 0;
    let executorKv = 0;
    for (const s of this.live) {
      kv += s.kv.bytes;
      if (s.cache !== undefined) executorKv += s.kv.length * this.executorBytesPerPosition;
    }
    return { kv, executorKv, staging: this.staging.bytes + this.decodeStaging.bytes, prefixKv: this.prefix?.retainedBytes ?? 0 };
  }
}
