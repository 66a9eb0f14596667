import { type HostTensor, StageError, errorMessage, hostTensor } from '@stageml/ir';
import type { LlamaConfig } from '@stageml/models';
import { processLogits, samplePick } from '@stageml/models';
import { type CacheRun, type Executor, type PreparedGraph, type RowSample, type RowsInput, firstMaxIndex, joinRows } from '@stageml/runtime';
import { EngineCode, EngineError } from './errors.js';
import type { ProgramForm } from './options.js';
import { GROUP_SLOT_INPUT, ONE_SLOT_INPUT, ROW_GROUP_INPUT, ROW_MASK_INPUT, ROW_SLOT_INPUT, type SlotForm, TOKEN_SLOT_INPUT, chooseSlotForm } from './slot-linear.js';
import type { SlotTables } from './slots.js';

/**
 * Where an adapter that cannot vary by row runs, in batches of its own: the shared slot programs
 * with its whole-tensor overrides (or the plan's merged copies) in place of the base tensors.
 */
export interface Lane {
  readonly weights: Readonly<Record<string, HostTensor>>;
  readonly bytes: number;
}

/** Per prepared program, one of its results. */
export type Outputs = Map<PreparedGraph, Record<string, HostTensor>>;

/** What a step returns per row: its logits, its greedy token, or a token drawn as each row's spec says. */
export type StepPick = 'logits' | 'greedy' | readonly RowSample[];

/** What a `ProgramRunner` is built from (of `EngineParts`). */
export interface RunnerParts {
  readonly executor: Executor;
  readonly programs: Partial<Record<ProgramForm, PreparedGraph>>;
  /** `EngineParts.outPrograms`: the slot forms with the output tables, prepared on first need. */
  readonly outPrograms?: () => Promise<Partial<Record<ProgramForm, PreparedGraph>>>;
  readonly tables: SlotTables;
  readonly weightInputs: Readonly<Record<string, HostTensor>>;
  readonly baseTakesWeights: boolean;
  readonly recycleOutputs: boolean;
  readonly executorPicks: boolean;
  /** Whether the host keeps each sequence's keys and values (else a resident-KV run omits them). */
  readonly hostKv: boolean;
  /** The programs' new keys and values (`new_*`): the outputs a step omits where the host keeps no KV. */
  readonly kvOutputs: readonly string[];
}

/**
 * Runs the engine's prepared programs: picks the program of a batch (the base program for base
 * rows only, else the slot form for its rows and adapters), feeds it the weights, the slot tables
 * and the slot indices, asks the executor for what the step needs of the logits (argmax, sampled
 * picks) and omits what the host does not keep; counts runs by form and recycles output storage.
 */
export class ProgramRunner {
  readonly executor: Executor;
  readonly programs: Partial<Record<ProgramForm, PreparedGraph>>;
  readonly #tables: SlotTables;
  /** Prepares the slot forms with the output tables (`programs` lack them); undefined: `programs` have them. */
  readonly #prepareOuts: (() => Promise<Partial<Record<ProgramForm, PreparedGraph>>>) | undefined;
  /** Those forms, once asked for (a failed preparation is forgotten, so the next need retries). */
  #outPrograms: Promise<Partial<Record<ProgramForm, PreparedGraph>>> | undefined;
  /** Runs of the forms with the output tables (a row on a slot holding DoRA scales or LoRA biases). */
  outRuns = 0;
  /** The base weights as run inputs (a lane substitutes some of them). */
  readonly weightInputs: Readonly<Record<string, HostTensor>>;
  /**
   * Inputs fed as the same data objects every run (weights, slot tables; slot writes call
   * `inputChanged`): an executor with memory of its own (the torch worker) keeps them between runs.
   */
  readonly resident: ReadonlySet<string>;
  /** Whether the base program reads the weights as inputs (false: it holds its own, `packBase`). */
  readonly #baseTakesWeights: boolean;
  /** `EngineOptions.executorPicks`: sampled picks made by the executor (`RunOptions.sample`). */
  readonly #executorPicks: boolean;
  readonly #hostKv: boolean;
  readonly #kvOutputs: readonly string[];
  /**
   * `EngineOptions.recycleOutputs`: per program, the last result of a finished `decode`/`prefillMany`
   * call, given back to its next run (and taken while that runs). A call's results join it only
   * when the call returns, so no run reuses storage its own call is about to return.
   */
  readonly spare: Outputs | undefined;
  readonly runsByForm: Record<ProgramForm, number> = { gathered: 0, grouped: 0, single: 0, base: 0 };
  /** Program runs so far (scoring runs included). */
  runs = 0;
  /** Programs prepared so far (the scoring program included, once prepared). */
  preparations: number;
  disposed = false;

  constructor(
    p: RunnerParts,
    /** The model config (MoE models take per-token slots). */
    readonly config: LlamaConfig,
  ) {
    this.executor = p.executor;
    this.programs = p.programs;
    this.#tables = p.tables;
    this.#prepareOuts = p.outPrograms;
    this.weightInputs = p.weightInputs;
    this.resident = new Set([...Object.keys(p.weightInputs), ...Object.keys(p.tables.inputs)]);
    this.#baseTakesWeights = p.baseTakesWeights;
    this.#executorPicks = p.executorPicks;
    this.#hostKv = p.hostKv;
    this.#kvOutputs = p.kvOutputs;
    this.spare = p.recycleOutputs ? new Map() : undefined;
    this.preparations = Object.keys(p.programs).length;
  }

