import { StageError, errorMessage } from '@stageml/ir';
import type { LlamaConfig } from '@stageml/models';
import { CacheLostError, type RowSample, RuntimeCode, checkRowSamples } from '@stageml/runtime';
import type { AdapterSlots } from './adapter-slots.js';
import { type BatchContext, checkTokens, decodeBatch, mixedBatch, prefillBatch } from './batches.js';
import { EngineCode, EngineError } from './errors.js';
import { type PrefillOptions, type StepDecode, type StepPart, type StepPrefill, type StepRecord, type StepResult, positiveInt } from './options.js';
import type { Lane, Outputs, ProgramRunner, StepPick } from './runner.js';
import { Sequence } from './sequence.js';
import type { SequenceStore } from './sequence-store.js';

/** How a step that is not merged runs its decode rows and its prefill chunks. */
export interface StepParts {
  readonly decode: (d: StepDecode) => Promise<(number | Float32Array)[]>;
  readonly prefill: (p: StepPrefill, opts: PrefillOptions) => Promise<(number | Float32Array | undefined)[]>;
}

/**
 * The engine's step runner: turns decode, prefill and scheduler steps (`StepRecord`) into batch
 * runs — rows grouped by lane (adapters that cannot vary by row run in batches of their own),
 * prompt chunk sizes, a step's decode rows and prefill chunks merged into one run where that pays,
 * the plan applied before each step — and survives a restarted worker (one retry; lost executor
 * caches rebuilt from the sequences' tokens).
 */
export class StepRunner {
  readonly #ctx: BatchContext;
  steps = 0;
  mergedSteps = 0;
  rebuilds = 0;
  workerRetries = 0;

  constructor(
    readonly config: LlamaConfig,
    readonly runner: ProgramRunner,
    readonly seqs: SequenceStore,
    readonly adapters: AdapterSlots,
    /** Most prompt tokens one prefill run takes by default. */
    readonly prefillChunk: number,
    /** `EngineOptions.stepMergeWaste`. */
    readonly mergeWaste: number,
  ) {
    this.#ctx = { config, runner, seqs };
  }

  /** Applies a due plan between runs (`AdapterSlots.applyPlan`). */
  applyPlan(): Promise<void> {
    return this.adapters.applyPlan(this.runner.runs, this.runner.executor.name);
  }

  /** `Engine.chunkOf`: tokens the next prefill chunk of `seq` takes. */
  chunkOf(seq: Sequence, maxChunk?: number): number {
    const left = seq.prompt.length - seq.prefilled;
    if (longropeWholePrompt(this.config, seq.prompt.length)) return left;
    return Math.min(maxChunk ?? this.prefillChunk, left);
  }

  /** One decode step (`Engine.decode`, `decodeGreedy`, `decodeSample`); row specs are checked first. */
  async decode(seqs: readonly Sequence[], tokens: readonly number[], pick: StepPick): Promise<Float32Array[] | number[]> {
    if (typeof pick === 'object') checkRows(seqs, pick, 'decodeSample');
    await this.applyPlan();
    if (seqs.length === 0 || tokens.length !== seqs.length) throw new EngineError(EngineCode.BAD_OPTIONS, `decode needs one token per sequence (${String(seqs.length)} sequences, ${String(tokens.length)} tokens)`);
    const result: (Float32Array | number)[] = new Array<Float32Array | number>(seqs.length);
    const produced: Outputs = new Map();
    for (const [key, idx] of this.#byLane(seqs)) {
      const group = idx.map((i) => seqs[i]!);
      const lane = this.#lane(key);
      const groupPick = typeof pick === 'object' ? idx.map((i) => pick[i]!) : pick;
      const out = await this.#surviving(group, lane, produced, () => decodeBatch(this.#ctx, group, idx.map((i) => tokens[i]!), lane, produced, groupPick));
      idx.forEach((i, j) => {
        result[i] = out[j]!;
      });
    }
    this.runner.keep(produced);
    return result as Float32Array[] | number[];
  }

