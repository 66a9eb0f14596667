import { join } from 'node:path';
import { type LoraAdapter, loadLoraAdapter } from './adapter.js';
import { PeftCode, PeftError } from './errors.js';

/** What a cache loader resolves to: the resident value and the bytes it occupies on the executor. */
export interface CacheLoad<T> {
  /** The executor-resident value (device tensors, a prepared graph, a host adapter, …). */
  readonly value: T;
  /** Bytes the value occupies; counted against the cache's budget. A whole number ≥ 0. */
  readonly bytes: number;
}

/**
 * Loads one adapter by name. `signal` aborts once every caller waiting for this load has given up;
 * a loader may stop early then (what it resolves to is discarded either way).
 */
export type CacheLoader<T> = (name: string, signal: AbortSignal) => Promise<CacheLoad<T>>;

/** Options of `AdapterCache`. */
export interface AdapterCacheOptions<T> {
  /** Most bytes resident at once (a number ≥ 0; `Infinity` for no limit). */
  readonly budgetBytes: number;
  /** Loads a cold adapter. Called at most once per cold adapter at a time (single flight). */
  readonly load: CacheLoader<T>;
  /**
   * Frees a value the cache lets go of: an evicted entry, or a loaded value that was refused
   * (`PEFT_CACHE_FULL`) or abandoned. Called after the cache's state is updated; an exception from
   * it is counted in `stats().disposeErrors` and never changes the cache.
   */
  readonly dispose?: (name: string, value: T) => void;
}

/** Options of `AdapterCache.acquire`. */
export interface AcquireOptions {
  /**
   * Gives up waiting for a cold adapter: the acquire rejects with `signal.reason`. The load itself
   * is aborted only when no one else waits for it. A hit ignores the signal.
   */
  readonly signal?: AbortSignal;
}

/** A hold on a resident adapter: while unreleased, the adapter is never evicted. */
export interface CacheLease<T> {
  /** The adapter's name. */
  readonly name: string;
  /** The resident value. */
  readonly value: T;
  /** Whether `release` has been called. */
  readonly released: boolean;
  /** Ends the hold (marks the adapter most recently used). Releasing twice is a no-op. */
  release(): void;
}

/** One resident entry, as `AdapterCache.entries` reports it. */
export interface CacheEntryInfo {
  /** Adapter name. */
  readonly name: string;
  /** Bytes counted against the budget. */
  readonly bytes: number;
  /** Whether the entry is pinned (never evicted). */
  readonly pinned: boolean;
  /** Unreleased leases on the entry (never evicted while > 0). */
  readonly leases: number;
}

/** Counters and current occupancy of an `AdapterCache`. */
export interface AdapterCacheStats {
  /** Acquires served by a resident entry. */
  readonly hits: number;
  /** Acquires that found no resident entry (they started or joined a load). */
  readonly misses: number;
  /** Entries removed, by LRU pressure or by `evict`. */
  readonly evictions: number;
  /** Loader calls made. */
  readonly loads: number;
  /** Loads that ended without admitting an entry (threw, did not fit, reported bad bytes, abandoned). */
  readonly failedLoads: number;
  /** Loads still running. Invariant: `entries = loads − failedLoads − loading − evictions`. */
  readonly loading: number;
  /** Bytes resident now (≤ the budget, always). */
  readonly bytes: number;
  /** Entries resident now. */
  readonly entries: number;
  /** Total wall time of settled loads, in milliseconds. */
  readonly loadMsTotal: number;
  /** Exceptions thrown by the `dispose` callback. */
  readonly disposeErrors: number;
}

interface Entry<T> {
  readonly name: string;
  readonly value: T;
  readonly bytes: number;
  pinned: boolean;
  leases: number;
}

interface Waiter<T> {
  readonly resolve: (lease: CacheLease<T>) => void;
  readonly reject: (error: unknown) => void;
  detach: () => void;
}

interface Flight<T> {
  readonly controller: AbortController;
  readonly waiters: Set<Waiter<T>>;
  readonly started: number;
}

