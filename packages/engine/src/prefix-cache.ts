import { createHash } from 'node:crypto';
import type { LoraAdapter } from '@stageml/peft';
import { EngineCode, EngineError } from './errors.js';
import type { SequenceKv } from './kv.js';
import type { PrefixCachingOptions } from './options.js';

/**
 * Whether an adapter changes any layer's keys or values, i.e. touches something upstream of some
 * layer's K/V projections. Layer i's K/V read the embeddings, every earlier layer whole, and its
 * own `input_layernorm`, `k_proj` and `v_proj` (not its `q_proj`, whose output meets the keys only
 * inside the attention). So `q_proj`, `o_proj`, the MLP (experts included) and
 * `post_attention_layernorm` of the last layer reach no K/V, nor do `lm_head` and the final
 * `model.norm`; everything else does. A name the rule does not recognize counts as reaching (a
 * wrong "reaches" only costs cache hits; a wrong "does not" would reuse wrong keys).
 */
export function adapterReachesKv(adapter: LoraAdapter, numLayers: number): boolean {
  const names = [
    ...adapter.modules.keys(),
    ...adapter.parameterFactors.map((f) => f.module),
    ...[...adapter.overrides.keys()].map((k) => k.replace(/\.(weight|bias)$/, '')),
    ...adapter.tokenRows.map((t) => t.module),
  ];
  return names.some((n) => moduleReachesKv(n, numLayers));
}

/** Whether module path `name` (`model.layers.3.mlp.down_proj`, `lm_head`, …) feeds some layer's keys or values. */
export function moduleReachesKv(name: string, numLayers: number): boolean {
  if (name === 'lm_head' || name === 'model.norm') return false;
  const m = /(?:^|\.)layers\.(\d+)\.(.+)$/.exec(name);
  if (m === null) return true;
  const layer = Number(m[1]);
  const rest = m[2]!;
  // Layer `layer`'s own K/V read its input norm and K/V projections.
  if (/^(self_attn\.)?(k_proj|v_proj|qkv_proj)$|^input_layernorm$/.test(rest)) return true;
  // Anything else of a layer feeds the layers after it only.
  return layer < numLayers - 1;
}

/** One sequence's (or, once released, one retained) KV as the prefix index knows it. */
interface Entry {
  /** What the KV depends on besides the tokens (model state, dtype, adapter and its version). */
  key: string;
  /** Whether a run has appended to it since it was tracked (its key is then settled). */
  extended: boolean;
  /** Whether its KV mixes two keys (a plan changed under it): its later blocks are not indexed. */
  frozen: boolean;
  readonly kv: SequenceKv;
  /** Token ids at the positions `kv` holds or will hold: the prompt, then each decoded token. */
  readonly tokens: number[];
  /** Their 0/1 attention masks. */
  readonly mask: number[];
  /** Chained hash of each full block of `tokens` registered so far (block i covers [iB, (i+1)B)). */
  readonly hashes: string[];
  /** Still a running sequence (its KV is the engine's); false: retained here, evictable. */
  live: boolean;
  lastUse: number;
  /**
   * A retained entry whose keys and values live only on the executor: its cache id there (the
   * host record `kv` keeps the length and key mask). Undefined: the host holds them (or live).
   */
  cache: number | undefined;
  /** Positions a retained entry keeps (a device-resident one is trimmed to its indexed blocks). */
  kept: number;
  /** Bytes a retained entry counts against the budget. */
  bytes: number;
}

/** Counters of a prefix cache (tokens, as vLLM counts `prefix_cache_queries` / `_hits`). */
export interface PrefixCacheStats {
  /** Prompt tokens looked up. */
  readonly queries: number;
  /** Prompt tokens whose keys and values were reused. */
  readonly hits: number;
  /** Finished sequences whose KV is retained for reuse. */
  readonly retained: number;
  /** Bytes those retained caches hold. */
  readonly retainedBytes: number;
  /** Retained caches evicted (least recently used first) to stay within the KV budget. */
  readonly evictions: number;
  /** Full blocks the index can serve. */
  readonly blocks: number;
  /** Retained caches dropped because the executor no longer held them (a restarted worker). */
  readonly invalidations: number;
}