  /** The next prefill chunk of every sequence (`Engine.prefillMany`, `prefillSample`); row specs are checked first. */
  async prefill(seqs: readonly Sequence[], opts: PrefillOptions, pick: 'logits' | readonly RowSample[]): Promise<(Float32Array | number | undefined)[]> {
    if (typeof pick === 'object') checkRows(seqs, pick, 'prefillSample');
    const maxChunk = opts.maxChunk === undefined ? undefined : positiveInt('maxChunk', opts.maxChunk, 1);
    for (const s of seqs) this.seqs.check(s);
    if (new Set(seqs).size !== seqs.length) throw new EngineError(EngineCode.BAD_OPTIONS, 'a sequence appears twice in one prefill');
    await this.applyPlan();
    for (const s of seqs) {
      this.seqs.check(s);
      if (s.ready) throw new EngineError(EngineCode.BAD_SEQUENCE, 'the prompt is already prefilled');
    }
    const result: (Float32Array | number | undefined)[] = new Array<Float32Array | number | undefined>(seqs.length);
    const produced: Outputs = new Map();
    for (const [key, idx] of this.#byLane(seqs)) {
      const group = idx.map((i) => seqs[i]!);
      const lane = this.#lane(key);
      const groupPick = typeof pick === 'object' ? idx.map((i) => pick[i]!) : pick;
      const out = await this.#surviving(group, lane, produced, () => prefillBatch(this.#ctx, group, group.map((s) => this.seqs.check(s)), group.map((s) => this.chunkOf(s, maxChunk)), lane, produced, groupPick));
      idx.forEach((i, j) => {
        result[i] = out[j];
      });
    }
    this.runner.keep(produced);
    return result;
  }