  /** `ENGINE_BAD_OPTIONS` once the engine was disposed. */
  checkLive(): void {
    if (this.disposed) throw new EngineError(EngineCode.BAD_OPTIONS, 'the engine was disposed');
  }

  /** MoE models: each token's slot for the expert tables (rows × positions of `input_ids`). */
  tokenSlots(inputs: Record<string, HostTensor>, rowSlots: readonly number[]): void {
    if (this.config.moe === undefined) return;
    const seq = inputs['input_ids']!.shape[1]!;
    inputs[TOKEN_SLOT_INPUT] = hostTensor('i64', [rowSlots.length * seq], rowSlots.flatMap((s) => new Array<number>(seq).fill(s)));
  }

  /**
   * Runs one batch (row r on slot `rowSlots[r]`, every row in `lane` if given) on the program its
   * rows call for; `rows`: inputs given per row (`RunOptions.rows`), joined for a program that
   * does not take them so.
   */
  async run(inputs: Record<string, HostTensor>, rowSlots: readonly number[], lane: Lane | undefined, caches: CacheRun | undefined, produced: Outputs, pick: StepPick = 'logits', rows?: Readonly<Record<string, RowsInput>>): Promise<Record<string, HostTensor>> {
    this.checkLive();
    const programs = this.programs;
    if (programs.base !== undefined && lane === undefined && rowSlots.every((s) => s === 0)) {
      if (this.#baseTakesWeights) Object.assign(inputs, this.weightInputs);
      this.runs++;
      this.runsByForm.base++;
      return this.#runProgram(programs.base, inputs, caches, produced, pick, rows);
    }
    // Rows on slots with output-table rows need the forms that read them; the others run without.
    const outs = this.#prepareOuts !== undefined && this.#tables.hasOuts(rowSlots) ? await this.outTables() : undefined;
    Object.assign(inputs, this.#prepareOuts === undefined || outs !== undefined ? this.#tables.inputs : this.#tables.factorInputs, lane?.weights ?? this.weightInputs);
    const groups = [...new Set(rowSlots.filter((s) => s !== 0))];
    const form = this.#formFor(rowSlots.length, groups.length);
    this.tokenSlots(inputs, rowSlots);
    if (form === 'single') {
      inputs[ONE_SLOT_INPUT] = hostTensor('i64', [], [groups[0]!]);
      inputs[ROW_MASK_INPUT] = { dtype: 'f32', shape: [rowSlots.length, 1, 1], data: Float32Array.from(rowSlots, (s) => (s === 0 ? 0 : 1)) };
    } else if (form === 'gathered') inputs[ROW_SLOT_INPUT] = hostTensor('i64', [rowSlots.length], rowSlots);
    else {
      if (groups.length === 0) groups.push(0);
      const onehot = new Float32Array(rowSlots.length * groups.length);
      rowSlots.forEach((s, r) => {
        if (s !== 0) onehot[r * groups.length + groups.indexOf(s)] = 1;
      });
      inputs[GROUP_SLOT_INPUT] = hostTensor('i64', [groups.length], groups);
      inputs[ROW_GROUP_INPUT] = { dtype: 'f32', shape: [rowSlots.length, groups.length], data: onehot };
    }
    this.runs++;
    this.runsByForm[form]++;
    if (outs !== undefined) this.outRuns++;
    return this.#runProgram((outs ?? programs)[form]!, inputs, caches, produced, pick, rows);
  }

  /**
   * The slot forms that read the output tables (DoRA scales, LoRA biases): `programs` where they
   * have them, else prepared on the first call (the engine asks when an adapter with such rows
   * loads, so no step waits for it). A failed preparation is `ENGINE_RUN_FAILED` and is retried
   * by the next call.
   */
  outTables(): Promise<Partial<Record<ProgramForm, PreparedGraph>>> {
    if (this.#prepareOuts === undefined) return Promise.resolve(this.programs);
    if (this.#outPrograms === undefined) {
      const made = this.#prepareOuts().then(
        (out) => {
          this.preparations += Object.keys(out).length;
          return out;
        },
        (e: unknown) => {
          this.#outPrograms = undefined;
          if (e instanceof StageError) throw e;
          throw new EngineError(EngineCode.RUN_FAILED, `preparing the programs with the DoRA/bias output tables failed: ${errorMessage(e)}`, { cause: e });
        },
      );
      this.#outPrograms = made;
    }
    return this.#outPrograms;
  }

  /** Runs `program`, recycling its last finished call's result when recycling outputs; the result goes to `produced`. */
  async #runProgram(program: PreparedGraph, given: Readonly<Record<string, HostTensor>>, caches: CacheRun | undefined, produced: Outputs, pick: StepPick = 'logits', givenRows?: Readonly<Record<string, RowsInput>>): Promise<Record<string, HostTensor>> {
    // Device slot writes go before the run on the worker's queue; a failed one fails the run.
    await this.#tables.settled();
    const { inputs, rows } = rowsFor(program, given, givenRows);
    // A pick of greedy rows only (no processing) is an argmax, which every executor whose results cross makes.
    const greedy = pick === 'greedy' || (typeof pick === 'object' && pick.every((r) => r.temperature === 0 && r.processing === undefined));
    const argmax = greedy ? GREEDY_OUTPUTS : undefined;
    const sample = typeof pick === 'object' && !greedy && this.#executorPicks ? { logits: pick } : undefined;
    // The executor's caches append the new keys and values; without a host copy they need not come back.
    const omit = caches !== undefined && !this.#hostKv ? this.#kvOutputs : undefined;
    const spare = this.spare;
    if (spare === undefined) return runProgram(program, inputs, this.resident, caches, undefined, argmax, omit, sample, rows);
    // Taken while the run is in flight: a concurrent run of the same program allocates.
    const recycle = spare.get(program);
    spare.delete(program);
    const out = await runProgram(program, inputs, this.resident, caches, recycle, argmax, omit, sample, rows);
    produced.set(program, out);
    return out;
  }

  /** A finished call's results become the storage its programs' next runs write into. */
  keep(produced: Outputs): void {
    if (this.spare === undefined || this.disposed) return;
    for (const [program, out] of produced) this.spare.set(program, out);
  }

  /** The slot form of a step of `rows` rows over `groups` distinct adapters, among the prepared ones. */
  #formFor(rows: number, groups: number): SlotForm {
    const p = this.programs;
    if (p.single !== undefined && groups === 1) return 'single';
    return p.grouped === undefined ? 'gathered' : p.gathered === undefined ? 'grouped' : chooseSlotForm(rows, groups);
  }

