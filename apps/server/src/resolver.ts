import { stat } from 'node:fs/promises';
import { join } from 'node:path';
import { PeftCode, PeftError } from '@stageml/peft';
import { RouterCode, RouterError } from '@stageml/router';

/** What the resolver needs of the model: load and unload adapters by name (the `Engine` has these). */
export interface AdapterHost {
  readonly adapterNames: readonly string[];
  loadAdapter(dir: string, name: string): Promise<unknown>;
  unloadAdapter(name: string): boolean;
}

/** Options of `AdapterResolver`. */
export interface AdapterResolverOptions {
  /** Directories holding one PEFT adapter directory per adapter name, searched in order. */
  readonly roots: readonly string[];
  /** Most adapters loaded at once (the slot capacity); the least recently used idle one is evicted. */
  readonly capacity: number;
  /** Whether requests still use an adapter outside the resolver's leases (e.g. the scheduler's queues). */
  readonly isBusy?: (name: string) => boolean;
  /**
   * Checks a found adapter directory before it is loaded (the server's adapter-path guard: inside a
   * root after resolving symlinks, regular files, size caps); resolves to the directory to load.
   */
  readonly check?: (dir: string) => Promise<string>;
  /**
   * A load of `name` running outside the resolver (the admin API), if any: the resolver waits for
   * it rather than loading the name a second time.
   */
  readonly pending?: (name: string) => Promise<unknown> | undefined;
  /** Called after each on-demand load (metrics). */
  readonly onLoad?: (name: string) => void;
  /** Called after each eviction (metrics). */
  readonly onEvict?: (name: string) => void;
}

/** Releases a lease; calling it again does nothing. */
export type ReleaseAdapter = () => void;

/**
 * Why `name` cannot name an adapter directory under a root, or undefined when it can: names are
 * one path segment (no `/` or `\`, no `..`, no leading dot, no NUL, at most 255 characters).
 */
export function adapterNameProblem(name: string): string | undefined {
  if (name === '') return 'it is empty';
  if (name.length > 255) return 'it is longer than 255 characters';
  if (name.startsWith('.')) return 'it starts with a dot';
  if (name.includes('..')) return "it contains '..'";
  if (/[/\\\0]/.test(name)) return 'it contains a path separator or NUL';
  return undefined;
}

/**
 * On-demand adapter loading from shared adapter roots (vLLM's LoRA resolver behaviour): a request
 * for an adapter that is not loaded but exists as `<root>/<name>` loads it first. Loads are
 * single-flight (concurrent requests for one name share one load) and bounded by `capacity`: when
 * full, the least recently used adapter that the resolver loaded and nothing uses is unloaded.
 * Adapters loaded by other means (at start, by the admin API) are counted but never evicted.
 *
 * Requests hold a lease (`acquire` … release) for their whole lifetime, so an adapter is never
 * evicted under a request that is about to use it.
 */
export class AdapterResolver {
  readonly #host: AdapterHost;
  readonly #opts: AdapterResolverOptions;
  /** Adapters this resolver loaded, least recently used first. */
  readonly #lru = new Map<string, true>();
  readonly #leases = new Map<string, number>();
  readonly #loading = new Map<string, Promise<void>>();
  #loads = 0;
  #evictions = 0;

  /** A resolver over `host` (the server's `Engine`). */
  constructor(host: AdapterHost, opts: AdapterResolverOptions) {
    if (!Number.isSafeInteger(opts.capacity) || opts.capacity < 1) throw new RouterError(RouterCode.BAD_CONFIG, `the adapter capacity must be a positive integer, got ${String(opts.capacity)}`);
    if (opts.roots.length === 0) throw new RouterError(RouterCode.BAD_CONFIG, 'on-demand adapter loading needs at least one adapter root');
    this.#host = host;
    this.#opts = opts;
  }

  /** Most adapters loaded at once. */
  get capacity(): number {
    return this.#opts.capacity;
  }

  /** On-demand loads so far. */
  get loads(): number {
    return this.#loads;
  }

  /** Adapters evicted so far. */
  get evictions(): number {
    return this.#evictions;
  }

