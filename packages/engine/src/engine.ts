import type { HostTensor } from '@stageml/ir';
import { type LlamaConfig, ModelCode, ModelError, type TextTokenizer } from '@stageml/models';
import { type LoraAdapter, PeftCode, PeftError } from '@stageml/peft';
import { type RowSample, type SchedulingHints, CPU_SCHEDULING } from '@stageml/runtime';
import { AdapterSlots, BASE } from './adapter-slots.js';
import type { EngineAdapterDType, EngineDType } from './dtype.js';
import { type EngineParts, loadEngine } from './engine-load.js';
import type { EngineMemory, EngineOptions, EnginePlan, EngineStats, PrefillOptions, ProgramForm, StepRecord, StepResult } from './options.js';
import { positiveInt } from './options.js';
import { PlanState } from './plan-state.js';
import { takesRowKv } from './row-kv.js';
import { ProgramRunner } from './runner.js';
import { PromptScorer } from './scoring.js';
import type { Sequence } from './sequence.js';
import { SequenceStore } from './sequence-store.js';
import type { SlotTables } from './slots.js';
import type { ProgramReport } from './stage-program.js';
import { StepRunner } from './step-runner.js';

/**
 * The serving engine: one compiled program per (model, executor, slot-table shape), holding the
 * base weights once; adapters are data written into slot tables that every run takes as inputs
 * (so a batch's adapter composition never prepares anything); each sequence's KV cache stays
 * resident and grows in place; prefill runs in chunks and returns last-position logits only.
 *
 * Slots are managed by an `AdapterCache` (LRU among idle, unpinned adapters; single-flight loads);
 * a second one holds parsed adapters on the host, bounded by `maxCpuLoras`. MoE expert LoRA
 * (PEFT `target_parameters`) lives in expert slot tables beside the attention factors, so
 * attention adapters, expert adapters and base rows share batches; LoRA bias and DoRA live in
 * per-slot output tables and mix row by row too. Whole-tensor overrides (`modules_to_save`, a tied
 * `lm_head` included) and trainable tokens run in lanes (batches of their own on the same
 * programs) — see `adapter-kinds.ts`; an adapter refused at load never fails anyone else's batch.
 *
 * The class is the public face of its parts, each in a module of its own: program preparation
 * (`engine-load.ts`), running the prepared programs (`runner.ts`), live sequences and their KV
 * (`sequence-store.ts`), adapters, slots and lanes (`adapter-slots.ts`), plans (`plan-state.ts`),
 * steps and batches (`step-runner.ts`, `batches.ts`) and prompt scoring (`scoring.ts`).
 */
export class Engine {
  readonly #runner: ProgramRunner;
  readonly #seqs: SequenceStore;
  readonly #plans: PlanState;
  readonly #adapters: AdapterSlots;
  readonly #steps: StepRunner;
  readonly #scorer: PromptScorer;
  readonly #tables: SlotTables;
  /** Per prepared program, where it came from (the staging pipeline's report). */
  readonly #reports: Map<string, ProgramReport>;
  readonly #weightBytes: number;
  /** The part of `#weightBytes` the executor read and holds on its device only (`deviceWeights`). */
  readonly #deviceWeightBytes: number;
  readonly #prefillChunk: number;
  readonly #dtype: EngineDType;
  readonly #adapterDtype: EngineAdapterDType;

  private constructor(
    /** The model directory. */
    readonly dir: string,
    /** The parsed config. */
    readonly config: LlamaConfig,
    /** The tokenizer, when the directory has one. */
    readonly tokenizer: TextTokenizer | undefined,
    parts: EngineParts,
  ) {
    this.#dtype = parts.dtype;
    this.#adapterDtype = parts.adapterDtype;
    this.#tables = parts.tables;
    this.#weightBytes = parts.weightBytes;
    this.#deviceWeightBytes = parts.deviceWeightBytes;
    this.#prefillChunk = parts.prefillChunk;
    this.#reports = new Map(parts.staging.staged.map((st) => [st.report.form, st.report]));
    this.#plans = new PlanState(parts.memoryBudget, parts.fixedPlan, parts.replanEvery);
    this.#seqs = new SequenceStore(config, parts.dtype, parts.caches, parts.hostKvCopy, parts.prefix, this.#plans);
    // Host KV on programs that read the caches per row (cpu-native): multi-row steps copy no KV.
    this.#seqs.rowKv = parts.caches === undefined && takesRowKv(Object.values(parts.programs), config.numLayers);
    this.#runner = new ProgramRunner({ ...parts, hostKv: this.#seqs.hostKv, kvOutputs: this.#seqs.kvOutputs }, config);
    this.#adapters = new AdapterSlots(dir, config, parts, this.#plans, () => this.#runner.outTables());
    this.#steps = new StepRunner(config, this.#runner, this.#seqs, this.#adapters, parts.prefillChunk, parts.mergeWaste);
    this.#scorer = new PromptScorer(config, this.#runner, parts.tables, parts.staging.foldSources, this.#reports, parts.dtype, parts.adapterDtype, parts.allWeightInputs);
  }