  /** Marks the runner disposed and releases every prepared program and the recycled outputs. */
  dispose(): void {
    this.disposed = true;
    for (const p of Object.values(this.programs)) p.dispose();
    void this.#outPrograms?.then((o) => { for (const p of Object.values(o)) p.dispose(); }, () => undefined);
    this.spare?.clear();
  }
}

/** What a greedy decode step needs of its logits: each row's largest (`RunOptions.argmax`). */
const GREEDY_OUTPUTS: readonly string[] = ['logits'];

/**
 * The inputs of a run of `program` given `rows` (inputs per row): passed per row where the program
 * takes every one of them so (`PreparedGraph.rowInputs`), else joined into `inputs` (one copy).
 */
export function rowsFor(program: PreparedGraph, inputs: Readonly<Record<string, HostTensor>>, rows: Readonly<Record<string, RowsInput>> | undefined): { inputs: Readonly<Record<string, HostTensor>>; rows: Readonly<Record<string, RowsInput>> | undefined } {
  if (rows === undefined) return { inputs, rows };
  const names = Object.keys(rows);
  if (names.length === 0) return { inputs, rows: undefined };
  const takes = program.rowInputs;
  if (takes !== undefined && names.every((n) => takes.has(n))) return { inputs, rows };
  const joined: Record<string, HostTensor> = { ...inputs };
  for (const n of names) joined[n] = joinRows(rows[n]!);
  return { inputs: joined, rows: undefined };
}

/** Runs a prepared program; a foreign failure becomes `ENGINE_RUN_FAILED` (coded errors pass through). */
export async function runProgram(program: PreparedGraph, inputs: Readonly<Record<string, HostTensor>>, resident: ReadonlySet<string>, caches?: CacheRun, recycle?: Readonly<Record<string, HostTensor>>, argmax?: readonly string[], omit?: readonly string[], sample?: Readonly<Record<string, readonly RowSample[]>>, rows?: Readonly<Record<string, RowsInput>>): Promise<Record<string, HostTensor>> {
  try {
    return await program.run(inputs, { resident, ...(caches === undefined ? {} : { caches }), ...(recycle === undefined ? {} : { recycle }), ...(argmax === undefined ? {} : { argmax }), ...(omit === undefined ? {} : { omit }), ...(sample === undefined ? {} : { sample }), ...(rows === undefined ? {} : { rows }) });
  } catch (e) {
    if (e instanceof StageError) throw e;
    throw new EngineError(EngineCode.RUN_FAILED, `running the model failed: ${errorMessage(e)}`, { cause: e });
  }
}

/**
 * Per row of a step run with `RunOptions.sample`, its token: the executor's own pick (an i64
 * tensor), or drawn here from the row's logits as the executor would (`samplePick`; greedy rows the
 * argmax rule).
 */
export function pickRows(t: HostTensor, rows: readonly RowSample[]): number[] {
  if (t.dtype === 'i64') return Array.from(t.data);
  const n = t.shape[t.shape.length - 1]!;
  return rows.map((r, i) => {
    const raw = t.data.subarray(i * n, (i + 1) * n);
    const row = r.processing === undefined ? raw : processLogits(raw, r.processing);
    return r.temperature === 0 ? firstMaxIndex(row) : samplePick(row, r.temperature, r.topK, r.topP, r.u);
  });
}
