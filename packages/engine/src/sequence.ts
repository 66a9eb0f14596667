import type { CacheLease, LoraAdapter } from '@stageml/peft';
import type { SequenceKv } from './kv.js';

/** A resident adapter's entry in the slot cache. */
export interface SlotEntry {
  /**
   * The parsed adapter until its factors are written into the slot tables, then its shapes only:
   * the tables are the one copy a resident adapter's factors have (a plan change re-reads them
   * through the host cache).
   */
  adapter: LoraAdapter;
  slot: number | undefined;
}

/**
 * One request's state in the engine: its prompt, how much of it is prefilled, its resident KV
 * cache and its adapter's slot. Made by `Engine.open`; ended by `Engine.release`.
 */
export class Sequence {
  /** Prompt tokens already prefilled. */
  prefilled = 0;
  /** Rotary position of the next attended token. */
  nextPosition = 0;
  /** Slot of the adapter (0: base), once attached. */
  slot: number | undefined;
  /** Whether the sequence was released. */
  released = false;
  lease: CacheLease<SlotEntry> | undefined;
  /** Prompt tokens whose keys and values came from the prefix cache instead of a prefill (`EngineOptions.prefixCaching`). */
  cachedTokens = 0;
  /** The executor's cache holding this sequence's KV (`Executor.caches`), when the engine keeps KV there. */
  cache: number | undefined;
  #reserve: number | undefined;

  constructor(
    /** Adapter name, or undefined for the base model. */
    readonly adapter: string | undefined,
    /** Prompt token ids. */
    readonly prompt: readonly number[],
    /** Per prompt token, 1 attended or 0 masked (padding). */
    readonly promptMask: readonly number[],
    /** The resident KV cache. */
    readonly kv: SequenceKv,
  ) {}

  /**
   * Positions the sequence is expected to reach (its prompt plus the request's limit of new
   * tokens), when the caller knows it: a hint an executor keeping a persistent batch of caches
   * sizes that batch by, so it is not re-staged as rows grow (`CacheRow.reserve`), and the host KV
   * is sized by (`SequenceKv.expect`: one allocation instead of doubling). Never a limit.
   */
  get reserve(): number | undefined {
    return this.#reserve;
  }

  set reserve(positions: number | undefined) {
    this.#reserve = positions;
    if (positions !== undefined) this.kv.expect(positions);
  }

  /** Whether the whole prompt is prefilled (the sequence decodes). */
  get ready(): boolean {
    return this.prefilled === this.prompt.length;
  }
}
