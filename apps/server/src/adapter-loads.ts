import { stat } from 'node:fs/promises';
import { join } from 'node:path';
import { StageError, classifyError } from '@stageml/ir';
import { ServerCode, ServerError } from './errors.js';

/** What runtime adapter loads need of the model: load by directory and name. */
export interface LoadTarget {
  readonly adapterNames: readonly string[];
  loadAdapter(dir: string, name: string): Promise<unknown>;
}

/** Options of {@link AdapterLoads}. */
export interface AdapterLoadsOptions {
  /**
   * Most adapter-file bytes read at once over all loads (default 4 GiB); a load waits until its
   * file fits, or runs alone when its file is larger than the whole budget.
   */
  readonly maxBytesInFlight?: number;
}

/** The identity of an adapter directory's two files: a change to either is a new identity. */
async function identityOf(dir: string): Promise<string> {
  const parts = await Promise.all(['adapter_config.json', 'adapter_model.safetensors'].map(async (f) => {
    const s = await stat(join(dir, f), { bigint: true });
    return `${String(s.dev)}:${String(s.ino)}:${String(s.size)}:${String(s.mtimeNs)}`;
  }));
  return parts.join('|');
}

/**
 * Every runtime adapter load — the admin's `load_lora_adapter` and the resolver's on-demand loads —
 * goes through here, which makes three things hold by construction:
 *
 * - **one load per name at a time**: a name is reserved synchronously when its load starts; the
 *   admin is refused (409) while any load of that name runs, an on-demand load joins it;
 * - **bounded bytes in flight**: loads take their adapter file's size from a byte budget;
 * - **failures remembered**: a directory whose load failed for an input reason (a bad file) is
 *   refused again at once, without reading it, until one of its files changes (device, inode,
 *   size or modification time).
 */
export class AdapterLoads {
  readonly #target: LoadTarget;
  readonly #budget: number;
  readonly #inFlight = new Map<string, Promise<void>>();
  /** Failed directories: their files' identity and the error the load gave. */
  readonly #failed = new Map<string, { readonly identity: string; readonly error: unknown }>();
  #bytes = 0;
  readonly #waiting: (() => void)[] = [];
  #cachedRefusals = 0;

  /** Loads into `target` (the engine). */
  constructor(target: LoadTarget, opts: AdapterLoadsOptions = {}) {
    this.#target = target;
    this.#budget = opts.maxBytesInFlight ?? 4 * 1024 ** 3;
  }

  /** The load of `name` in flight, if any. */
  inFlight(name: string): Promise<void> | undefined {
    return this.#inFlight.get(name);
  }

  /** Loads refused from the failure cache without reading their files. */
  get cachedRefusals(): number {
    return this.#cachedRefusals;
  }

  /** Adapter-file bytes being read now. */
  get bytesInFlight(): number {
    return this.#bytes;
  }

  /**
   * Runs `work` (which checks and loads) as the one load of `name`: registered before anything
   * is awaited, so a second load of the name started meanwhile sees it.
   */
  reserve(name: string, work: () => Promise<void>): Promise<void> {
    if (this.#inFlight.has(name)) throw new ServerError(ServerCode.ADAPTER_EXISTS, `an adapter named '${name}' is already loaded or loading`);
    const p = work().finally(() => {
      this.#inFlight.delete(name);
    });
    this.#inFlight.set(name, p);
    return p;
  }

  /**
   * The on-demand path: waits for a load of `name` already running (the admin's, say) and
   * returns when it left the name loaded; otherwise loads `dir` as `name` under a reservation.
   */
  async loadOnDemand(dir: string, name: string): Promise<void> {
    // Loaded meanwhile (by the admin, say): never replaced by an on-demand load.
    if (this.#target.adapterNames.includes(name)) return;
    const running = this.#inFlight.get(name);
    if (running !== undefined) {
      await running.catch(() => undefined);
      if (this.#target.adapterNames.includes(name)) return;
    }
    if (this.#inFlight.has(name)) return this.loadOnDemand(dir, name);
    return this.reserve(name, () => this.load(dir, name));
  }

  /**
   * Loads the checked directory `dir` as `name`: refused at once when it failed before and its
   * files have not changed; otherwise read within the byte budget, and a failure of the file's
   * own making (an input error) remembered.
   */
  async load(dir: string, name: string): Promise<void> {
    const identity = await identityOf(dir);
    const failed = this.#failed.get(dir);
    if (failed !== undefined) {
      if (failed.identity === identity) {
        this.#cachedRefusals++;
        throw failed.error;
      }
      this.#failed.delete(dir);
    }
    const size = (await stat(join(dir, 'adapter_model.safetensors'))).size;
    const take = Math.min(size, this.#budget);
    await this.#acquire(take);
    try {
      await this.#target.loadAdapter(dir, name);
    } catch (e) {
      if (e instanceof StageError && classifyError(e).class === 'input') {
        if (this.#failed.size >= 1024) this.#failed.delete(this.#failed.keys().next().value!);
        this.#failed.set(dir, { identity, error: e });
      }
      throw e;
    } finally {
      this.#release(take);
    }
  }

  async #acquire(bytes: number): Promise<void> {
    while (this.#bytes > 0 && this.#bytes + bytes > this.#budget) await new Promise<void>((resolve) => this.#waiting.push(resolve));
    this.#bytes += bytes;
  }

  #release(bytes: number): void {
    this.#bytes -= bytes;
    for (const wake of this.#waiting.splice(0)) wake();
  }
}