  /** Indices of `seqs` by the adapter whose lane their rows run in ('': the shared slot programs), in first-seen order. */
  #byLane(seqs: readonly Sequence[]): Map<string, number[]> {
    const byLane = new Map<string, number[]>();
    seqs.forEach((s, i) => {
      const key = this.adapters.isLaned(s) ? s.adapter! : '';
      byLane.set(key, [...(byLane.get(key) ?? []), i]);
    });
    return byLane;
  }

  /** The lane of `#byLane`'s key, looked up when its group runs. */
  #lane(key: string): Lane | undefined {
    return key === '' ? undefined : this.adapters.lanes.get(key);
  }

  /**
   * `Engine.step`: one scheduler step, its decode rows and prefill chunks merged into one run where
   * that pays; otherwise each part runs through `parts` (the engine's public decode and prefill
   * methods, so what observes those calls sees a step's parts).
   */
  async step(record: StepRecord, parts: StepParts): Promise<StepResult> {
    const d = record.decode !== undefined && record.decode.seqs.length > 0 ? record.decode : undefined;
    const p = record.prefill !== undefined && record.prefill.seqs.length > 0 ? record.prefill : undefined;
    if (d === undefined && p === undefined) throw new EngineError(EngineCode.BAD_OPTIONS, 'a step needs decode rows or prefill chunks');
    this.steps++;
    const before = this.runner.runs;
    const runs = (): number => this.runner.runs - before;
    if (d !== undefined && p !== undefined) {
      let merge: boolean;
      try {
        await this.applyPlan();
        merge = this.#mergeable(d, p);
      } catch (e) {
        return { decode: { error: e }, prefill: { error: e }, merged: false, runs: runs() };
      }
      if (merge) {
        try {
          const out = await this.#mixedStep(d, p);
          this.mergedSteps++;
          return { decode: { values: out.slice(0, d.seqs.length) as (number | Float32Array)[] }, prefill: { values: out.slice(d.seqs.length) }, merged: true, runs: runs() };
        } catch (e) {
          return { decode: { error: e }, prefill: { error: e }, merged: true, runs: runs() };
        }
      }
    }
    let decode: StepPart<number | Float32Array> | undefined;
    if (d !== undefined) {
      try {
        const values: (number | Float32Array)[] = await parts.decode(d);
        // Recycled outputs: the prefill run below may write into these logits' storage.
        decode = { values: this.runner.spare !== undefined && p !== undefined ? values.map((v) => (typeof v === 'number' ? v : v.slice())) : values };
      } catch (e) {
        decode = { error: e };
      }
    }
    let prefill: StepPart<number | Float32Array | undefined> | undefined;
    if (p !== undefined) {
      const opts = p.maxChunk === undefined ? {} : { maxChunk: p.maxChunk };
      try {
        prefill = { values: await parts.prefill(p, opts) };
      } catch (e) {
        prefill = { error: e };
      }
    }
    return { ...(decode === undefined ? {} : { decode }), ...(prefill === undefined ? {} : { prefill }), merged: false, runs: runs() };
  }

  /**
   * Whether a step's decode rows and prefill chunks run as one program run: no lanes, no sliding
   * window, alike picks, and the decode rows' padding (rows × (C − 1)) within `stepMergeWaste` of
   * the token rows the two runs would take apart.
   */
  #mergeable(d: StepDecode, p: StepPrefill): boolean {
    if (this.config.slidingWindow !== undefined || (d.rows === undefined) !== (p.rows === undefined)) return false;
    const laned = (s: Sequence): boolean => this.adapters.isLaned(s);
    if (d.seqs.some(laned) || p.seqs.some(laned)) return false;
    const maxChunk = p.maxChunk === undefined ? undefined : positiveInt('maxChunk', p.maxChunk, 1);
    const C = Math.max(...p.seqs.map((s) => this.chunkOf(s, maxChunk)));
    if (!(C >= 1)) return false;
    const nd = d.seqs.length;
    return nd * (C - 1) <= this.mergeWaste * (nd + p.seqs.length * C);
  }

  /** A merged step: the decode rows and the prefill chunks of `d` and `p` in one run. */
  async #mixedStep(d: StepDecode, p: StepPrefill): Promise<(Float32Array | number | undefined)[]> {
    const maxChunk = p.maxChunk === undefined ? undefined : positiveInt('maxChunk', p.maxChunk, 1);
    if (d.tokens.length !== d.seqs.length) throw new EngineError(EngineCode.BAD_OPTIONS, `decode needs one token per sequence (${String(d.seqs.length)} sequences, ${String(d.tokens.length)} tokens)`);
    if (d.rows !== undefined) checkRows(d.seqs, d.rows, 'step (decode)');
    if (p.rows !== undefined) checkRows(p.seqs, p.rows, 'step (prefill)');
    const seqs = [...d.seqs, ...p.seqs];
    if (new Set(seqs).size !== seqs.length) throw new EngineError(EngineCode.BAD_OPTIONS, 'a sequence appears twice in one step');
    for (const s of d.seqs) {
      this.seqs.check(s);
      if (!s.ready) throw new EngineError(EngineCode.BAD_SEQUENCE, 'a sequence in the decode batch is not prefilled yet');
    }
    for (const s of p.seqs) {
      this.seqs.check(s);
      if (s.ready) throw new EngineError(EngineCode.BAD_SEQUENCE, 'the prompt is already prefilled');
    }
    checkTokens(this.config, d.tokens);
    const pick: 'logits' | readonly RowSample[] = d.rows === undefined ? 'logits' : [...d.rows, ...p.rows!];
    const produced: Outputs = new Map();
    const out = await this.#surviving(seqs, undefined, produced, () => mixedBatch(this.#ctx, d.seqs, d.tokens, p.seqs, p.seqs.map((s) => this.chunkOf(s, maxChunk)), produced, pick));
    this.runner.keep(produced);
    return out;
  }

  /**
   * Runs `step` over `seqs`, surviving a restarted worker: a step whose worker died under it
   * (`RT_WORKER_FAILED`, which leaves the engine's state as it was) runs once more on the next
   * worker; where a step fails because the executor lost caches of `seqs` (`CacheLostError`: a
   * restarted worker, and no host copy to restore them from), those caches are rebuilt and the
   * step runs again. A second worker failure, or a failed rebuild, fails the step.
   */
  async #surviving<T>(seqs: readonly Sequence[], lane: Lane | undefined, produced: Outputs, step: () => Promise<T>): Promise<T> {
    let retried = false;
    let rebuilt = false;
    for (;;) {
      try {
        return await step();
      } catch (e) {
        if (!retried && e instanceof StageError && e.code === RuntimeCode.WORKER_FAILED) {
          retried = true;
          this.workerRetries++;
          continue;
        }
        const lost = e instanceof CacheLostError && !this.seqs.hostKv && !rebuilt ? seqs.filter((s) => s.cache !== undefined && e.ids.includes(s.cache)) : [];
        if (lost.length === 0) throw e;
        rebuilt = true;
        await this.#rebuild(lost, lane, produced);
      }
    }
  }

  /**
   * Rebuilds the executor's caches of `seqs` by prefilling, in fresh caches, the tokens each has
   * appended so far (its prefilled prompt, then its decoded tokens) at the positions and key masks
   * it had; each sequence then reads its new cache. The host's records (lengths, masks) do not
   * change; a rebuild that fails leaves every sequence on its old (lost) cache and frees the new.
   */
  async #rebuild(seqs: readonly Sequence[], lane: Lane | undefined, produced: Outputs): Promise<void> {
    const caches = this.seqs.caches!;
    const standIns = seqs.map((s) => {
      const decoded = this.seqs.history.get(s) ?? [];
      const tokens = [...s.prompt.slice(0, s.prefilled), ...decoded];
      const t = new Sequence(s.adapter, tokens, [...s.promptMask.slice(0, s.prefilled), ...decoded.map(() => 1)], this.seqs.newKv(tokens.length));
      t.slot = s.slot;
      t.cache = caches.open();
      return t;
    });
    try {
      while (standIns.some((t) => !t.ready)) {
        const todo = standIns.filter((t) => !t.ready);
        await prefillBatch(this.#ctx, todo, todo.map((t) => t.slot!), todo.map((t) => this.chunkOf(t)), lane, produced, 'logits');
      }
      seqs.forEach((s, i) => {
        const t = standIns[i]!;
        if (t.kv.length !== s.kv.length || t.nextPosition !== s.nextPosition) throw new EngineError(EngineCode.RUN_FAILED, `rebuilding a lost cache gave ${String(t.kv.length)} positions (next ${String(t.nextPosition)}) for a sequence of ${String(s.kv.length)} (next ${String(s.nextPosition)})`);
      });
    } catch (e) {
      caches.release(standIns.map((t) => t.cache!));
      throw e;
    }
    caches.release(seqs.map((s) => s.cache!));
    seqs.forEach((s, i) => {
      s.cache = standIns[i]!.cache;
      // Released while it was rebuilt: its new cache goes too.
      if (s.released) caches.release([s.cache!]);
    });
    this.rebuilds += seqs.length;
  }
}

/** `decodeSample`/`prefillSample`'s row specs: one per sequence and valid, else `ENGINE_BAD_OPTIONS`. */
function checkRows(seqs: readonly Sequence[], rows: readonly RowSample[], what: string): void {
  if (rows.length !== seqs.length) throw new EngineError(EngineCode.BAD_OPTIONS, `${what} needs one row spec per sequence (${String(seqs.length)} sequences, ${String(rows.length)} specs)`);
  try {
    if (rows.length > 0) checkRowSamples('logits', rows);
  } catch (e) {
    throw new EngineError(EngineCode.BAD_OPTIONS, errorMessage(e), { cause: e });
  }
}

/**
 * Whether a prompt of `length` tokens must be prefilled in one run: with longrope (Phi-3) the
 * rotary factors of a run are the long ones when its last position reaches past
 * `original_max_position_embeddings` (transformers' `longrope_frequency_update`: max(position) + 1 >
 * original), so transformers' one forward over such a prompt rotates every key with the long
 * factors; chunks before the crossing would cache short-rotated keys instead.
 */
function longropeWholePrompt(config: LlamaConfig, length: number): boolean {
  return config.rope.type === 'longrope' && length > config.rope.originalMaxPositions;
}