/** Why a settled load admits nothing: the error its waiters get, and a loaded value to dispose. */
interface Refusal<T> {
  readonly error: unknown;
  readonly value?: T;
}

/**
 * Executor-resident adapters under a byte budget, as multi-adapter servers keep them (S-LoRA's
 * and LoRAX's GPU adapter sets, SGLang's LoRA pool with `lru` eviction and pinned adapters).
 *
 * Invariants:
 * - resident bytes never exceed `budgetBytes`;
 * - an entry with an unreleased lease, or a pinned one, is never evicted;
 * - eviction is least-recently-used among the other entries, and only as many as a new entry needs;
 * - concurrent acquires of one cold adapter share one load (single flight);
 * - admission is decided before anything is evicted: a load that throws, reports invalid bytes, or
 *   cannot fit even after evicting everything evictable (`PEFT_CACHE_FULL`) leaves the entries,
 *   their order and the resident bytes exactly as they were; every waiter of that load receives the
 *   same error, and a later acquire loads again.
 *
 * Only promises are used (no timers); all state changes happen synchronously inside one callback,
 * so no interleaving of callers can observe a half-made change.
 */
export class AdapterCache<T> {
  /** Most bytes resident at once. */
  readonly budgetBytes: number;
  readonly #load: CacheLoader<T>;
  readonly #dispose: ((name: string, value: T) => void) | undefined;
  // NOTE: Map iteration order is insertion order; touching an entry re-inserts it, so the first
  // entry is always the least recently used.
  readonly #entries = new Map<string, Entry<T>>();
  readonly #flights = new Map<string, Flight<T>>();
  #bytes = 0;
  #hits = 0;
  #misses = 0;
  #evictions = 0;
  #loads = 0;
  #failedLoads = 0;
  #loading = 0;
  #loadMsTotal = 0;
  #disposeErrors = 0;

  /** Creates an empty cache. A budget that is not a number ≥ 0 is `PEFT_BAD_ARGUMENT`. */
  constructor(opts: AdapterCacheOptions<T>) {
    if (typeof opts.budgetBytes !== 'number' || Number.isNaN(opts.budgetBytes) || opts.budgetBytes < 0) {
      throw new PeftError(PeftCode.BAD_ARGUMENT, `budgetBytes must be a number ≥ 0, got ${String(opts.budgetBytes)}`);
    }
    this.budgetBytes = opts.budgetBytes;
    this.#load = opts.load;
    this.#dispose = opts.dispose;
  }