  /** Adapters loaded on demand, least recently used first. */
  get onDemand(): string[] {
    return [...this.#lru.keys()].filter((n) => this.#host.adapterNames.includes(n));
  }

  /** Whether `name` is loaded or can be loaded from a root (without loading it). */
  async resolvable(name: string): Promise<boolean> {
    if (this.#host.adapterNames.includes(name)) return true;
    return adapterNameProblem(name) === undefined && (await this.#find(name)) !== undefined;
  }

  /**
   * Makes `name` loaded (loading it from a root if needed) and leases it until the returned
   * function is called. An unknown or invalid name is `ROUTER_UNKNOWN_MODEL`; a full cache whose
   * adapters are all in use is `PEFT_CACHE_FULL`; a bad adapter directory fails with the loader's
   * error and leaves the loaded set as it was.
   */
  async acquire(name: string): Promise<ReleaseAdapter> {
    this.#leases.set(name, (this.#leases.get(name) ?? 0) + 1);
    let released = false;
    const release = (): void => {
      if (released) return;
      released = true;
      const n = (this.#leases.get(name) ?? 1) - 1;
      if (n === 0) this.#leases.delete(name);
      else this.#leases.set(name, n);
      this.#trim();
    };
    try {
      await this.#ensure(name);
    } catch (e) {
      release();
      throw e;
    }
    if (this.#lru.has(name)) {
      this.#lru.delete(name);
      this.#lru.set(name, true);
    }
    return release;
  }

  async #ensure(name: string): Promise<void> {
    for (;;) {
      if (this.#host.adapterNames.includes(name)) return;
      const pending = this.#loading.get(name);
      if (pending !== undefined) {
        await pending;
        continue;
      }
      const other = this.#opts.pending?.(name);
      if (other !== undefined) {
        await other.catch(() => undefined);
        if (this.#host.adapterNames.includes(name)) return;
      }
      const problem = adapterNameProblem(name);
      if (problem !== undefined) throw new RouterError(RouterCode.UNKNOWN_MODEL, `model '${name}' does not exist and is not a valid adapter name: ${problem}`);
      const dir = await this.#find(name);
      if (dir === undefined) throw new RouterError(RouterCode.UNKNOWN_MODEL, `model '${name}' does not exist (not loaded, and no adapter directory '${name}' under the adapter roots)`);
      // #find awaited: another request may have started or finished this load meanwhile.
      if (this.#host.adapterNames.includes(name) || this.#loading.has(name)) continue;
      if (this.#host.adapterNames.length + this.#loading.size >= this.capacity && this.#victim(name) === undefined) {
        throw new PeftError(PeftCode.CACHE_FULL, `all ${String(this.capacity)} adapter slots hold adapters in use; retry when a request finishes`);
      }
      const load = (this.#opts.check === undefined ? Promise.resolve(dir) : this.#opts.check(dir)).then((checked) => this.#host.loadAdapter(checked, name)).then(() => {
        this.#loads++;
        this.#lru.set(name, true);
        this.#opts.onLoad?.(name);
        this.#trim();
      });
      this.#loading.set(name, load);
      try {
        await load;
      } finally {
        this.#loading.delete(name);
      }
      return;
    }
  }

  /** Unloads least recently used idle adapters while more than `capacity` are loaded. */
  #trim(): void {
    while (this.#host.adapterNames.length > this.capacity) {
      const v = this.#victim(undefined);
      if (v === undefined) return;
      this.#host.unloadAdapter(v);
      this.#lru.delete(v);
      this.#evictions++;
      this.#opts.onEvict?.(v);
    }
  }

  #victim(except: string | undefined): string | undefined {
    const loaded = new Set(this.#host.adapterNames);
    for (const n of this.#lru.keys()) {
      if (!loaded.has(n)) {
        this.#lru.delete(n);
        continue;
      }
      if (n !== except && !this.#leases.has(n) && this.#opts.isBusy?.(n) !== true) return n;
    }
    return undefined;
  }

  async #find(name: string): Promise<string | undefined> {
    for (const root of this.#opts.roots) {
      const dir = join(root, name);
      try {
        if ((await stat(join(dir, 'adapter_config.json'))).isFile()) return dir;
      } catch {
        // Not under this root: try the next.
      }
    }
    return undefined;
  }
}