/**
 * What a lookup found: copy `tokens` positions (a multiple of the block size) of `from` — on the
 * host, or where the keys and values live only on the executor, of its cache there: `cache` for a
 * retained device-resident entry, else the live sequence's own cache.
 */
export interface PrefixHit {
  readonly from: SequenceKv;
  readonly tokens: number;
  /** The executor's cache id of a retained device-resident entry (undefined: a host one, or live). */
  readonly cache: number | undefined;
}

/** A finished sequence whose keys and values live only on the executor, as `PrefixCache.retire` keeps it. */
export interface DeviceKv {
  /** Its cache id on the executor. */
  readonly cache: number;
  /** Bytes one position takes there (keys and values of every layer, its mask entry). */
  readonly bytesPerPosition: number;
}

/**
 * The automatic prefix cache: an index from chained hashes of fixed-size token blocks (each hash
 * covering its block's tokens and masks, the hash before it, and the key of everything else the
 * KV depends on) to the sequences whose KV holds those positions — running ones, and finished ones
 * retained after release. A new sequence whose prompt's leading blocks are indexed copies those
 * positions from the holder instead of prefilling them (`Engine.open`). Retained caches are evicted,
 * least recently used first, whenever the live sequences' KV and the retained KV together exceed
 * the budget; a live sequence's KV is never evicted (the engine owns it).
 *
 * Two kinds of retained entry: host ones (the host's `SequenceKv` holds the keys and values, which
 * a hit copies) and device-resident ones (resident KV without a host copy: the executor's cache
 * of the finished sequence is kept under its id, trimmed to its indexed blocks, and a hit forks it
 * there). Dropping a device-resident entry (eviction, an unloaded adapter, `clear`, a lost cache)
 * releases its executor cache through `onRelease`.
 *
 * NOTE: a hit is confirmed token by token against the holder's own ids, so a hash collision can
 * cost a miss but never reuse the wrong keys.
 */
export class PrefixCache {
  readonly #index = new Map<string, Entry>();
  readonly #entries = new Map<SequenceKv, Entry>();
  /** Retained entries in least-recently-used order (Map iteration order: oldest first). */
  readonly #retained = new Map<SequenceKv, Entry>();
  #retainedBytes = 0;
  #queries = 0;
  #hits = 0;
  #evictions = 0;
  #invalidations = 0;
  #clock = 0;
  #release: ((cache: number) => void) | undefined;
  #budget: number;

  constructor(
    /** Tokens per block (the unit of reuse). */
    readonly blockSize: number,
    budgetBytes: number,
  ) {
    if (!(Number.isInteger(blockSize) && blockSize >= 1)) throw new EngineError(EngineCode.BAD_OPTIONS, `prefix caching's blockSize must be an integer ≥ 1, got ${String(blockSize)}`);
    this.#budget = checkBudget(budgetBytes);
  }

  /** Bytes the live and retained KV together may hold. */
  get budgetBytes(): number {
    return this.#budget;
  }

  /** Changes the budget (the caller then calls `fit`). */
  setBudget(bytes: number): void {
    this.#budget = checkBudget(bytes);
  }