  /**
   * Resolves to a lease on `name`, loading it if it is not resident (joining a load already in
   * flight). Rejects with the loader's error, or `PEFT_CACHE_FULL` when the adapter cannot fit
   * beside the pinned and in-use entries, or the signal's reason when the caller gives up.
   */
  acquire(name: string, opts: AcquireOptions = {}): Promise<CacheLease<T>> {
    const { signal } = opts;
    const entry = this.#entries.get(name);
    if (entry !== undefined) {
      this.#hits++;
      entry.leases++;
      this.#touch(entry);
      return Promise.resolve(this.#lease(entry));
    }
    if (signal?.aborted === true) return Promise.reject(signal.reason as Error);
    this.#misses++;
    const flight = this.#flights.get(name) ?? this.#start(name);
    return new Promise<CacheLease<T>>((resolve, reject) => {
      const waiter: Waiter<T> = { resolve, reject, detach: () => undefined };
      flight.waiters.add(waiter);
      if (signal === undefined) return;
      const onAbort = (): void => {
        if (!flight.waiters.delete(waiter)) return;
        reject(signal.reason as Error);
        // NOTE: the last waiter gone abandons the flight at once, so a later acquire starts a fresh
        // load instead of joining one whose result will be discarded.
        if (flight.waiters.size === 0 && this.#flights.get(name) === flight) {
          this.#flights.delete(name);
          flight.controller.abort(signal.reason);
        }
      };
      signal.addEventListener('abort', onAbort, { once: true });
      waiter.detach = () => {
        signal.removeEventListener('abort', onAbort);
      };
    });
  }

  /**
   * Pins `name` (loading it if needed): a pinned entry is never evicted until `unpin`. Pinning is a
   * flag, not a count; its bytes stay within the budget, so a pin can fail with `PEFT_CACHE_FULL`.
   */
  async pin(name: string, opts: AcquireOptions = {}): Promise<void> {
    const lease = await this.acquire(name, opts);
    this.#entries.get(name)!.pinned = true;
    lease.release();
  }

  /** Unpins a resident entry (a no-op if it is not pinned); an absent one is `PEFT_UNKNOWN_ADAPTER`. */
  unpin(name: string): void {
    const entry = this.#entries.get(name);
    if (entry === undefined) throw new PeftError(PeftCode.UNKNOWN_ADAPTER, `cannot unpin '${name}': it is not resident in the adapter cache`);
    entry.pinned = false;
  }

  /** Whether `name` is resident (loaded and admitted; a load in flight does not count). */
  has(name: string): boolean {
    return this.#entries.has(name);
  }

  /**
   * Evicts `name` now. Returns false when it is not resident. A pinned entry, or one with an
   * unreleased lease, is refused with `PEFT_IN_USE` (the cache cannot let go of it) and stays.
   */
  evict(name: string): boolean {
    const entry = this.#entries.get(name);
    if (entry === undefined) return false;
    if (entry.pinned || entry.leases > 0) {
      const why = entry.pinned ? 'it is pinned' : `it is in use (${String(entry.leases)} unreleased lease${entry.leases === 1 ? '' : 's'})`;
      throw new PeftError(PeftCode.IN_USE, `cannot evict '${name}': ${why}`, { hint: entry.pinned ? 'unpin it first' : 'release its leases first' });
    }
    this.#remove(entry);
    this.#safeDispose(entry.name, entry.value);
    return true;
  }

  /** Counters and occupancy now. */
  stats(): AdapterCacheStats {
    return {
      hits: this.#hits,
      misses: this.#misses,
      evictions: this.#evictions,
      loads: this.#loads,
      failedLoads: this.#failedLoads,
      loading: this.#loading,
      bytes: this.#bytes,
      entries: this.#entries.size,
      loadMsTotal: this.#loadMsTotal,
      disposeErrors: this.#disposeErrors,
    };
  }

  /** Resident entries, least recently used first (the order LRU eviction considers them in). */
  entries(): CacheEntryInfo[] {
    return [...this.#entries.values()].map((e) => ({ name: e.name, bytes: e.bytes, pinned: e.pinned, leases: e.leases }));
  }

  #touch(entry: Entry<T>): void {
    this.#entries.delete(entry.name);
    this.#entries.set(entry.name, entry);
  }

  #remove(entry: Entry<T>): void {
    this.#entries.delete(entry.name);
    this.#bytes -= entry.bytes;
    this.#evictions++;
  }