  /**
   * Loads `config.json`, the checkpoint and the tokenizer from `dir`, builds the slot program and
   * prepares it once on the executor with the base weights (missing or wrongly shaped tensors are
   * `MODEL_BAD_WEIGHT` naming file and key).
   */
  static async load(dir: string, opts: EngineOptions = {}): Promise<Engine> {
    const { config, tokenizer, parts } = await loadEngine(dir, opts);
    return new Engine(dir, config, tokenizer, parts);
  }

  /** Bytes one position of a sequence's resident KV cache takes: keys and values of every layer, and its mask entry (f32). */
  get kvBytesPerToken(): number {
    return (2 * this.config.numLayers * this.#seqs.kvShape[0] * this.#seqs.kvShape[1] + 1) * 4;
  }

  /**
   * Where the prepared program of `form` came from: the staging pipeline's report (lattice,
   * cutoff, stages, rewrites, what `specialize` folded, the residual's ops); undefined for a form
   * not prepared. `programReports` lists every prepared one.
   */
  programReport(form: ProgramForm | 'scoring'): ProgramReport | undefined {
    return this.#reports.get(form);
  }

  /** The staging reports of every prepared program, by form. */
  get programReports(): Readonly<Record<string, ProgramReport>> {
    return Object.fromEntries(this.#reports);
  }

  /** Names of loaded adapters (resident in a slot or not). */
  get adapterNames(): string[] {
    return this.#adapters.names;
  }

  /** Compute dtype of the programs (`EngineOptions.dtype`, `checkpoint` resolved). */
  get dtype(): EngineDType {
    return this.#dtype;
  }

  /** Dtype of the slot tables' factors: f32, the compute dtype with `adapterDtype: 'same'`, or `i8` with `adapterDtype: 'int8'`. */
  get factorDtype(): EngineDType | 'i8' {
    if (this.#adapterDtype === 'int8') return 'i8';
    return this.#dtype !== 'f32' && this.#adapterDtype === 'same' ? this.#dtype : 'f32';
  }

  /** The executor running the program. */
  get executorName(): string {
    return this.#runner.executor.name;
  }

  /** Slots N (including the base slot 0) and their rank R. */
  get slotShape(): { readonly slots: number; readonly rank: number } {
    return { slots: this.#tables.slots, rank: this.#tables.rank };
  }

  /**
   * The scheduling defaults of this engine's executor (`ExecutorCapabilities.scheduling` of
   * @stageml/runtime: a step budget of thousands of tokens on a GPU, 64 on the host CPU), which a
   * scheduler takes where its options name none.
   */
  get scheduling(): SchedulingHints {
    return this.#runner.executor.capabilities.scheduling ?? CPU_SCHEDULING;
  }

  /**
   * Whether prefix caching serves hits (`EngineOptions.prefixCaching`): asked for, the keys and
   * values can be copied (the host holds them, or the executor holding the only copy forks its
   * caches: the torch worker), and not a longrope model.
   */
  get prefixCaching(): boolean {
    return this.#seqs.prefixActive;
  }

  /**
   * Sets the bytes live sequences' KV and the prefix cache's retained KV may hold together
   * (`PrefixCachingOptions.kvBudget`), evicting down to it now. No-op without prefix caching; a bad
   * value is `ENGINE_BAD_OPTIONS`.
   */
  setPrefixKvBudget(bytes: number): void {
    this.#seqs.prefix?.setBudget(bytes);
    this.#seqs.fitPrefix();
  }

  /** Whether sequences' KV lives on the executor (`EngineOptions.residentKv`). */
  get residentKv(): boolean {
    return this.#seqs.caches !== undefined;
  }

  /** Executor-held bytes by kind. */
  memory(): EngineMemory {
    const { kv, executorKv, staging, prefixKv } = this.#seqs.memory();
    const lanes = this.#adapters.laneBytes;
    const hostAdapters = this.#adapters.hostBytes;
    const onDevice = this.#deviceWeightBytes + (this.#tables.onDevice ? this.#tables.bytes : 0) + executorKv + (this.#seqs.prefixOnDevice ? prefixKv : 0);
    return { weights: this.#weightBytes, slots: this.#tables.bytes, slotFactors: this.#tables.factorBytes, kv, prefixKv, executorKv, staging, lanes, hostAdapters, total: this.#weightBytes + this.#tables.bytes + kv + prefixKv + executorKv + staging + lanes + hostAdapters, onDevice };
  }

  /** Counters. */
  stats(): EngineStats {
    const r = this.#runner;
    const st = this.#steps;
    return { preparations: r.preparations, runs: r.runs, runsByForm: { ...r.runsByForm }, outTableRuns: r.outRuns, residentAdapters: this.#adapters.resident, sequences: this.#seqs.live.size, freeSlots: this.#tables.freeSlots, cacheRebuilds: st.rebuilds, workerRetries: st.workerRetries, steps: st.steps, mergedSteps: st.mergedSteps, executor: this.#seqs.caches?.stats?.() ?? {}, ...(this.#seqs.prefix === undefined ? {} : { prefixCache: this.#seqs.prefix.stats() }) };
  }

  /** Whether the base slot and every free slot hold only zeros (an unloaded adapter leaves nothing behind). */
  slotsAreClear(): boolean {
    return this.#tables.freeSlotsAreZero();
  }

  /**
   * Reads a PEFT adapter directory, validates it against this model and the slot shape, registers
   * it and warms a slot for it (evicting the least recently used idle adapter when all are taken).
   * A refused adapter (`ENGINE_BAD_ADAPTER`, PEFT errors) leaves the engine as it was.
   */
  loadAdapter(dir: string, name?: string): Promise<LoraAdapter> {
    // The new version's prefix key is set as the adapter is registered: no request opened while its
    // slot loads can read blocks of the version it replaces.
    return this.#adapters.load(dir, name, (a) => {
      this.#seqs.adapterLoaded(a);
    });
  }

  /** Forgets an adapter: frees (zeroes) its slot, its host copy and its lane. `PEFT_IN_USE` while sequences run on it. */
  unloadAdapter(name: string): boolean {
    if (!this.#adapters.unload(name)) return false;
    this.#seqs.adapterUnloaded(name);
    return true;
  }

  /** The plan applied now. */
  plan(): EnginePlan {
    return this.#plans.plan();
  }

  /** Marks the plan for re-planning before the next step (e.g. after traffic shifted). */
  replan(): void {
    this.#plans.replan();
  }

  /**
   * Starts a sequence: validates the prompt (`MODEL_BAD_TOKEN`) and adapter (`MODEL_BAD_ADAPTER`
   * when not loaded); `mask` marks padding (0) per prompt token. Attach it before running it. With
   * prefix caching (and `reuse`, default true) it starts from the longest cached prefix of its
   * prompt: `prefilled` and `cachedTokens` count the positions copied.
   */
  open(adapter: string | null | undefined, prompt: readonly number[], mask?: readonly number[], reuse = true): Sequence {
    const name = adapter === null || adapter === undefined || adapter === BASE ? undefined : adapter;
    if (name !== undefined && !this.#adapters.has(name)) {
      throw new ModelError(ModelCode.BAD_ADAPTER, `adapter '${name}' is not loaded (loaded: ${this.adapterNames.join(', ') || 'none'})`);
    }
    const seq = this.#seqs.open(name, prompt, mask);
    if (name !== undefined) this.#plans.record(name, prompt.length);
    // Prompt scoring (`promptLogitChunks`) runs its own program over the whole prompt: no reuse.
    if (reuse) this.#seqs.reusePrefix(seq);
    return seq;
  }

  /**
   * Gives `seq` its adapter's slot (loading the adapter into one if needed). Resolves false when
   * every slot is held by other running adapters (try again after a step); rejects when the
   * adapter cannot be read.
   */
  async attach(seq: Sequence, signal?: AbortSignal): Promise<boolean> {
    if (!this.#seqs.live.has(seq)) this.#seqs.bad(seq);
    return await this.#adapters.attach(seq, signal);
  }

  /**
   * Logits of every prompt position f32[prompt length, vocab] under `adapter` (prompt
   * log-probabilities: OpenAI `echo` with `logprobs`): {@link Engine.promptLogitChunks} gathered.
   */
  async promptLogits(adapter: string | null | undefined, prompt: readonly number[], mask?: readonly number[]): Promise<HostTensor> {
    const V = this.config.vocabSize;
    const data = new Float32Array(prompt.length * V);
    for await (const c of this.promptLogitChunks(adapter, prompt, mask)) data.set(c.logits, c.start * V);
    return { dtype: 'f32', shape: [prompt.length, V], data };
  }

  /**
   * The logits of every prompt position under `adapter`, chunk by chunk: each yield is the
   * logits f32[count × vocab] of positions [start, start + count). Runs a scoring program — the
   * slot program with logits at every position, prepared on first use (one more preparation for
   * the engine's life) and fed the same weights and slot tables — over chunks of at most `chunk`
   * tokens (default 4 × `prefillChunk`), each chunk attending to the keys and values the earlier
   * chunks produced, and yields to the event loop between chunks: a long prompt never holds the
   * process for one long run. An executor that keeps the new keys and values to itself scores the
   * prompt in one run. With weights held by the program it is `ENGINE_BAD_OPTIONS`.
   */
  async *promptLogitChunks(adapter: string | null | undefined, prompt: readonly number[], mask?: readonly number[], opts: { readonly chunk?: number } = {}): AsyncGenerator<{ readonly start: number; readonly logits: Float32Array }> {
    this.#runner.checkLive();
    this.#scorer.check();
    const chunk = positiveInt('chunk', opts.chunk ?? 4 * this.#prefillChunk, 1);
    const seq = this.open(adapter, prompt, mask, false);
    try {
      const lane = this.#adapters.laneOf(seq);
      if (!(await this.attach(seq))) throw new PeftError(PeftCode.CACHE_FULL, 'every adapter slot is held by running adapters; retry when a request finishes');
      yield* this.#scorer.score(seq, this.#seqs.check(seq), lane, chunk);
    } finally {
      this.release(seq);
    }
  }

  /**
   * Releases every program (and the scoring program) on the executor and every live sequence;
   * later steps fail with `ENGINE_BAD_OPTIONS`. Idempotent.
   */
  dispose(): void {
    if (this.#runner.disposed) return;
    this.#runner.disposed = true;
    for (const s of [...this.#seqs.live]) this.release(s);
    this.#seqs.prefix?.clear();
    this.#runner.dispose();
    this.#scorer.dispose();
  }

  /** Ends a sequence: frees its KV memory and its hold on the adapter's slot. Idempotent. */
  release(seq: Sequence): void {
    this.#seqs.release(seq);
  }

  /**
   * Tokens the next prefill chunk of `seq` takes: at most `maxChunk` (default `prefillChunk`; a
   * scheduler with no stream to stall may allow more), 0 once prefilled. A longrope model's prompt
   * longer than `original_max_position_embeddings` is one chunk (`longropeWholePrompt`).
   */
  chunkOf(seq: Sequence, maxChunk?: number): number {
    return this.#steps.chunkOf(seq, maxChunk);
  }

  /** Whether the next prefill run of `seq` (with `maxChunk`, as `chunkOf`) finishes its prompt. */
  finishesPrefill(seq: Sequence, maxChunk?: number): boolean {
    return seq.prefilled < seq.prompt.length && this.chunkOf(seq, maxChunk) === seq.prompt.length - seq.prefilled;
  }

  /**
   * Prefills the next chunk (at most `prefillChunk` tokens) of `seq`'s prompt, appending its keys
   * and values in place. Resolves to the last position's logits f32[vocab] when the prompt is done,
   * otherwise undefined.
   */
  async prefill(seq: Sequence, opts: PrefillOptions = {}): Promise<Float32Array | undefined> {
    return (await this.prefillMany([seq], opts))[0];
  }

  /**
   * Prefills the next chunk of every sequence in `seqs` in as few runs as lanes allow (one run for
   * all plain-slot adapters and the base, however their adapters mix): rows are left-padded to the
   * longest chunk with masked positions (so every row's last position is its own last token), and
   * several rows' cached prefixes are staged as a decode step's are. Appends each row's own
   * positions only. Resolves, per sequence, to its last position's logits when its prompt is done,
   * otherwise undefined.
   */
  async prefillMany(seqs: readonly Sequence[], opts: PrefillOptions = {}): Promise<(Float32Array | undefined)[]> {
    return (await this.#steps.prefill(seqs, opts, 'logits')) as (Float32Array | undefined)[];
  }

  /**
   * `prefillMany`, resolving per sequence whose prompt is done to its first token drawn as
   * `rows[i]` says (as `decodeSample`: on the executor with `executorPicks`, else from the logits
   * here; all-greedy runs pick on the executor, `RunOptions.argmax`), otherwise undefined. A row
   * spec of a sequence the run does not finish (`finishesPrefill`) is not used.
   */
  async prefillSample(seqs: readonly Sequence[], rows: readonly RowSample[], opts: PrefillOptions = {}): Promise<(number | undefined)[]> {
    return (await this.#steps.prefill(seqs, opts, rows)) as (number | undefined)[];
  }

  /**
   * One decode step over `seqs` (prefilled, attached), feeding `tokens[i]` to row i: a single row
   * reads its KV buffers as zero-copy views; several rows are staged into reusable buffers (one
   * copy per row and layer, padding masked). Appends each row's new key/value in place and resolves
   * to each row's logits f32[vocab].
   */
  async decode(seqs: readonly Sequence[], tokens: readonly number[]): Promise<Float32Array[]> {
    return (await this.#steps.decode(seqs, tokens, 'logits')) as Float32Array[];
  }

  /**
   * One decode step as `decode`, resolving to each row's greedy token instead of its logits: the
   * index of its largest logit, as `argmaxOf` of @stageml/models picks it (ties the lowest id). An
   * executor whose results cross to the host (the torch worker) then returns one index per row
   * instead of the whole vocabulary's logits (`RunOptions.argmax`).
   */
  async decodeGreedy(seqs: readonly Sequence[], tokens: readonly number[]): Promise<number[]> {
    return (await this.#steps.decode(seqs, tokens, 'greedy')) as number[];
  }

  /**
   * One decode step as `decode`, resolving to each row's token drawn as `rows[i]` says (`RowSample`:
   * temperature 0 the greedy pick, else temperature, top-k, top-p and the draw u, as `samplePick` of
   * @stageml/models draws). With `EngineOptions.executorPicks` (default: the executor's
   * `devicePicks`, the torch worker on CUDA) the executor picks where the logits are and returns one
   * index per row (`RunOptions.sample`); otherwise the engine picks from the logits here, with the
   * same arithmetic. Rows all greedy take `RunOptions.argmax` either way. Bad rows are
   * `ENGINE_BAD_OPTIONS`, before anything runs.
   */
  async decodeSample(seqs: readonly Sequence[], tokens: readonly number[], rows: readonly RowSample[]): Promise<number[]> {
    return (await this.#steps.decode(seqs, tokens, rows)) as number[];
  }

  /**
   * One scheduler step (`StepRecord`: decode rows and prefill chunks) in one call. Where both are
   * present, every row is a plain-slot or base row (no lane), both parts pick alike (rows, or
   * logits) and the padding is within `EngineOptions.stepMergeWaste`, they run as ONE program run:
   * each decode row as a one-token chunk beside the prompt chunks (left-padded to the longest, as
   * a prefill run pads), its token the same as a decode step's. Otherwise the decode rows run, then
   * the prefill chunks (`decodeSample`/`decode`, then `prefillSample`/`prefillMany`). Each part's
   * failure is its own (`StepPart.error`; a merged run's failure is both parts'), and a failed part
   * leaves its sequences as they were.
   */
  async step(record: StepRecord): Promise<StepResult> {
    return this.#steps.step(record, {
      decode: (d) => (d.rows === undefined ? this.decode(d.seqs, d.tokens) : this.decodeSample(d.seqs, d.tokens, d.rows)),
      prefill: (p, opts) => (p.rows === undefined ? this.prefillMany(p.seqs, opts) : this.prefillSample(p.seqs, p.rows, opts)),
    });
  }
}