  /** Counters so far. */
  stats(): PrefixCacheStats {
    return { queries: this.#queries, hits: this.#hits, retained: this.#retained.size, retainedBytes: this.#retainedBytes, evictions: this.#evictions, blocks: this.#index.size, invalidations: this.#invalidations };
  }

  /** Sets what frees a device-resident entry's executor cache once the entry is dropped. */
  onRelease(release: (cache: number) => void): void {
    this.#release = release;
  }

  /** Bytes of the retained (finished) caches. */
  get retainedBytes(): number {
    return this.#retainedBytes;
  }

  /**
   * The longest indexed prefix of `prompt` under `key`, in whole blocks and short of the last
   * prompt token (whose logits the prefill must compute). Counts the prompt's tokens as queried
   * and the hit's as hits. `usable` (where the keys and values live on the executor) says whether
   * the executor still holds a hit's positions: a retained entry it does not is dropped (an
   * invalidation) and the lookup tries again; a live one is a miss (its sequence rebuilds itself).
   */
  lookup(key: string, prompt: readonly number[], mask: readonly number[], usable?: (hit: PrefixHit) => boolean): PrefixHit | undefined {
    this.#queries += prompt.length;
    const B = this.blockSize;
    const blocks = Math.floor((prompt.length - 1) / B);
    for (;;) {
      let parent = rootHash(key);
      let best: Entry | undefined;
      let depth = 0;
      for (let i = 0; i < blocks; i++) {
        parent = blockHash(parent, prompt, mask, i * B, B);
        const e = this.#index.get(parent);
        if (e === undefined || held(e) < (i + 1) * B) break;
        best = e;
        depth = i + 1;
      }
      if (best === undefined || !sameRange(best, prompt, mask, 0, depth * B)) return undefined;
      const hit: PrefixHit = { from: best.kv, tokens: depth * B, cache: best.cache };
      if (usable !== undefined && !usable(hit)) {
        if (best.live) return undefined;
        this.#forget(best);
        this.#invalidations++;
        continue;
      }
      this.#use(best);
      this.#hits += depth * B;
      return hit;
    }
  }

  /** Drops every retained device-resident entry whose executor cache `holds` says is gone (a restarted worker). */
  prune(holds: (cache: number, positions: number) => boolean): void {
    for (const e of [...this.#retained.values()]) {
      if (e.cache === undefined || holds(e.cache, e.kept)) continue;
      this.#forget(e);
      this.#invalidations++;
    }
  }

  /** Starts tracking a new sequence's KV under `key` (its prompt's blocks are indexed as they fill). */
  track(kv: SequenceKv, key: string, prompt: readonly number[], mask: readonly number[]): void {
    this.#entries.set(kv, { key, extended: kv.length > 0, frozen: false, kv, tokens: [...prompt], mask: [...mask], hashes: [], live: true, lastUse: ++this.#clock, cache: undefined, kept: 0, bytes: 0 });
  }

  /** Notes a token fed to a tracked sequence by a decode step (the position after its prompt). */
  fed(kv: SequenceKv, token: number): void {
    const e = this.#entries.get(kv);
    if (e === undefined) return;
    e.tokens.push(token);
    e.mask.push(1);
  }

  /**
   * Indexes the full blocks of a tracked sequence that its KV now holds, after a run computed
   * positions under `key` (the key as of that run). A key other than the sequence's own (a plan
   * applied after it opened) becomes its key when that run was its first and it reused nothing;
   * otherwise its KV mixes two keys and no later block of it is indexed.
   */
  extend(kv: SequenceKv, key: string): void {
    const e = this.#entries.get(kv);
    if (e === undefined || e.frozen) return;
    if (key !== e.key) {
      if (e.extended) {
        e.frozen = true;
        return;
      }
      e.key = key;
    }
    e.extended = true;
    this.#indexBlocks(e);
  }

  #indexBlocks(e: Entry): void {
    const kv = e.kv;
    const B = this.blockSize;
    const full = Math.floor(Math.min(kv.length, e.tokens.length) / B);
    for (let i = e.hashes.length; i < full; i++) {
      const h = blockHash(e.hashes[i - 1] ?? rootHash(e.key), e.tokens, e.mask, i * B, B);
      e.hashes.push(h);
      // The newest holder serves the block: it is the least likely to be evicted next.
      this.#index.set(h, e);
    }
  }

  /**
   * A tracked sequence ended: its KV is retained for reuse when it holds a full block (then the
   * most recently used retained cache), otherwise forgotten. Where the host holds no keys and
   * values, `device` names the executor's cache that does: the entry keeps that cache, trimmed to
   * its indexed blocks (the caller keeps those positions there instead of releasing it). Returns
   * the positions retained, or undefined where nothing is (the caller frees the cache). Call `fit` after.
   */
  retire(kv: SequenceKv, device?: DeviceKv): number | undefined {
    const e = this.#entries.get(kv);
    if (e === undefined) return undefined;
    if (e.hashes.length === 0 || (!kv.holdsKv && device === undefined)) {
      this.#forget(e);
      return undefined;
    }
    e.live = false;
    if (device === undefined) {
      kv.compact();
      e.kept = kv.length;
      e.bytes = kv.bytes;
    } else {
      e.cache = device.cache;
      e.kept = e.hashes.length * this.blockSize;
      e.bytes = e.kept * device.bytesPerPosition;
    }
    this.#use(e);
    this.#retainedBytes += e.bytes;
    return e.kept;
  }

  /** Evicts retained caches, least recently used first, until `liveBytes` and the retained KV fit the budget. */
  fit(liveBytes: number): void {
    for (const e of this.#retained.values()) {
      if (liveBytes + this.#retainedBytes <= this.#budget) return;
      this.#forget(e);
      this.#evictions++;
    }
  }

  /** Forgets every retained cache and stops indexing every live one whose key `drop` selects (an unloaded adapter). */
  drop(drop: (key: string) => boolean): void {
    for (const e of [...this.#entries.values()]) if (drop(e.key)) this.#forget(e);
  }

  /** Forgets everything (the engine was disposed). */
  clear(): void {
    for (const e of [...this.#entries.values()]) this.#forget(e);
  }

  #use(e: Entry): void {
    e.lastUse = ++this.#clock;
    if (e.live) return;
    // Re-inserted: the most recently used goes last.
    this.#retained.delete(e.kv);
    this.#retained.set(e.kv, e);
  }

  #forget(e: Entry): void {
    for (const h of e.hashes) if (this.#index.get(h) === e) this.#index.delete(h);
    this.#entries.delete(e.kv);
    if (this.#retained.delete(e.kv)) {
      this.#retainedBytes -= e.bytes;
      if (e.cache !== undefined) this.#release?.(e.cache);
    }
  }
}

/** Positions an entry can serve: a live one's filled length, a retained one's kept positions. */
function held(e: Entry): number {
  return e.live ? e.kv.length : Math.min(e.kept, e.kv.length);
}

function checkBudget(bytes: number): number {
  if (!(Number.isFinite(bytes) && bytes >= 0)) throw new EngineError(EngineCode.BAD_OPTIONS, `prefix caching's kvBudget must be a number of bytes ≥ 0, got ${String(bytes)}`);
  return bytes;
}

function rootHash(key: string): string {
  return createHash('sha256').update('stageml-prefix\0').update(key).digest('base64');
}

/** Hash of block [start, start + n) of `tokens`/`mask` chained after `parent`. */
function blockHash(parent: string, tokens: readonly number[], mask: readonly number[], start: number, n: number): string {
  const buf = new Int32Array(2 * n);
  for (let i = 0; i < n; i++) {
    buf[2 * i] = tokens[start + i]!;
    buf[2 * i + 1] = mask[start + i]!;
  }
  return createHash('sha256').update(parent).update(new Uint8Array(buf.buffer)).digest('base64');
}

/** Whether `e` holds exactly these tokens and masks at [start, start + n). */
function sameRange(e: Entry, tokens: readonly number[], mask: readonly number[], start: number, n: number): boolean {
  for (let i = start; i < start + n; i++) if (e.tokens[i] !== tokens[i] || e.mask[i] !== mask[i]) return false;
  return true;
}

/** Default bytes the live and retained KV may hold together with `prefixCaching: true`. */
export const DEFAULT_PREFIX_KV_BUDGET = 1 << 30;

/** The prefix cache `EngineOptions.prefixCaching` asks for (undefined: off); bad values are `ENGINE_BAD_OPTIONS`. */
export function prefixCacheOf(opt: boolean | PrefixCachingOptions | undefined): PrefixCache | undefined {
  if (opt === undefined || opt === false) return undefined;
  if (opt === true) return new PrefixCache(16, DEFAULT_PREFIX_KV_BUDGET);
  if (typeof opt !== 'object') throw new EngineError(EngineCode.BAD_OPTIONS, `prefixCaching must be true, false or { blockSize, kvBudget }, got ${String(opt)}`);
  return new PrefixCache(opt.blockSize ?? 16, opt.kvBudget ?? DEFAULT_PREFIX_KV_BUDGET);
}