  #lease(entry: Entry<T>): CacheLease<T> {
    let released = false;
    return {
      name: entry.name,
      value: entry.value,
      get released(): boolean {
        return released;
      },
      release: (): void => {
        if (released) return;
        released = true;
        entry.leases--;
        // NOTE: a leased entry cannot have been evicted, so it is still the resident one.
        this.#touch(entry);
      },
    };
  }

  #start(name: string): Flight<T> {
    const flight: Flight<T> = { controller: new AbortController(), waiters: new Set(), started: performance.now() };
    this.#flights.set(name, flight);
    this.#loads++;
    this.#loading++;
    // NOTE: a loader that throws synchronously rejects this promise like an asynchronous failure.
    const pending = new Promise<CacheLoad<T>>((resolve) => {
      resolve(this.#load(name, flight.controller.signal));
    });
    void pending.then(
      (result) => {
        this.#settle(name, flight, { ok: true, result });
      },
      (error: unknown) => {
        this.#settle(name, flight, { ok: false, error });
      },
    );
    return flight;
  }

  #settle(name: string, flight: Flight<T>, outcome: { readonly ok: true; readonly result: unknown } | { readonly ok: false; readonly error: unknown }): void {
    this.#loading--;
    this.#loadMsTotal += performance.now() - flight.started;
    const current = this.#flights.get(name) === flight;
    if (current) this.#flights.delete(name);
    const refusal = outcome.ok ? this.#admit(name, flight, outcome.result, current) : { error: outcome.error };
    if (refusal === undefined) return;
    this.#failedLoads++;
    if (current) {
      for (const w of flight.waiters) {
        w.detach();
        w.reject(refusal.error);
      }
    }
    if (refusal.value !== undefined) this.#safeDispose(name, refusal.value);
  }

  /** Admits a loaded value, evicting LRU entries as needed; or says why it cannot, changing nothing. */
  #admit(name: string, flight: Flight<T>, result: unknown, current: boolean): Refusal<T> | undefined {
    const r = result as Partial<CacheLoad<T>> | null;
    const value = typeof r === 'object' && r !== null ? r.value : undefined;
    const keep = value === undefined ? {} : { value };
    if (!current) return { error: flight.controller.signal.reason, ...keep };
    const bytes = r?.bytes;
    if (value === undefined || typeof bytes !== 'number' || !Number.isSafeInteger(bytes) || bytes < 0) {
      return { error: new PeftError(PeftCode.BAD_ARGUMENT, `the loader of '${name}' resolved to ${value === undefined ? 'no value' : `an invalid size (${String(bytes)} bytes)`}; expected { value, bytes } with bytes a whole number ≥ 0`), ...keep };
    }
    const victims = this.#victimsFor(bytes);
    if (victims === undefined) {
      let held = 0;
      for (const e of this.#entries.values()) if (e.pinned || e.leases > 0) held += e.bytes;
      return {
        error: new PeftError(PeftCode.CACHE_FULL, `adapter '${name}' needs ${String(bytes)} bytes but only ${String(this.budgetBytes - held)} of the ${String(this.budgetBytes)}-byte budget can be freed (${String(held)} bytes are pinned or in use)`, {
          hint: 'raise budgetBytes, or release leases / unpin adapters',
        }),
        value,
      };
    }
    for (const v of victims) this.#remove(v);
    const entry: Entry<T> = { name, value, bytes, pinned: false, leases: flight.waiters.size };
    this.#entries.set(name, entry);
    this.#bytes += bytes;
    for (const w of flight.waiters) {
      w.detach();
      w.resolve(this.#lease(entry));
    }
    for (const v of victims) this.#safeDispose(v.name, v.value);
    return undefined;
  }

  /** The least recently used evictable entries that make room for `bytes`, or undefined if none can. */
  #victimsFor(bytes: number): Entry<T>[] | undefined {
    let excess = this.#bytes + bytes - this.budgetBytes;
    const victims: Entry<T>[] = [];
    for (const e of this.#entries.values()) {
      if (excess <= 0) break;
      if (e.pinned || e.leases > 0) continue;
      victims.push(e);
      excess -= e.bytes;
    }
    return excess <= 0 ? victims : undefined;
  }

  #safeDispose(name: string, value: T): void {
    if (this.#dispose === undefined) return;
    try {
      this.#dispose(name, value);
    } catch {
      // NOTE: the cache's state is already updated when dispose runs; letting its error escape
      // would reject unrelated waiters (or leave an admission half-reported), so it is counted.
      this.#disposeErrors++;
    }
  }
}

/**
 * A loader for `AdapterCache` over a directory of PEFT adapters: `name` is a subdirectory of
 * `root`, loaded with `loadLoraAdapter` and counted at `LoraAdapter.bytes`. Names that are not a
 * single path component are `PEFT_UNKNOWN_ADAPTER`; missing files are `PEFT_IO`.
 */
export function loraDirectoryLoader(root: string): CacheLoader<LoraAdapter> {
  return async (name, signal) => {
    if (name === '' || name === '.' || name === '..' || /[/\\]/.test(name)) {
      throw new PeftError(PeftCode.UNKNOWN_ADAPTER, `'${name}' is not an adapter name (one directory under ${root})`);
    }
    signal.throwIfAborted();
    const adapter = await loadLoraAdapter(join(root, name), { name });
    return { value: adapter, bytes: adapter.bytes };
  };
}
