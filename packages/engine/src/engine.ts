import { type Graph, type HostTensor, StageError, dtypeBytes, errorMessage, exactIn, graphParams, hostTensor, roundFloat32InPlace, rounderFor } from '@stageml/ir';
import { type LlamaConfig, ModelCode, ModelError, type TextTokenizer, loadTokenizer, processLogits, readLlamaConfig, readParam, samplePick } from '@stageml/models';
import { AdapterCache, type LoraAdapter, PeftCode, PeftError, checkAdapterAgainstBase, loadLoraAdapter } from '@stageml/peft';
import { CacheLostError, type CacheRun, RuntimeCode, type CacheStore, type CacheStream, type Executor, type FileTensorRef, type PreparedGraph, type TorchDeviceTensors, type RowSample, type SchedulingHints, CPU_SCHEDULING, argmaxRows, checkRowSamples, firstMaxIndex, interpreterExecutor, quantizeLinears } from '@stageml/runtime';
import { type Checkpoint, openCheckpoint } from '@stageml/safetensors';
import { ENGINE_ADAPTER_DTYPES, ENGINE_DTYPES, type EngineAdapterDType, type EngineDType, castEngineGraph, castTensor, tensorBytes } from './dtype.js';
import { EngineCode, EngineError } from './errors.js';
import { expertSlotFactors } from './experts.js';
import { type SlotOut, laneTokenWeights, loadSlotOuts, mergedModule } from './adapter-kinds.js';
import { engineGraph, paramsToInputs } from './graph.js';
import { DecodeStaging, MASKED, SequenceKv, Staging } from './kv.js';
import { type EngineMemory, type EngineOptions, type EnginePlan, type EngineStats, type PrefillOptions, type ProgramForm, type StepDecode, type StepPart, type StepPrefill, type StepRecord, type StepResult, positiveInt } from './options.js';
import { GROUP_SLOT_INPUT, ONE_SLOT_INPUT, ROW_GROUP_INPUT, ROW_MASK_INPUT, ROW_SLOT_INPUT, type SlotForm, type SlotModule, TOKEN_SLOT_INPUT, chooseSlotForm } from './slot-linear.js';
import { type AppliedPlan, appliedPlan, mergedWeight, planMerges, withoutModules } from './plan.js';
import { Sequence, type SlotEntry } from './sequence.js';
import { windowedQueries } from './masks.js';
import { PrefixCache, adapterReachesKv, prefixCacheOf } from './prefix-cache.js';
import { type ChunkRow, chunkInputs, decodeAttention, prefillInputs, stagePast } from './steps.js';
import { type ExpertSlotFactors, type SlotSource, SlotTables } from './slots.js';
import { type ProgramReport, type StagedPrograms, foldProgram, isWeightParam, stageEnginePrograms, stageProgram } from './stage-program.js';
import { type Plan, TrafficCounter, checkPlan, validatePlanDocument } from '@stageml/planner';

const BASE = '__base__';

/**
 * Where an adapter that cannot vary by row runs, in batches of its own: the shared slot programs
 * with its whole-tensor overrides (or the plan's merged copies) in place of the base tensors.
 */
interface Lane {
  readonly weights: Readonly<Record<string, HostTensor>>;
  readonly bytes: number;
}

/** An adapter with its factors' shapes only (what planning needs), so planning keeps no factor data. */
function shapeOnly(a: LoraAdapter): LoraAdapter {
  const empty = new Float32Array(0);
  return { ...a, modules: new Map([...a.modules].map(([k, m]) => [k, { ...m, A: { ...m.A, data: empty }, B: { ...m.B, data: empty } }])), overrides: new Map(), parameterFactors: [], tokenRows: [] };
}




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
 */
export class Engine {
  readonly #executor: Executor;
  readonly #programs: Partial<Record<ProgramForm, PreparedGraph>>;
  /** Per prepared program, where it came from (the staging pipeline's report). */
  readonly #reports: Map<string, ProgramReport>;
  /** Host values of the weights partial evaluation folds (to stage the scoring program later). */
  readonly #foldSources: ReadonlyMap<string, HostTensor>;
  readonly #runsByForm: Record<ProgramForm, number> = { gathered: 0, grouped: 0, single: 0, base: 0 };
  readonly #tables: SlotTables;
  readonly #shapes: Map<string, readonly number[]>;
  readonly #weightBytes: number;
  /** The part of `#weightBytes` the executor read and holds on its device only (`deviceWeights`). */
  readonly #deviceWeightBytes: number;
  /** Whether the host holds the weights' values (false with `deviceWeights`: lanes cannot be built). */
  readonly #hostWeights: boolean;
  readonly #registered = new Map<string, string>();
  readonly #fresh = new Map<string, LoraAdapter>();
  readonly #host: AdapterCache<LoraAdapter>;
  readonly #slotCache: AdapterCache<SlotEntry>;
  readonly #staging: Staging;
  readonly #decodeStaging: DecodeStaging;
  readonly #live = new Set<Sequence>();
  readonly #prefillChunk: number;
  readonly #kvShape: readonly [number, number];
  readonly #weightInputs: Readonly<Record<string, HostTensor>>;
  /**
   * Inputs fed as the same data objects every run (weights, slot tables; slot writes call
   * `inputChanged`): an executor with memory of its own (the torch worker) keeps them between runs.
   */
  readonly #resident: ReadonlySet<string>;
  readonly #lanes = new Map<string, Lane>();
  readonly #rank: number;
  readonly #slots: number;
  readonly #memoryBudget: number | undefined;
  readonly #fixedPlan: Plan | undefined;
  /** Whether plans are applied at all (a budget to plan under, or a fixed plan). */
  readonly #planning: boolean;
  readonly #replanEvery: number;
  readonly #traffic = new TrafficCounter();
  readonly #entries = new Map<string, SlotEntry>();
  readonly #shapesOf = new Map<string, LoraAdapter>();
  #applied: AppliedPlan = { plan: undefined, merged: new Map() };
  #plansApplied = 0;
  #planDirty = false;
  #runsAtPlan = 0;
  #preparations: number;
  /** Whether the base program reads the weights as inputs (false: it holds its own, `packBase`). */
  readonly #baseTakesWeights: boolean;
  /** Whether every base weight is an input of the slot programs (f32 `weights: 'inputs'`): lanes, merges and scoring need it. */
  readonly #allWeightInputs: boolean;
  #scoring: Promise<PreparedGraph> | undefined;
  #runs = 0;
  #steps = 0;
  #mergedSteps = 0;
  readonly #mergeWaste: number;
  #rebuilds = 0;
  #workerRetries = 0;
  #disposed = false;
  readonly #expertCache = new WeakMap<LoraAdapter, ExpertSlotFactors[]>();
  /** Per loaded adapter, its modules' output-table rows (LoRA bias, DoRA scale), computed once at load. */
  readonly #outs = new Map<string, ReadonlyMap<string, SlotOut>>();
  readonly #dtype: EngineDType;
  readonly #adapterDtype: EngineAdapterDType;
  /** The executor's caches when sequences' KV lives there (`EngineOptions.residentKv`). */
  readonly #caches: CacheStore | undefined;
  /**
   * Whether the host holds each sequence's keys and values: host-fed KV, or resident KV with
   * `hostKvCopy`. Otherwise the executor's cache is the only copy: steps omit the new keys and
   * values from their results, and a lost cache is rebuilt from the sequence's tokens (`#history`).
   */
  readonly #hostKv: boolean;
  /** `EngineOptions.executorPicks`: sampled picks made by the executor (`RunOptions.sample`). */
  readonly #executorPicks: boolean;
  /** Per sequence, the tokens its decode steps appended (after its prefilled prompt): what a rebuild prefills again. */
  readonly #history = new WeakMap<Sequence, number[]>();
  /**
   * `EngineOptions.recycleOutputs`: per program, the last result of a finished `decode`/`prefillMany`
   * call, given back to its next run (and taken while that runs). A call's results join it only
   * when the call returns, so no run reuses storage its own call is about to return.
   */
  readonly #spare: Outputs | undefined;
  /** The cache streams of every program: each layer's keys and values (appended from `new_*`), the key mask (from the run's tail). */
  readonly #streams: readonly CacheStream[];
  /** The programs' new keys and values (`new_*`): the outputs a step omits where the host keeps no KV. */
  readonly #kvOutputs: readonly string[];
  /** The automatic prefix cache (`EngineOptions.prefixCaching`), or undefined where it is off. */
  readonly #prefix: PrefixCache | undefined;
  /** Per loaded adapter, its part of prefix cache keys: '' where it reaches no K/V (it shares the base's blocks), else its name and load version. */
  readonly #prefixKeys = new Map<string, string>();
  #adapterLoads = 0;

  private constructor(
    /** The model directory. */
    readonly dir: string,
    /** The parsed config. */
    readonly config: LlamaConfig,
    /** The tokenizer, when the directory has one. */
    readonly tokenizer: TextTokenizer | undefined,
    parts: { executor: Executor; programs: Partial<Record<ProgramForm, PreparedGraph>>; tables: SlotTables; shapes: Map<string, readonly number[]>; weightBytes: number; deviceWeightBytes: number; hostWeights: boolean; maxCpuLoras: number; prefillChunk: number; weightInputs: Readonly<Record<string, HostTensor>>; allWeightInputs: boolean; baseTakesWeights: boolean; memoryBudget: number | undefined; replanEvery: number; fixedPlan: Plan | undefined; dtype: EngineDType; adapterDtype: EngineAdapterDType; caches: CacheStore | undefined; hostKvCopy: boolean; recycleOutputs: boolean; executorPicks: boolean; mergeWaste: number; staging: StagedPrograms; prefix: PrefixCache | undefined },
  ) {
    this.#dtype = parts.dtype;
    this.#adapterDtype = parts.adapterDtype;
    this.#caches = parts.caches;
    this.#hostKv = parts.caches === undefined || parts.hostKvCopy;
    this.#executorPicks = parts.executorPicks;
    this.#mergeWaste = parts.mergeWaste;
    this.#prefix = parts.prefix;
    this.#spare = parts.recycleOutputs ? new Map() : undefined;
    const streams: CacheStream[] = [];
    for (let l = 0; l < config.numLayers; l++) {
      for (const kv of ['key', 'value']) streams.push({ input: `past_${kv}.${String(l)}`, from: `new_${kv}.${String(l)}`, pad: 0 });
    }
    streams.push({ input: 'attention_mask', from: undefined, pad: MASKED });
    this.#streams = streams;
    this.#kvOutputs = streams.flatMap((st) => (st.from === undefined ? [] : [st.from]));
    this.#weightInputs = parts.weightInputs;
    this.#baseTakesWeights = parts.baseTakesWeights;
    this.#allWeightInputs = parts.allWeightInputs;
    this.#resident = new Set([...Object.keys(parts.weightInputs), ...Object.keys(parts.tables.inputs)]);
    this.#rank = parts.tables.rank;
    this.#memoryBudget = parts.memoryBudget;
    this.#fixedPlan = parts.fixedPlan;
    this.#planning = parts.memoryBudget !== undefined || parts.fixedPlan !== undefined;
    this.#replanEvery = parts.replanEvery;
    this.#slots = parts.tables.slots;
    this.#executor = parts.executor;
    this.#programs = parts.programs;
    this.#reports = new Map(parts.staging.staged.map((st) => [st.report.form, st.report]));
    this.#foldSources = parts.staging.foldSources;
    this.#tables = parts.tables;
    this.#shapes = parts.shapes;
    this.#weightBytes = parts.weightBytes;
    this.#deviceWeightBytes = parts.deviceWeightBytes;
    this.#hostWeights = parts.hostWeights;
    this.#preparations = Object.keys(parts.programs).length;
    this.#prefillChunk = parts.prefillChunk;
    this.#staging = new Staging(config.numLayers);
    this.#decodeStaging = new DecodeStaging(config.numLayers, config.numKvHeads * config.headDim);
    this.#kvShape = [config.numKvHeads, config.headDim];
    this.#host = new AdapterCache<LoraAdapter>({
      budgetBytes: parts.maxCpuLoras,
      load: async (name) => {
        const fresh = this.#fresh.get(name);
        if (fresh !== undefined) return { value: fresh, bytes: 1 };
        const dir = this.#registered.get(name);
        if (dir === undefined) throw new EngineError(EngineCode.UNKNOWN_ADAPTER, `adapter '${name}' is not loaded`);
        return { value: this.#validate(await loadLoraAdapter(dir, { name })), bytes: 1 };
      },
    });
    const slotBytes = this.#tables.bytes / this.#tables.slots;
    this.#slotCache = new AdapterCache<SlotEntry>({
      budgetBytes: slotBytes * (this.#tables.slots - 1),
      load: async (name) => {
        const lease = await this.#host.acquire(name);
        lease.release();
        return { value: { adapter: lease.value, slot: undefined }, bytes: slotBytes };
      },
      dispose: (name, entry) => {
        if (entry.slot !== undefined) this.#tables.free(entry.slot);
        entry.slot = undefined;
        if (this.#entries.get(name) === entry) this.#entries.delete(name);
      },
    });
  }

  /**
   * Loads `config.json`, the checkpoint and the tokenizer from `dir`, builds the slot program and
   * prepares it once on the executor with the base weights (missing or wrongly shaped tensors are
   * `MODEL_BAD_WEIGHT` naming file and key).
   */
  static async load(dir: string, opts: EngineOptions = {}): Promise<Engine> {
    const maxLoras = positiveInt('maxLoras', opts.maxLoras, 16);
    const rank = positiveInt('maxLoraRank', opts.maxLoraRank, 64);
    const deviceStore = deviceTensorsOf(opts.executor ?? interpreterExecutor);
    const hostNeeds = opts.weights === 'program' ? "weights: 'program'" : opts.quantize !== undefined ? 'quantize' : opts.packBase === true ? 'packBase' : opts.memoryBudget !== undefined ? 'memoryBudget' : opts.plan !== undefined ? 'a plan' : undefined;
    if (opts.deviceWeights !== undefined && typeof opts.deviceWeights !== 'boolean') throw new EngineError(EngineCode.BAD_OPTIONS, `deviceWeights must be true or false, got ${String(opts.deviceWeights)}`);
    if (opts.deviceWeights === true && deviceStore === undefined) throw new EngineError(EngineCode.BAD_OPTIONS, `deviceWeights needs an executor with device tensors (the torch executor); '${(opts.executor ?? interpreterExecutor).name}' has none`);
    if (opts.deviceWeights === true && hostNeeds !== undefined) throw new EngineError(EngineCode.BAD_OPTIONS, `deviceWeights keeps the weights off the host; ${hostNeeds} needs their values there`);
    const onDevice = opts.deviceWeights ?? (deviceStore !== undefined && hostNeeds === undefined) ? deviceStore : undefined;
    const maxCpuLoras = positiveInt('maxCpuLoras', opts.maxCpuLoras, onDevice === undefined ? maxLoras : 1);
    const prefillChunk = positiveInt('prefillChunk', opts.prefillChunk, 32);
    const replanEvery = positiveInt('replanEvery', opts.replanEvery, 512);
    const prefix = prefixCacheOf(opts.prefixCaching);
    const mergeWaste = opts.stepMergeWaste ?? 0.25;
    if (!(typeof mergeWaste === 'number' && Number.isFinite(mergeWaste) && mergeWaste >= 0)) throw new EngineError(EngineCode.BAD_OPTIONS, `stepMergeWaste must be a finite number ≥ 0, got ${String(opts.stepMergeWaste)}`);
    const memoryBudget = opts.memoryBudget;
    if (memoryBudget !== undefined && !(Number.isFinite(memoryBudget) && memoryBudget >= 0)) throw new EngineError(EngineCode.BAD_OPTIONS, `memoryBudget must be a number of bytes ≥ 0, got ${String(memoryBudget)}`);
    if (memoryBudget !== undefined && (opts.weights === 'program' || opts.quantize !== undefined)) throw new EngineError(EngineCode.BAD_OPTIONS, "memoryBudget (plans with merged copies) needs weights: 'inputs' (and no quantize)");
    let fixedPlan: Plan | undefined;
    if (opts.plan !== undefined) {
      if (memoryBudget !== undefined) throw new EngineError(EngineCode.BAD_OPTIONS, 'give a memoryBudget to plan under or a fixed plan, not both');
      if (opts.weights === 'program' || opts.quantize !== undefined) throw new EngineError(EngineCode.BAD_OPTIONS, "a plan (merged copies) needs weights: 'inputs' (and no quantize)");
      fixedPlan = checkPlan(opts.plan);
      validatePlanDocument(fixedPlan);
    }
    if (opts.quantize !== undefined && opts.weights === 'inputs') throw new EngineError(EngineCode.BAD_OPTIONS, "quantize packs the weights into the programs: it needs weights: 'program'");
    const wantDtype = opts.dtype ?? 'f32';
    if (!(ENGINE_DTYPES as readonly string[]).includes(wantDtype) && wantDtype !== 'checkpoint') throw new EngineError(EngineCode.BAD_OPTIONS, `dtype must be one of ${ENGINE_DTYPES.join(', ')} or checkpoint, got '${wantDtype as string}'`);
    const adapterDtype = opts.adapterDtype ?? 'f32';
    if (!(ENGINE_ADAPTER_DTYPES as readonly string[]).includes(adapterDtype)) throw new EngineError(EngineCode.BAD_OPTIONS, `adapterDtype must be one of ${ENGINE_ADAPTER_DTYPES.join(', ')}, got '${adapterDtype as string}'`);
    const config = await readLlamaConfig(dir);
    const executorOpt = opts.executor ?? interpreterExecutor;
    if (opts.residentKv === true && executorOpt.caches === undefined) throw new EngineError(EngineCode.BAD_OPTIONS, `residentKv needs an executor that holds caches (the torch executor); '${executorOpt.name}' does not`);
    if (opts.residentKv === true && config.slidingWindow !== undefined) throw new EngineError(EngineCode.BAD_OPTIONS, 'residentKv: a sliding-window model builds its per-query masks on the host (give residentKv false or leave it out)');
    const caches = opts.residentKv === false || config.slidingWindow !== undefined ? undefined : executorOpt.caches;
    if (opts.hostKvCopy !== undefined && typeof opts.hostKvCopy !== 'boolean') throw new EngineError(EngineCode.BAD_OPTIONS, `hostKvCopy must be true or false, got ${String(opts.hostKvCopy)}`);
    if (opts.executorPicks !== undefined && typeof opts.executorPicks !== 'boolean') throw new EngineError(EngineCode.BAD_OPTIONS, `executorPicks must be true or false, got ${String(opts.executorPicks)}`);
    const modules: SlotModule[] = [];
    if (opts.slotForm !== undefined && !['auto', 'gathered', 'grouped'].includes(opts.slotForm)) throw new EngineError(EngineCode.BAD_OPTIONS, `slotForm must be 'auto', 'gathered' or 'grouped' ('single' alone cannot serve two adapters in a batch; 'auto' includes it), got '${opts.slotForm as string}'`);
    const autoForms: ProgramForm[] = ['gathered', 'grouped', 'single'];
    const slotForms: ProgramForm[] = opts.slotForm === undefined || opts.slotForm === 'auto' ? autoForms : [opts.slotForm];
    // Base-only batches run a program without slot tables (the slot path costs a base row as much
    // as an adapter row) — except where each program holds its own f32 copy of the weights.
    if (opts.packBase !== undefined && typeof opts.packBase !== 'boolean') throw new EngineError(EngineCode.BAD_OPTIONS, `packBase must be true or false, got ${String(opts.packBase)}`);
    const packBase = opts.packBase === true;
    const withBase = packBase || opts.quantize !== undefined || (opts.weights ?? 'inputs') === 'inputs';
    const forms: ProgramForm[] = withBase ? [...slotForms, 'base'] : slotForms;
    // A tied model whose weights are inputs reads its head as `lm_head.weight` (the embedding's
    // tensor, not a copy), so a lane can replace the head alone.
    const separateHead = config.tieWordEmbeddings && opts.quantize === undefined && (opts.weights ?? 'inputs') === 'inputs';
    const graphs32 = forms.map((f, i) => engineGraph(config, f, maxLoras + 1, rank, i === 0 ? modules : [], { separateHead }));
    const graph = graphs32[0]!;
    const executor = executorOpt;
    const ckpt = await openCheckpoint(dir);
    const weights = new Map<string, HostTensor>();
    const shapes = new Map<string, readonly number[]>();
    let weightBytes = 0;
    let deviceWeightBytes = 0;
    let dtype: EngineDType;
    let staging: StagedPrograms;
    try {
      dtype = wantDtype === 'checkpoint' ? storedDType(ckpt, dir) : wantDtype;
      if (dtype !== 'f32') {
        const runs = executor.capabilities.dtypes ?? ['f32'];
        if (!runs.includes(dtype)) throw new EngineError(EngineCode.UNSUPPORTED_DTYPE, `the executor '${executor.name}' cannot run ${dtype} programs (it runs ${runs.join(', ')})`, { hint: 'use --executor torch (or interpreter), or --dtype f32' });
        if (opts.quantize !== undefined) throw new EngineError(EngineCode.BAD_OPTIONS, `quantize packs f32 weights: it needs dtype f32, not ${dtype}`);
      }
      const refs: { name: string; ref: FileTensorRef }[] = [];
      for (const p of graphParams(graph)) {
        if (separateHead && p.name === 'lm_head.weight') continue;
        const want = graph.values[p.results[0]!]!.type.shape as number[];
        const info = onDevice !== undefined && ckpt.has(p.name) ? ckpt.info(p.name) : undefined;
        if (info !== undefined && SAFETENSORS_FLOATS[info.dtype] !== undefined && info.shape.length === want.length && info.shape.every((d, i) => d === want[i])) {
          // Read by the worker itself, from the file: no host copy.
          refs.push({ name: p.name, ref: { file: ckpt.fileOf(p.name), tensor: p.name, dtype, shape: want } });
          shapes.set(p.name, want);
          continue;
        }
        const t = await readParam(ckpt, dir, p.name, want);
        // A tensor stored in the compute dtype (a bf16 checkpoint served in bf16) is exact: rounding
        // it would be the identity, so it is skipped; anything else rounds in place.
        const stored = ckpt.has(p.name) ? SAFETENSORS_FLOATS[ckpt.info(p.name).dtype] : undefined;
        const held = dtype === 'f32' ? t : stored !== undefined && exactIn(stored, dtype) ? { dtype, shape: t.shape, data: t.data } : roundInPlace(t, dtype);
        weights.set(p.name, held);
        shapes.set(p.name, t.shape);
        weightBytes += tensorBytes(held);
      }
      if (refs.length > 0) {
        try {
          const handles = await onDevice!.load(refs.map((r) => r.ref));
          refs.forEach((r, i) => weights.set(r.name, handles[i]!));
        } catch (e) {
          if (e instanceof StageError) throw new EngineError(EngineCode.RUN_FAILED, `the executor could not read the weights of '${dir}' itself: ${errorMessage(e)}`, { cause: e });
          throw e;
        }
        deviceWeightBytes = refs.reduce((a, r) => a + r.ref.shape.reduce((x, y) => x * y, 1) * dtypeBytes(dtype), 0);
        weightBytes += deviceWeightBytes;
      }
      if (separateHead) {
        weights.set('lm_head.weight', weights.get('model.embed_tokens.weight')!);
        shapes.set('lm_head.weight', shapes.get('model.embed_tokens.weight')!);
      }
      // The programs are the staging pipeline's residuals (stage-program.ts): weights folding reads
      // come from the host copy, or from the checkpoint when the weights live on the device.
      const onHost = new Set(refs.map((r) => r.name));
      const cast = dtype;
      staging = await stageEnginePrograms(cast === 'f32' ? graphs32 : graphs32.map((g) => castProgram(g, cast, adapterDtype)), forms, async (n) => {
        if (!onHost.has(n)) return weights.get(n)!;
        const t = await readParam(ckpt, dir, n, shapes.get(n) as number[]);
        return cast === 'f32' ? t : roundInPlace(t, cast);
      });
      // Weights read only by folded values are not inputs of any residual.
      for (const [n, t] of [...weights]) {
        if (staging.weightNames.has(n)) continue;
        weights.delete(n);
        if (!onHost.has(n)) weightBytes -= tensorBytes(t);
      }
    } finally {
      await ckpt.close();
    }
    const residuals = staging.staged.map((st) => st.residual);
    const asInputs = opts.quantize === undefined && (opts.weights ?? 'inputs') === 'inputs';
    const programs: Partial<Record<ProgramForm, PreparedGraph>> = {};
    // One cache for every program, so each weight is packed once and the packed copy is shared.
    const quantize = opts.quantize === undefined ? undefined : 'bits' in opts.quantize ? { spec: opts.quantize, cache: new WeakMap() } : { ...opts.quantize, cache: opts.quantize.cache ?? new WeakMap() };
    const oneCopy = weightBytes;
    let copies = 0;
    const shared = new Map<string, HostTensor>();
    for (const [i, f] of forms.entries()) {
      // The base program takes the weights as parameters (its own, pre-packed copy) with packBase.
      const st = staging.staged[i]!;
      const folded = staging.folded[i]!;
      if (asInputs && !(packBase && f === 'base')) programs[f] = await executor.prepare(paramsToInputs(residuals[i]!, (n) => isWeightParam(st, n)), { get: (n) => folded[n] });
      else if (quantize === undefined) {
        programs[f] = await executor.prepare(residuals[i]!, { get: (n) => weights.get(n) ?? folded[n] });
        copies++;
      }
      else {
        const q = quantizeLinears(residuals[i]!, { ...Object.fromEntries(weights), ...folded }, quantize);
        if (i === 0) weightBytes = Object.values(q.constants).reduce((a, t) => a + t.data.byteLength, 0);
        // The f32 tensors left unquantized (embeddings, norms) are one host copy every program
        // reads as inputs, not a copy per program; the packed linears are the programs' own.
        for (const [n, t] of Object.entries(q.constants)) if (weights.get(n) === t) shared.set(n, t);
        programs[f] = await executor.prepare(paramsToInputs(q.graph, (n) => shared.has(n)), { get: (n) => q.constants[n] });
      }
    }
    const weightInputs = asInputs ? Object.fromEntries(weights) : Object.fromEntries(shared);
    // Bytes of every copy: the shared host copy (inputs) and each program's own.
    if (quantize === undefined) weightBytes = oneCopy * (copies + (asInputs ? 1 : 0));
    const baseTakesWeights = quantize !== undefined || (asInputs && !packBase);
    const factorDtype = dtype !== 'f32' && adapterDtype === 'same' ? dtype : 'f32';
    const tables = onDevice === undefined ? new SlotTables(maxLoras + 1, rank, modules, factorDtype) : await SlotTables.onDevice(onDevice, maxLoras + 1, rank, modules, factorDtype);
    return new Engine(dir, config, await loadTokenizer(dir), { executor, programs, tables, shapes, weightBytes, deviceWeightBytes, hostWeights: onDevice === undefined, maxCpuLoras, prefillChunk, weightInputs, allWeightInputs: asInputs, baseTakesWeights, memoryBudget, replanEvery, fixedPlan, dtype, adapterDtype, caches, hostKvCopy: opts.hostKvCopy === true, recycleOutputs: opts.recycleOutputs === true, executorPicks: opts.executorPicks ?? executor.capabilities.devicePicks === true, mergeWaste, staging, prefix });
  }

  /** Bytes one position of a sequence's resident KV cache takes: keys and values of every layer, and its mask entry (f32). */
  get kvBytesPerToken(): number {
    return (2 * this.config.numLayers * this.#kvShape[0] * this.#kvShape[1] + 1) * 4;
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
    return [...this.#registered.keys()];
  }

  /** Compute dtype of the programs (`EngineOptions.dtype`, `checkpoint` resolved). */
  get dtype(): EngineDType {
    return this.#dtype;
  }

  /** Dtype of the slot tables' factors: f32, or the compute dtype with `adapterDtype: 'same'`. */
  get factorDtype(): EngineDType {
    return this.#dtype !== 'f32' && this.#adapterDtype === 'same' ? this.#dtype : 'f32';
  }

  /** The executor running the program. */
  get executorName(): string {
    return this.#executor.name;
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
    return this.#executor.capabilities.scheduling ?? CPU_SCHEDULING;
  }

  /**
   * Whether prefix caching serves hits (`EngineOptions.prefixCaching`): asked for, and the host holds
   * the keys and values to copy (not resident KV without `hostKvCopy`), and not a longrope model.
   */
  get prefixCaching(): boolean {
    return this.#prefix !== undefined && this.#hostKv && this.config.rope.type !== 'longrope';
  }

  /**
   * Sets the bytes the live sequences' KV and the prefix cache's retained KV may hold together
   * (`PrefixCachingOptions.kvBudget`), evicting retained caches down to it now. No-op without
   * prefix caching; a bad value is `ENGINE_BAD_OPTIONS`.
   */
  setPrefixKvBudget(bytes: number): void {
    this.#prefix?.setBudget(bytes);
    this.#fitPrefix();
  }

  /** Whether sequences' KV lives on the executor (`EngineOptions.residentKv`). */
  get residentKv(): boolean {
    return this.#caches !== undefined;
  }

  /** Executor-held bytes by kind. */
  memory(): EngineMemory {
    let kv = 0;
    let executorKv = 0;
    const perPosition = 2 * this.config.numLayers * this.#kvShape[0] * this.#kvShape[1] * dtypeBytes(this.#dtype) + 4;
    for (const s of this.#live) {
      kv += s.kv.bytes;
      if (s.cache !== undefined) executorKv += s.kv.length * perPosition;
    }
    const staging = this.#staging.bytes + this.#decodeStaging.bytes;
    let lanes = 0;
    for (const l of this.#lanes.values()) lanes += l.bytes;
    const onDevice = this.#deviceWeightBytes + (this.#tables.onDevice ? this.#tables.bytes : 0) + executorKv;
    const prefixKv = this.#prefix?.retainedBytes ?? 0;
    return { weights: this.#weightBytes, slots: this.#tables.bytes, slotFactors: this.#tables.factorBytes, kv, prefixKv, executorKv, staging, lanes, total: this.#weightBytes + this.#tables.bytes + kv + prefixKv + executorKv + staging + lanes, onDevice };
  }

  /** Counters. */
  stats(): EngineStats {
    return { preparations: this.#preparations, runs: this.#runs, runsByForm: { ...this.#runsByForm }, residentAdapters: this.#slotCache.stats().entries, sequences: this.#live.size, freeSlots: this.#tables.freeSlots, cacheRebuilds: this.#rebuilds, workerRetries: this.#workerRetries, steps: this.#steps, mergedSteps: this.#mergedSteps, executor: this.#caches?.stats?.() ?? {}, ...(this.#prefix === undefined ? {} : { prefixCache: this.#prefix.stats() }) };
  }

  /** Whether the base slot and every free slot hold only zeros (an unloaded adapter leaves nothing behind). */
  slotsAreClear(): boolean {
    return this.#tables.freeSlotsAreZero();
  }

  /** A base parameter's shape (`lm_head.weight` of a tied model: the embeddings'). */
  #baseShapeOf(p: string): readonly number[] | undefined {
    return this.#shapes.get(p) ?? (p === 'lm_head.weight' && this.config.tieWordEmbeddings ? this.#shapes.get('model.embed_tokens.weight') : undefined);
  }

  /** Elements of the model's largest parameter: no adapter tensor may hold more. */
  #largestParam(): number {
    let most = 0;
    for (const s of this.#shapes.values()) most = Math.max(most, s.reduce((a, d) => a * d, 1));
    return most;
  }

  #validate(adapter: LoraAdapter): LoraAdapter {
    const refuse = (why: string): never => {
      throw new EngineError(EngineCode.BAD_ADAPTER, `adapter '${adapter.name}' ${why}`);
    };
    const lanes = this.#allWeightInputs;
    if (adapter.tokenRows.length > 0) {
      const what = `replaces embedding rows (trainable_token_indices)`;
      if (!this.#hostWeights) refuse(`${what}, which needs the base weights on the host; this engine keeps them on the executor's device (deviceWeights)`);
      if (!lanes) refuse(`${what}, which an engine with weights: 'program' cannot give a lane of its own`);
      const [V, H] = this.#shapes.get('model.embed_tokens.weight')!;
      for (const t of adapter.tokenRows) {
        if (t.module !== 'model.embed_tokens') refuse(`replaces rows of '${t.module}'; only the input embedding 'model.embed_tokens' takes trainable tokens here`);
        const bad = t.indices.find((i) => i >= V!);
        if (bad !== undefined) refuse(`replaces the row of token ${String(bad)}, beyond the vocabulary (${String(V)})`);
        if (t.rows.shape[1] !== H) refuse(`replaces embedding rows of width ${String(t.rows.shape[1])}; the model's is ${String(H)}`);
      }
    }
    if (adapter.overrides.size > 0) {
      if (!this.#hostWeights) refuse(`replaces whole tensors (${[...adapter.overrides.keys()].slice(0, 3).join(', ')}), which needs the base weights on the host; this engine keeps them on the executor's device (deviceWeights)`);
      if (!lanes) refuse(`replaces whole tensors (${[...adapter.overrides.keys()].slice(0, 3).join(', ')}), which cannot vary by row; an engine with weights: 'program' cannot give it a lane of its own`);
      for (const [k, t] of adapter.overrides) {
        const want = this.#shapes.get(k);
        if (want === undefined) refuse(`replaces '${k}', which is not a tensor of this model${k === 'lm_head.weight' && this.config.tieWordEmbeddings ? ' (lm_head is tied to the embeddings here)' : ''}`);
        if (want!.join(',') !== t.shape.join(',')) refuse(`replaces '${k}' with shape [${t.shape.join(', ')}]; the model's is [${want!.join(', ')}]`);
      }
    }
    this.#expertFactors(adapter);
    checkAdapterAgainstBase(adapter, (p) => this.#baseShapeOf(p));
    for (const m of adapter.modules.values()) {
      if (!this.#tables.has(m.module)) refuse(`adapts '${m.module}', which is not a projection the engine serves`);
      if (m.rank > this.#tables.rank) refuse(`has rank ${String(m.rank)} on '${m.module}', above the slot rank ${String(this.#tables.rank)} (raise --max-lora-rank)`);
      if ((m.biasB !== undefined || m.magnitude !== undefined) && this.#tables.expertsOf(m.module) !== undefined) refuse(`has a LoRA bias or DoRA magnitude on the expert projection '${m.module}'`);
    }
    return adapter;
  }

  /**
   * Reads a PEFT adapter directory, validates it against this model and the slot shape, registers
   * it and warms a slot for it (evicting the least recently used idle adapter when all are taken).
   * A refused adapter (`ENGINE_BAD_ADAPTER`, PEFT errors) leaves the engine as it was.
   */
  async loadAdapter(dir: string, name?: string): Promise<LoraAdapter> {
    // Every tensor's header is checked against the model before its data is read or allocated.
    const adapter = this.#validate(await loadLoraAdapter(dir, { ...(name === undefined ? {} : { name }), shapeOf: (p) => this.#baseShapeOf(p), maxElements: this.#largestParam(), kinds: { dora: true, trainableTokens: true } }));
    // DoRA's column norms and the scaled LoRA biases: computed once here, written with the slot.
    const outs = await loadSlotOuts(this.dir, adapter, (p) => this.#shapes.get(p));
    if (adapter.name === BASE) throw new ModelError(ModelCode.BAD_ADAPTER, `'${BASE}' is reserved for the base model`);
    // A fixed plan must fit the adapter (every merged unit one of its modules) before anything changes.
    if (this.#fixedPlan !== undefined) appliedPlan(this.#fixedPlan, [shapeOnly(adapter)]);
    if (this.#registered.has(adapter.name)) this.unloadAdapter(adapter.name);
    const lane = this.#laneFor(adapter, undefined);
    if (lane !== undefined) this.#lanes.set(adapter.name, lane);
    this.#outs.set(adapter.name, outs);
    this.#registered.set(adapter.name, dir);
    // A reload is a new version: KV cached under the old one is never reused.
    this.#prefixKeys.set(adapter.name, adapterReachesKv(adapter, this.config.numLayers) ? `${adapter.name}#${String(++this.#adapterLoads)}` : '');
    this.#shapesOf.set(adapter.name, shapeOnly(adapter));
    this.#planDirty = this.#planning;
    this.#fresh.set(adapter.name, adapter);
    try {
      (await this.#host.acquire(adapter.name)).release();
    } finally {
      this.#fresh.delete(adapter.name);
    }
    try {
      const lease = await this.#slotCache.acquire(adapter.name);
      this.#assign(lease.value);
      lease.release();
    } catch (e) {
      // Every slot is in use by running sequences: the adapter stays loaded and takes a slot later.
      if (!(e instanceof StageError && e.code === PeftCode.CACHE_FULL)) throw e;
    }
    return adapter;
  }

  /** Forgets an adapter: frees (zeroes) its slot, its host copy and its lane. `PEFT_IN_USE` while sequences run on it. */
  unloadAdapter(name: string): boolean {
    if (!this.#registered.has(name)) return false;
    this.#slotCache.evict(name);
    this.#host.evict(name);
    this.#registered.delete(name);
    this.#shapesOf.delete(name);
    this.#planDirty = this.#planning;
    this.#lanes.delete(name);
    this.#outs.delete(name);
    const key = this.#prefixKeys.get(name);
    this.#prefixKeys.delete(name);
    if (key !== undefined && key !== '') this.#prefix?.drop((k) => k.startsWith(`${this.#dtype}|${key}|`));
    return true;
  }

  /**
   * The lane of an adapter that cannot vary by row, or undefined for a plain slot adapter: the
   * slot programs with its overrides (and the plan's merged copies) substituted among the weight
   * inputs — no preparation.
   */
  #laneFor(adapter: LoraAdapter, merged: ReadonlySet<string> | undefined): Lane | undefined {
    if (adapter.overrides.size === 0 && adapter.tokenRows.length === 0 && (merged === undefined || merged.size === 0)) return undefined;
    const weights: Record<string, HostTensor> = { ...this.#weightInputs };
    let bytes = 0;
    // Trainable tokens: the embedding with the adapter's rows (a tied head reads the same rows).
    for (const [k, t] of laneTokenWeights(adapter, weights)) {
      const held = castTensor(t, this.#dtype);
      weights[k] = held;
      bytes += tensorBytes(held);
    }
    for (const [k, t] of adapter.overrides) {
      const held = castTensor(t, this.#dtype);
      weights[k] = held;
      bytes += tensorBytes(held);
    }
    for (const module of merged ?? []) {
      const m = adapter.modules.get(module);
      const w = weights[`${module}.weight`];
      if (m === undefined || w === undefined) continue;
      // DoRA merges its column scale into the weight; a LoRA bias stays in the slot (`#outsOf`).
      const held = castTensor(m.magnitude === undefined ? mergedWeight(w, m) : mergedModule(w, m), this.#dtype);
      weights[`${module}.weight`] = held;
      bytes += tensorBytes(held);
    }
    return { weights, bytes };
  }

  /** An adapter's MoE expert factors per expert-projection table (`ENGINE_BAD_ADAPTER` when they do not fit). */
  #expertFactors(adapter: LoraAdapter): ExpertSlotFactors[] {
    // Unpacked once per parsed adapter: validation at load and the slot write share it.
    let f = this.#expertCache.get(adapter);
    if (f === undefined) this.#expertCache.set(adapter, (f = expertSlotFactors(adapter, this.config, this.#tables.rank)));
    return f;
  }

  /** Where a slot's factors come from again (device tables on a new worker): the adapter reloaded through the host cache (its directory). */
  #slotSource(name: string): SlotSource {
    return async () => {
      const lease = await this.#host.acquire(name);
      lease.release();
      const adapter = withoutModules(lease.value, this.#applied.merged.get(name));
      return { adapter, experts: this.#expertFactors(lease.value), outs: this.#outsOf(adapter) };
    };
  }

  /**
   * The output-table rows `adapter`'s slot holds: every row of its modules in the slot; of a plan's
   * merged modules (not in `adapter`), only the LoRA bias — their weights merged the rest.
   */
  #outsOf(adapter: LoraAdapter): ReadonlyMap<string, SlotOut> | undefined {
    const all = this.#outs.get(adapter.name);
    if (all === undefined || all.size === 0) return undefined;
    const out = new Map<string, SlotOut>();
    for (const [k, o] of all) {
      if (adapter.modules.has(k)) out.set(k, o);
      else if (o.bias !== undefined) out.set(k, { bias: o.bias });
    }
    return out;
  }

  #assign(entry: SlotEntry): number {
    if (entry.slot === undefined) {
      const adapter = withoutModules(entry.adapter, this.#applied.merged.get(entry.adapter.name));
      entry.slot = this.#tables.write(adapter, this.#expertFactors(entry.adapter), this.#tables.onDevice ? this.#slotSource(entry.adapter.name) : undefined, this.#outsOf(adapter));
      entry.adapter = shapeOnly(entry.adapter);
    }
    this.#entries.set(entry.adapter.name, entry);
    return entry.slot;
  }

  /** The plan applied now. */
  plan(): EnginePlan {
    return {
      memoryBudget: this.#memoryBudget,
      // A fixed plan is the plan from the start; its merges apply before the first step.
      plan: this.#fixedPlan ?? this.#applied.plan,
      merged: Object.fromEntries([...this.#applied.merged].map(([a, m]) => [a, [...m].sort()])),
      applied: this.#plansApplied,
    };
  }

  /** Marks the plan for re-planning before the next step (e.g. after traffic shifted). */
  replan(): void {
    if (this.#memoryBudget !== undefined) this.#planDirty = true;
  }

  /**
   * Re-plans and applies the result between steps (called at the start of every prefill and
   * decode): adapters whose merged set changed get a new lane (merged copies) and their slot
   * rewritten without the merged modules. Runs never see a half-applied plan: the scheduler does
   * not start a run until this resolves.
   */
  async #applyPlan(): Promise<void> {
    if (!this.#planning) return;
    if (!this.#planDirty && (this.#fixedPlan !== undefined || this.#runs - this.#runsAtPlan < this.#replanEvery)) return;
    this.#planDirty = false;
    this.#runsAtPlan = this.#runs;
    const snapshot = this.#traffic.snapshot('tokens');
    const next = this.#fixedPlan !== undefined ? appliedPlan(this.#fixedPlan, [...this.#shapesOf.values()]) : planMerges(this.config, [...this.#shapesOf.values()], this.#memoryBudget ?? 0, this.#executor.name, Object.keys(snapshot.counts).length === 0 ? undefined : snapshot);
    const same = (a: ReadonlySet<string> | undefined, b: ReadonlySet<string> | undefined): boolean => (a?.size ?? 0) === (b?.size ?? 0) && [...(a ?? [])].every((x) => b?.has(x) === true);
    const changed = [...this.#registered.keys()].filter((n) => !same(this.#applied.merged.get(n), next.merged.get(n)));
    const adapters = new Map<string, LoraAdapter>();
    for (const name of changed) {
      // Resident entries keep shapes only: the factors come from the host cache (or the disk).
      const lease = await this.#host.acquire(name);
      adapters.set(name, lease.value);
      lease.release();
    }
    const lanes = new Map<string, Lane | undefined>();
    for (const name of changed) lanes.set(name, this.#laneFor(adapters.get(name)!, next.merged.get(name)));
    // Everything is computed: apply synchronously, between two runs.
    this.#applied = next;
    this.#plansApplied++;
    for (const name of changed) {
      const lane = lanes.get(name);
      if (lane === undefined) this.#lanes.delete(name);
      else this.#lanes.set(name, lane);
      const entry = this.#entries.get(name);
      if (entry?.slot !== undefined) {
        const adapter = withoutModules(adapters.get(name)!, next.merged.get(name));
        this.#tables.rewrite(entry.slot, adapter, this.#expertFactors(adapters.get(name)!), undefined, this.#outsOf(adapter));
      }
    }
  }

  /**
   * Starts a sequence: validates the prompt (`MODEL_BAD_TOKEN`) and adapter (`MODEL_BAD_ADAPTER`
   * when not loaded); `mask` marks padding (0) per prompt token. Attach it before running it.
   */
  open(adapter: string | null | undefined, prompt: readonly number[], mask?: readonly number[]): Sequence {
    const seq = this.#openSequence(adapter, prompt, mask);
    this.#reusePrefix(seq);
    return seq;
  }

  #openSequence(adapter: string | null | undefined, prompt: readonly number[], mask?: readonly number[]): Sequence {
    const name = adapter === null || adapter === undefined || adapter === BASE ? undefined : adapter;
    if (name !== undefined && !this.#registered.has(name)) {
      throw new ModelError(ModelCode.BAD_ADAPTER, `adapter '${name}' is not loaded (loaded: ${this.adapterNames.join(', ') || 'none'})`);
    }
    if (prompt.length === 0) throw new ModelError(ModelCode.BAD_OPTIONS, 'the prompt is empty');
    prompt.forEach((t, i) => {
      if (!Number.isInteger(t) || t < 0 || t >= this.config.vocabSize) {
        throw new ModelError(ModelCode.BAD_TOKEN, `token id ${String(t)} at position ${String(i)} is outside the vocabulary [0, ${String(this.config.vocabSize)})`);
      }
    });
    const m = mask ?? prompt.map(() => 1);
    if (m.length !== prompt.length || m.some((v) => v !== 0 && v !== 1)) throw new ModelError(ModelCode.BAD_OPTIONS, `the mask must be ${String(prompt.length)} values of 0 or 1`);
    const seq = new Sequence(name, prompt, m, this.#newKv(prompt.length));
    seq.cache = this.#caches?.open();
    this.#live.add(seq);
    if (name !== undefined) this.#traffic.record(name, prompt.length);
    return seq;
  }

  /**
   * Gives `seq` its adapter's slot (loading the adapter into one if needed). Resolves false when
   * every slot is held by other running adapters (try again after a step); rejects when the
   * adapter cannot be read.
   */
  async attach(seq: Sequence, signal?: AbortSignal): Promise<boolean> {
    if (!this.#live.has(seq)) this.#bad(seq);
    if (seq.slot !== undefined) return true;
    if (seq.adapter === undefined) {
      seq.slot = 0;
      return true;
    }
    try {
      const lease = await this.#slotCache.acquire(seq.adapter, signal === undefined ? {} : { signal });
      if (seq.released) {
        lease.release();
        return false;
      }
      seq.lease = lease;
      seq.slot = this.#assign(lease.value);
      return true;
    } catch (e) {
      if (e instanceof StageError && e.code === PeftCode.CACHE_FULL) return false;
      throw e;
    }
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
    if (this.#disposed) throw new EngineError(EngineCode.BAD_OPTIONS, 'the engine was disposed');
    if (!this.#allWeightInputs) throw new EngineError(EngineCode.BAD_OPTIONS, "prompt logits need the engine's weights as inputs (weights: 'inputs')");
    const chunk = positiveInt('chunk', opts.chunk ?? 4 * this.#prefillChunk, 1);
    const seq = this.#openSequence(adapter, prompt, mask);
    try {
      const lane = seq.adapter === undefined ? undefined : this.#lanes.get(seq.adapter);
      if (!(await this.attach(seq))) throw new PeftError(PeftCode.CACHE_FULL, 'every adapter slot is held by running adapters; retry when a request finishes');
      const slot = this.#check(seq);
      const program = await this.#scoringProgram();
      const count = prompt.length;
      const keyMask = new Float32Array(count);
      seq.promptMask.forEach((v, i) => {
        if (v !== 1) keyMask[i] = MASKED;
      });
      let next = 0;
      const positions = seq.promptMask.map((v) => (v === 1 ? next++ : 1));
      const past: { k: Float32Array[]; v: Float32Array[] } = { k: [], v: [] };
      const V = this.config.vocabSize;
      const width = this.#kvShape.reduce((a, d) => a * d, 1);
      // `whole`: the executor kept the new keys and values, so the rest is scored in one run from the start.
      let whole = false;
      for (let start = 0; start < count; ) {
        const from = whole ? 0 : start;
        const c = whole ? count : Math.min(chunk, count - start);
        const inputs = this.#scoringInputs(prompt, positions, keyMask, from, c, past, lane, slot);
        await this.#tables.settled();
        const out = await runProgram(program, inputs, this.#resident);
        this.#runs++;
        yield { start, logits: (out['logits']!.data as Float32Array).subarray((start - from) * V, c * V) };
        if (whole || start + c >= count) break;
        if (out['new_key.0']?.data.length !== c * width) whole = true;
        else {
          for (let l = 0; l < this.config.numLayers; l++) {
            past.k[l] = concatF32(past.k[l], out[`new_key.${String(l)}`]!.data as Float32Array);
            past.v[l] = concatF32(past.v[l], out[`new_value.${String(l)}`]!.data as Float32Array);
          }
        }
        start += c;
        // A timer, not setImmediate: the timers and I/O phases both run before the next chunk.
        await new Promise<void>((resolve) => setTimeout(resolve, 0));
      }
    } finally {
      this.release(seq);
    }
  }

  /** The scoring program (logits at every position), prepared on first use. */
  #scoringProgram(): Promise<PreparedGraph> {
    if (this.#scoring === undefined) {
      const built = engineGraph(this.config, 'gathered', this.#slots, this.#rank, [], { allLogits: true, separateHead: 'lm_head.weight' in this.#weightInputs && this.config.tieWordEmbeddings });
      const st = stageProgram(this.#dtype === 'f32' ? built : castProgram(built, this.#dtype, this.#adapterDtype), 'scoring');
      const folded = foldProgram(st, { get: (n) => this.#foldSources.get(n) });
      this.#reports.set('scoring', st.report);
      this.#scoring = this.#executor.prepare(paramsToInputs(st.residual, (n) => isWeightParam(st, n)), { get: (n) => folded[n] });
      this.#scoring.catch(() => {
        this.#scoring = undefined;
      });
      this.#preparations++;
    }
    return this.#scoring;
  }

  /** Inputs of one scoring chunk: positions [start, start + c) over the keys and values of [0, start). */
  #scoringInputs(prompt: readonly number[], positions: readonly number[], keyMask: Float32Array, start: number, c: number, past: { k: Float32Array[]; v: Float32Array[] }, lane: Lane | undefined, slot: number): Record<string, HostTensor> {
    const keys = start + c;
    const window = this.config.slidingWindow;
    const inputs: Record<string, HostTensor> = {
      input_ids: hostTensor('i64', [1, c], prompt.slice(start, keys)),
      position_ids: hostTensor('i64', [1, c], positions.slice(start, keys)),
      attention_mask: window === undefined ? { dtype: 'f32', shape: [1, keys], data: keyMask.slice(0, keys) } : { dtype: 'f32', shape: [1, c, keys], data: windowedQueries(keyMask.slice(0, keys), start, c, window) },
    };
    for (let l = 0; l < this.config.numLayers; l++) {
      inputs[`past_key.${String(l)}`] = { dtype: this.#dtype, shape: [1, start, ...this.#kvShape], data: start === 0 ? new Float32Array(0) : past.k[l]! };
      inputs[`past_value.${String(l)}`] = { dtype: this.#dtype, shape: [1, start, ...this.#kvShape], data: start === 0 ? new Float32Array(0) : past.v[l]! };
    }
    Object.assign(inputs, this.#tables.inputs, lane?.weights ?? this.#weightInputs);
    inputs[ROW_SLOT_INPUT] = hostTensor('i64', [1], [slot]);
    this.#tokenSlots(inputs, [slot]);
    return inputs;
  }

  /**
   * Releases every program (and the scoring program) on the executor and every live sequence;
   * later steps fail with `ENGINE_BAD_OPTIONS`. Idempotent.
   */
  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    for (const s of [...this.#live]) this.release(s);
    this.#prefix?.clear();
    for (const p of Object.values(this.#programs)) p.dispose();
    this.#spare?.clear();
    this.#scoring?.then((p) => { p.dispose(); }, () => undefined);
  }

  /** Ends a sequence: frees its KV memory and its hold on the adapter's slot. Idempotent. */
  release(seq: Sequence): void {
    if (seq.released) return;
    seq.released = true;
    this.#live.delete(seq);
    this.#decodeStaging.forget(seq.kv);
    if (seq.cache !== undefined) this.#caches?.release([seq.cache]);
    seq.lease?.release();
    seq.lease = undefined;
    this.#prefix?.retire(seq.kv);
    this.#fitPrefix();
  }

  /**
   * The prefix cache's key of a sequence on `adapter`: the compute dtype, and for an adapter that
   * reaches some layer's K/V its name, load version and the modules the plan merged for it (a
   * merged copy computes the same keys in another order). The base weights never change under a
   * plan here (merges are copies in lanes), so base rows and adapters that reach no K/V share one key.
   */
  #prefixKey(adapter: string | undefined): string {
    const part = adapter === undefined ? '' : (this.#prefixKeys.get(adapter) ?? '');
    const merged = part === '' ? '' : [...(this.#applied.merged.get(adapter!) ?? [])].sort().join(',');
    return `${this.#dtype}|${part}|${merged}`;
  }

  /** Prefix caching: starts `seq` from the longest cached prefix of its prompt and indexes its own blocks from now on. */
  #reusePrefix(seq: Sequence): void {
    const p = this.#prefix;
    // Resident KV without a host copy: no host keys to copy from. Longrope: long prompts are one run.
    if (p === undefined || !this.prefixCaching) return;
    const key = this.#prefixKey(seq.adapter);
    const hit = p.lookup(key, seq.prompt, seq.promptMask);
    if (hit !== undefined) {
      seq.kv.copyPrefix(hit.from, hit.tokens);
      seq.prefilled = hit.tokens;
      seq.cachedTokens = hit.tokens;
      let attended = 0;
      for (let i = 0; i < hit.tokens; i++) attended += seq.promptMask[i]!;
      seq.nextPosition = attended;
    }
    p.track(seq.kv, key, seq.prompt, seq.promptMask);
    this.#fitPrefix();
  }

  /** Evicts retained prefix caches until they and the live sequences' KV fit the budget. */
  #fitPrefix(): void {
    if (this.#prefix === undefined) return;
    let live = 0;
    for (const s of this.#live) live += s.kv.bytes;
    this.#prefix.fit(live);
  }

  /** A sequence's KV record for `positions` positions to start with. */
  #newKv(positions: number): SequenceKv {
    return new SequenceKv(this.config.numLayers, this.#kvShape[0] * this.#kvShape[1], Math.min(64, positions + 16), this.#dtype, this.#hostKv);
  }

  #bad(seq: Sequence): never {
    throw new EngineError(EngineCode.BAD_SEQUENCE, `the sequence (adapter ${seq.adapter ?? 'base'}) was released`);
  }

  #check(seq: Sequence): number {
    if (seq.released || !this.#live.has(seq)) this.#bad(seq);
    if (seq.slot === undefined) throw new EngineError(EngineCode.BAD_SEQUENCE, 'the sequence is not attached to a slot yet (call attach)');
    return seq.slot;
  }

  /** MoE models: each token's slot for the expert tables (rows × positions of `input_ids`). */
  #tokenSlots(inputs: Record<string, HostTensor>, rowSlots: readonly number[]): void {
    if (this.config.moe === undefined) return;
    const seq = inputs['input_ids']!.shape[1]!;
    inputs[TOKEN_SLOT_INPUT] = hostTensor('i64', [rowSlots.length * seq], rowSlots.flatMap((s) => new Array<number>(seq).fill(s)));
  }

  async #run(inputs: Record<string, HostTensor>, rowSlots: readonly number[], lane: Lane | undefined, caches: CacheRun | undefined, produced: Outputs, pick: StepPick = 'logits'): Promise<Record<string, HostTensor>> {
    if (this.#disposed) throw new EngineError(EngineCode.BAD_OPTIONS, 'the engine was disposed');
    const programs = this.#programs;
    if (programs.base !== undefined && lane === undefined && rowSlots.every((s) => s === 0)) {
      if (this.#baseTakesWeights) Object.assign(inputs, this.#weightInputs);
      this.#runs++;
      this.#runsByForm.base++;
      return this.#runProgram(programs.base, inputs, caches, produced, pick);
    }
    Object.assign(inputs, this.#tables.inputs, lane?.weights ?? this.#weightInputs);
    const groups = [...new Set(rowSlots.filter((s) => s !== 0))];
    const form = this.#formFor(rowSlots.length, groups.length);
    this.#tokenSlots(inputs, rowSlots);
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
    this.#runs++;
    this.#runsByForm[form]++;
    return this.#runProgram(programs[form]!, inputs, caches, produced, pick);
  }

  /** Runs `program`, recycling its last finished call's result when recycling outputs; the result goes to `produced`. */
  async #runProgram(program: PreparedGraph, inputs: Readonly<Record<string, HostTensor>>, caches: CacheRun | undefined, produced: Outputs, pick: StepPick = 'logits'): Promise<Record<string, HostTensor>> {
    // Device slot writes go before the run on the worker's queue; a failed one fails the run.
    await this.#tables.settled();
    // A pick of greedy rows only (no processing) is an argmax, which every executor whose results cross makes.
    const greedy = pick === 'greedy' || (typeof pick === 'object' && pick.every((r) => r.temperature === 0 && r.processing === undefined));
    const argmax = greedy ? GREEDY_OUTPUTS : undefined;
    const sample = typeof pick === 'object' && !greedy && this.#executorPicks ? { logits: pick } : undefined;
    // The executor's caches append the new keys and values; without a host copy they need not come back.
    const omit = caches !== undefined && !this.#hostKv ? this.#kvOutputs : undefined;
    const spare = this.#spare;
    if (spare === undefined) return runProgram(program, inputs, this.#resident, caches, undefined, argmax, omit, sample);
    // Taken while the run is in flight: a concurrent run of the same program allocates.
    const recycle = spare.get(program);
    spare.delete(program);
    const out = await runProgram(program, inputs, this.#resident, caches, recycle, argmax, omit, sample);
    produced.set(program, out);
    return out;
  }

  /** A finished call's results become the storage its programs' next runs write into. */
  #keep(produced: Outputs): void {
    if (this.#spare === undefined || this.#disposed) return;
    for (const [program, out] of produced) this.#spare.set(program, out);
  }

  #historyOf(s: Sequence): number[] {
    let h = this.#history.get(s);
    if (h === undefined) this.#history.set(s, (h = []));
    return h;
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
          this.#workerRetries++;
          continue;
        }
        const lost = e instanceof CacheLostError && !this.#hostKv && !rebuilt ? seqs.filter((s) => s.cache !== undefined && e.ids.includes(s.cache)) : [];
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
    const caches = this.#caches!;
    const standIns = seqs.map((s) => {
      const decoded = this.#history.get(s) ?? [];
      const tokens = [...s.prompt.slice(0, s.prefilled), ...decoded];
      const t = new Sequence(s.adapter, tokens, [...s.promptMask.slice(0, s.prefilled), ...decoded.map(() => 1)], this.#newKv(tokens.length));
      t.slot = s.slot;
      t.cache = caches.open();
      return t;
    });
    try {
      while (standIns.some((t) => !t.ready)) {
        const todo = standIns.filter((t) => !t.ready);
        await this.#prefillBatch(todo, todo.map((t) => t.slot!), lane, undefined, produced, 'logits');
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
    this.#rebuilds += seqs.length;
  }

  /**
   * The cache rows of a step over `seqs` (resident KV), row r appending `append[r]` [from, count);
   * with a host copy each row can restore a lost cache from it.
   */
  #cacheRun(seqs: readonly Sequence[], append: readonly (readonly [number, number])[]): CacheRun {
    const shape = this.#kvShape;
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
      streams: this.#streams,
      rows: seqs.map((s, r) => ({ id: s.cache!, length: s.kv.length, append: append[r]!, ...(this.#hostKv ? { restore: restore(s) } : {}) })),
      rowInputs: ROW_INPUTS,
    };
  }

  /** The slot form of a step of `rows` rows over `groups` distinct adapters, among the prepared ones. */
  #formFor(rows: number, groups: number): SlotForm {
    const p = this.#programs;
    if (p.single !== undefined && groups === 1) return 'single';
    return p.grouped === undefined ? 'gathered' : p.gathered === undefined ? 'grouped' : chooseSlotForm(rows, groups);
  }

  /** A run's new keys and values per layer (none where the host keeps no KV: the run omitted them). */
  #outputs(out: Record<string, HostTensor>): { k: Float32Array[]; v: Float32Array[] } {
    const k: Float32Array[] = [];
    const v: Float32Array[] = [];
    for (let l = 0; this.#hostKv && l < this.config.numLayers; l++) {
      k.push(out[`new_key.${String(l)}`]!.data as Float32Array);
      v.push(out[`new_value.${String(l)}`]!.data as Float32Array);
    }
    return { k, v };
  }

  /**
   * Tokens the next prefill chunk of `seq` takes: at most `maxChunk` (default `prefillChunk`; a
   * scheduler with no stream to stall may allow more), 0 once prefilled. A longrope model's prompt
   * longer than `original_max_position_embeddings` is one chunk (`longropeWholePrompt`).
   */
  chunkOf(seq: Sequence, maxChunk?: number): number {
    const left = seq.prompt.length - seq.prefilled;
    if (longropeWholePrompt(this.config, seq.prompt.length)) return left;
    return Math.min(maxChunk ?? this.#prefillChunk, left);
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
    return (await this.#prefillRuns(seqs, opts, 'logits')) as (Float32Array | undefined)[];
  }

  /**
   * `prefillMany`, resolving per sequence whose prompt is done to its first token drawn as
   * `rows[i]` says (as `decodeSample`: on the executor with `executorPicks`, else from the logits
   * here; all-greedy runs pick on the executor, `RunOptions.argmax`), otherwise undefined. A row
   * spec of a sequence the run does not finish (`finishesPrefill`) is not used.
   */
  async prefillSample(seqs: readonly Sequence[], rows: readonly RowSample[], opts: PrefillOptions = {}): Promise<(number | undefined)[]> {
    checkRows(seqs, rows, 'prefillSample');
    return (await this.#prefillRuns(seqs, opts, rows)) as (number | undefined)[];
  }

  async #prefillRuns(seqs: readonly Sequence[], opts: PrefillOptions, pick: 'logits' | readonly RowSample[]): Promise<(Float32Array | number | undefined)[]> {
    const maxChunk = opts.maxChunk === undefined ? undefined : positiveInt('maxChunk', opts.maxChunk, 1);
    for (const s of seqs) this.#check(s);
    if (new Set(seqs).size !== seqs.length) throw new EngineError(EngineCode.BAD_OPTIONS, 'a sequence appears twice in one prefill');
    await this.#applyPlan();
    for (const s of seqs) {
      this.#check(s);
      if (s.ready) throw new EngineError(EngineCode.BAD_SEQUENCE, 'the prompt is already prefilled');
    }
    const byLane = new Map<string, number[]>();
    seqs.forEach((s, i) => {
      const key = s.adapter !== undefined && this.#lanes.has(s.adapter) ? s.adapter : '';
      byLane.set(key, [...(byLane.get(key) ?? []), i]);
    });
    const result: (Float32Array | number | undefined)[] = new Array<Float32Array | number | undefined>(seqs.length);
    const produced: Outputs = new Map();
    for (const [key, idx] of byLane) {
      const group = idx.map((i) => seqs[i]!);
      const lane = key === '' ? undefined : this.#lanes.get(key);
      const groupPick = typeof pick === 'object' ? idx.map((i) => pick[i]!) : pick;
      const out = await this.#surviving(group, lane, produced, () => this.#prefillBatch(group, group.map((s) => this.#check(s)), lane, maxChunk, produced, groupPick));
      idx.forEach((i, j) => {
        result[i] = out[j];
      });
    }
    this.#keep(produced);
    this.#fitPrefix();
    return result;
  }

  async #prefillBatch(seqs: readonly Sequence[], slots: readonly number[], lane: Lane | undefined, maxChunk: number | undefined, produced: Outputs, pick: 'logits' | readonly RowSample[]): Promise<(Float32Array | number | undefined)[]> {
    const counts = seqs.map((s) => this.chunkOf(s, maxChunk));
    // Resident KV: the executor builds the cached part of the key mask; the run sends the chunk's [rows, C].
    const { inputs, C, past, chunkMasks, nexts } = prefillInputs(seqs, counts, this.config.slidingWindow, this.#caches !== undefined);
    let caches: CacheRun | undefined;
    if (this.#caches !== undefined) caches = this.#cacheRun(seqs, counts.map((c) => [C - c, c] as const));
    else this.#stagePast(inputs, seqs, past);
    const out = await this.#run(inputs, slots, lane, caches, produced, pick);
    const { k, v } = this.#outputs(out);
    const width = this.#kvShape[0] * this.#kvShape[1];
    const V = this.config.vocabSize;
    const logits = out['logits']!.data as Float32Array;
    const picks = typeof pick === 'object' ? pickRows(out['logits']!, pick) : undefined;
    return seqs.map((s, r) => {
      if (s.released) return undefined;
      s.kv.append(k, v, (r * C + C - counts[r]!) * width, chunkMasks[r]!);
      s.prefilled += counts[r]!;
      s.nextPosition = nexts[r]!;
      this.#prefix?.extend(s.kv, this.#prefixKey(s.adapter));
      // NOTE: `ready` is a getter; it changed with `prefilled` above.
      if (!s.ready) return undefined;
      return picks !== undefined ? picks[r]! : logits.subarray(r * V, (r + 1) * V);
    });
  }

  #stagePast(inputs: Record<string, HostTensor>, seqs: readonly Sequence[], past: number): void {
    stagePast(inputs, seqs, past, this.#kvShape, this.#staging);
  }

  /**
   * One decode step over `seqs` (prefilled, attached), feeding `tokens[i]` to row i: a single row
   * reads its KV buffers as zero-copy views; several rows are staged into reusable buffers (one
   * copy per row and layer, padding masked). Appends each row's new key/value in place and resolves
   * to each row's logits f32[vocab].
   */
  async decode(seqs: readonly Sequence[], tokens: readonly number[]): Promise<Float32Array[]> {
    return (await this.#decodeStep(seqs, tokens, 'logits')) as Float32Array[];
  }

  /**
   * One decode step as `decode`, resolving to each row's greedy token instead of its logits: the
   * index of its largest logit, as `argmaxOf` of @stageml/models picks it (ties the lowest id). An
   * executor whose results cross to the host (the torch worker) then returns one index per row
   * instead of the whole vocabulary's logits (`RunOptions.argmax`).
   */
  async decodeGreedy(seqs: readonly Sequence[], tokens: readonly number[]): Promise<number[]> {
    return (await this.#decodeStep(seqs, tokens, 'greedy')) as number[];
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
    checkRows(seqs, rows, 'decodeSample');
    return (await this.#decodeStep(seqs, tokens, rows)) as number[];
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
    const d = record.decode !== undefined && record.decode.seqs.length > 0 ? record.decode : undefined;
    const p = record.prefill !== undefined && record.prefill.seqs.length > 0 ? record.prefill : undefined;
    if (d === undefined && p === undefined) throw new EngineError(EngineCode.BAD_OPTIONS, 'a step needs decode rows or prefill chunks');
    this.#steps++;
    const before = this.#runs;
    if (d !== undefined && p !== undefined) {
      let merge: boolean;
      try {
        await this.#applyPlan();
        merge = this.#mergeable(d, p);
      } catch (e) {
        return { decode: { error: e }, prefill: { error: e }, merged: false, runs: this.#runs - before };
      }
      if (merge) {
        try {
          const out = await this.#mixedStep(d, p);
          this.#mergedSteps++;
          return { decode: { values: out.slice(0, d.seqs.length) as (number | Float32Array)[] }, prefill: { values: out.slice(d.seqs.length) }, merged: true, runs: this.#runs - before };
        } catch (e) {
          return { decode: { error: e }, prefill: { error: e }, merged: true, runs: this.#runs - before };
        }
      }
    }
    let decode: StepPart<number | Float32Array> | undefined;
    if (d !== undefined) {
      try {
        const values: (number | Float32Array)[] = d.rows === undefined ? await this.decode(d.seqs, d.tokens) : await this.decodeSample(d.seqs, d.tokens, d.rows);
        // Recycled outputs: the prefill run below may write into these logits' storage.
        decode = { values: this.#spare !== undefined && p !== undefined ? values.map((v) => (typeof v === 'number' ? v : v.slice())) : values };
      } catch (e) {
        decode = { error: e };
      }
    }
    let prefill: StepPart<number | Float32Array | undefined> | undefined;
    if (p !== undefined) {
      const opts = p.maxChunk === undefined ? {} : { maxChunk: p.maxChunk };
      try {
        prefill = { values: p.rows === undefined ? await this.prefillMany(p.seqs, opts) : await this.prefillSample(p.seqs, p.rows, opts) };
      } catch (e) {
        prefill = { error: e };
      }
    }
    return { ...(decode === undefined ? {} : { decode }), ...(prefill === undefined ? {} : { prefill }), merged: false, runs: this.#runs - before };
  }

  /**
   * Whether a step's decode rows and prefill chunks run as one program run: no lanes, no sliding
   * window, alike picks, and the decode rows' padding (rows × (C − 1)) within `stepMergeWaste` of
   * the token rows the two runs would take apart.
   */
  #mergeable(d: StepDecode, p: StepPrefill): boolean {
    if (this.config.slidingWindow !== undefined || (d.rows === undefined) !== (p.rows === undefined)) return false;
    const laned = (s: Sequence): boolean => s.adapter !== undefined && this.#lanes.has(s.adapter);
    if (d.seqs.some(laned) || p.seqs.some(laned)) return false;
    const maxChunk = p.maxChunk === undefined ? undefined : positiveInt('maxChunk', p.maxChunk, 1);
    const C = Math.max(...p.seqs.map((s) => this.chunkOf(s, maxChunk)));
    if (!(C >= 1)) return false;
    const nd = d.seqs.length;
    return nd * (C - 1) <= this.#mergeWaste * (nd + p.seqs.length * C);
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
      this.#check(s);
      if (!s.ready) throw new EngineError(EngineCode.BAD_SEQUENCE, 'a sequence in the decode batch is not prefilled yet');
    }
    for (const s of p.seqs) {
      this.#check(s);
      if (s.ready) throw new EngineError(EngineCode.BAD_SEQUENCE, 'the prompt is already prefilled');
    }
    d.tokens.forEach((t, i) => {
      if (!Number.isInteger(t) || t < 0 || t >= this.config.vocabSize) throw new ModelError(ModelCode.BAD_TOKEN, `token id ${String(t)} at row ${String(i)} is outside the vocabulary [0, ${String(this.config.vocabSize)})`);
    });
    const pick: 'logits' | readonly RowSample[] = d.rows === undefined ? 'logits' : [...d.rows, ...p.rows!];
    const produced: Outputs = new Map();
    const out = await this.#surviving(seqs, undefined, produced, () => this.#mixedBatch(d.seqs, d.tokens, p.seqs, p.seqs.map((s) => this.chunkOf(s, maxChunk)), produced, pick));
    this.#keep(produced);
    this.#fitPrefix();
    return out;
  }

  /**
   * One run over decode rows (each its one token) and prefill chunks (`counts[r]` prompt tokens),
   * every row left-padded to the longest chunk; appends each row's own positions. Per decode row
   * its pick or logits; per prefill row the same when its prompt is done, else undefined.
   */
  async #mixedBatch(dseqs: readonly Sequence[], tokens: readonly number[], pseqs: readonly Sequence[], counts: readonly number[], produced: Outputs, pick: 'logits' | readonly RowSample[]): Promise<(Float32Array | number | undefined)[]> {
    const chunks: ChunkRow[] = [
      ...dseqs.map((s, i) => ({ seq: s, ids: [tokens[i]!], mask01: [1] })),
      ...pseqs.map((s, r) => ({ seq: s, ids: s.prompt.slice(s.prefilled, s.prefilled + counts[r]!), mask01: s.promptMask.slice(s.prefilled, s.prefilled + counts[r]!) })),
    ];
    const seqs = chunks.map((c) => c.seq);
    const slots = seqs.map((s) => this.#check(s));
    const { inputs, C, past, chunkMasks, nexts } = chunkInputs(chunks, this.config.slidingWindow, this.#caches !== undefined);
    let caches: CacheRun | undefined;
    if (this.#caches !== undefined) caches = this.#cacheRun(seqs, chunks.map((c) => [C - c.ids.length, c.ids.length] as const));
    else this.#stagePast(inputs, seqs, past);
    const out = await this.#run(inputs, slots, undefined, caches, produced, pick);
    const { k, v } = this.#outputs(out);
    const width = this.#kvShape[0] * this.#kvShape[1];
    const V = this.config.vocabSize;
    const logits = out['logits']!.data as Float32Array;
    const picks = typeof pick === 'object' ? pickRows(out['logits']!, pick) : undefined;
    const nd = dseqs.length;
    return seqs.map((s, r) => {
      const value = picks !== undefined ? picks[r]! : logits.subarray(r * V, (r + 1) * V);
      if (s.released) return r < nd ? value : undefined;
      s.kv.append(k, v, (r * C + C - chunks[r]!.ids.length) * width, chunkMasks[r]!);
      s.nextPosition = nexts[r]!;
      if (r < nd) {
        if (!this.#hostKv) this.#historyOf(s).push(tokens[r]!);
        this.#prefix?.fed(s.kv, tokens[r]!);
        this.#prefix?.extend(s.kv, this.#prefixKey(s.adapter));
        return value;
      }
      s.prefilled += counts[r - nd]!;
      this.#prefix?.extend(s.kv, this.#prefixKey(s.adapter));
      // NOTE: `ready` is a getter; it changed with `prefilled` above.
      return s.ready ? value : undefined;
    });
  }

  async #decodeStep(seqs: readonly Sequence[], tokens: readonly number[], pick: StepPick): Promise<Float32Array[] | number[]> {
    await this.#applyPlan();
    if (seqs.length === 0 || tokens.length !== seqs.length) throw new EngineError(EngineCode.BAD_OPTIONS, `decode needs one token per sequence (${String(seqs.length)} sequences, ${String(tokens.length)} tokens)`);
    // Rows of adapters with a lane of their own run in batches of their own (one run per lane).
    const byLane = new Map<string, number[]>();
    seqs.forEach((s, i) => {
      const key = s.adapter !== undefined && this.#lanes.has(s.adapter) ? s.adapter : '';
      byLane.set(key, [...(byLane.get(key) ?? []), i]);
    });
    const result: (Float32Array | number)[] = new Array<Float32Array | number>(seqs.length);
    const produced: Outputs = new Map();
    for (const [key, idx] of byLane) {
      const group = idx.map((i) => seqs[i]!);
      const lane = key === '' ? undefined : this.#lanes.get(key);
      const groupPick = typeof pick === 'object' ? idx.map((i) => pick[i]!) : pick;
      const out = await this.#surviving(group, lane, produced, () => this.#decodeBatch(group, idx.map((i) => tokens[i]!), lane, produced, groupPick));
      idx.forEach((i, j) => {
        result[i] = out[j]!;
      });
    }
    this.#keep(produced);
    this.#fitPrefix();
    return result as Float32Array[] | number[];
  }

  async #decodeBatch(seqs: readonly Sequence[], tokens: readonly number[], lane: Lane | undefined, produced: Outputs, pick: StepPick): Promise<(Float32Array | number)[]> {
    const rows = seqs.length;
    const slots = seqs.map((s) => {
      const slot = this.#check(s);
      if (!s.ready) throw new EngineError(EngineCode.BAD_SEQUENCE, 'a sequence in the decode batch is not prefilled yet');
      return slot;
    });
    tokens.forEach((t, i) => {
      if (!Number.isInteger(t) || t < 0 || t >= this.config.vocabSize) throw new ModelError(ModelCode.BAD_TOKEN, `token id ${String(t)} at row ${String(i)} is outside the vocabulary [0, ${String(this.config.vocabSize)})`);
    });
    const width = this.#kvShape[0] * this.#kvShape[1];
    const inputs: Record<string, HostTensor> = {
      input_ids: hostTensor('i64', [rows, 1], tokens),
      position_ids: hostTensor('i64', [rows, 1], seqs.map((s) => s.nextPosition)),
    };
    // One row: its buffers as zero-copy views. Several: the decode staging kept across steps (only
    // positions appended since the last step are copied), each row's positions beyond its own
    // length masked.
    let past: number;
    let caches: CacheRun | undefined;
    if (this.#caches !== undefined) {
      // Resident KV: the executor holds every row's keys, values and key mask; the new token is attended.
      inputs['attention_mask'] = { dtype: 'f32', shape: [rows, 1], data: new Float32Array(rows) };
      caches = this.#cacheRun(seqs, seqs.map(() => [0, 1] as const));
      past = 0;
    } else if (rows === 1) {
      past = seqs[0]!.kv.length;
      this.#stagePast(inputs, seqs, past);
    } else {
      const staged = this.#decodeStaging.stage(seqs.map((s) => s.kv));
      past = staged.cap;
      for (let l = 0; l < this.config.numLayers; l++) {
        inputs[`past_key.${String(l)}`] = { dtype: this.#dtype, shape: [rows, past, ...this.#kvShape], data: staged.k[l]! };
        inputs[`past_value.${String(l)}`] = { dtype: this.#dtype, shape: [rows, past, ...this.#kvShape], data: staged.v[l]! };
      }
    }
    if (caches === undefined) inputs['attention_mask'] = decodeAttention(seqs, past, this.config.slidingWindow, this.#staging);
    const out = await this.#run(inputs, slots, lane, caches, produced, pick);
    const { k, v } = this.#outputs(out);
    const picks = pick === 'greedy' ? argmaxRows(out['logits']!) : typeof pick === 'object' ? pickRows(out['logits']!, pick) : undefined;
    const logits = out['logits']!.data as Float32Array;
    const V = this.config.vocabSize;
    return seqs.map((s, r) => {
      if (!s.released) {
        s.kv.append(k, v, r * width, [0]);
        s.nextPosition++;
        if (!this.#hostKv) this.#historyOf(s).push(tokens[r]!);
        this.#prefix?.fed(s.kv, tokens[r]!);
        this.#prefix?.extend(s.kv, this.#prefixKey(s.adapter));
      }
      return picks !== undefined ? picks[r]! : logits.subarray(r * V, (r + 1) * V);
    });
  }
}

/**
 * An engine program (built in f32) at a bf16/f16 compute dtype: the slot tables are its factor
 * inputs, `attention_mask` its mask, and the KV cache (`past_*` in, `new_*` out) is of the
 * compute dtype (exact: every cached value was computed in it), so no executor widens it.
 */
function castProgram(g: Graph, dtype: 'bf16' | 'f16', adapterDtype: EngineAdapterDType): Graph {
  return castEngineGraph(g, dtype, { adapterDtype, isFactorInput: (n) => n.startsWith('slots.'), maskInputs: new Set(['attention_mask']), dtypeInputs: (n) => n.startsWith('past_'), dtypeOutputs: (n) => n.startsWith('new_') });
}

/** `t` rounded to `dtype` in place (`t` was just read and is not shared), relabelled. */
function roundInPlace(t: HostTensor, dtype: 'bf16' | 'f16'): HostTensor {
  const d = t.data;
  if (d instanceof Float32Array) roundFloat32InPlace(d, dtype);
  else {
    const round = rounderFor(dtype);
    for (let i = 0; i < d.length; i++) d[i] = round(d[i]!);
  }
  return { dtype, shape: t.shape, data: d };
}

const SAFETENSORS_FLOATS: Readonly<Record<string, EngineDType>> = { F32: 'f32', BF16: 'bf16', F16: 'f16' };

/** The float dtype a checkpoint stores (of most of its float elements); another one is `ENGINE_BAD_OPTIONS`. */
function storedDType(ckpt: Checkpoint, dir: string): EngineDType {
  const top = ckpt.storedFloatDType();
  const dt = top === undefined ? undefined : SAFETENSORS_FLOATS[top];
  if (dt === undefined) throw new EngineError(EngineCode.BAD_OPTIONS, `the checkpoint in '${dir}' stores ${top ?? 'no float tensors'}; dtype checkpoint needs F32, BF16 or F16`, { hint: 'give dtype f32, bf16 or f16' });
  return dt;
}

/** `a` followed by `b` (`b` alone when `a` is undefined). */
function concatF32(a: Float32Array | undefined, b: Float32Array): Float32Array {
  if (a === undefined) return b.slice();
  const out = new Float32Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

/** The executor's device tensors (the torch executor's `device`), or undefined when it has none. */
function deviceTensorsOf(executor: Executor): TorchDeviceTensors | undefined {
  const d = (executor as { readonly device?: Partial<TorchDeviceTensors> }).device;
  return typeof d === 'object' && typeof d.load === 'function' && typeof d.zeros === 'function' && typeof d.write === 'function' ? (d as TorchDeviceTensors) : undefined;
}

/** Per prepared program, one of its results. */
type Outputs = Map<PreparedGraph, Record<string, HostTensor>>;

/** `decodeSample`/`prefillSample`'s row specs: one per sequence and valid, else `ENGINE_BAD_OPTIONS`. */
function checkRows(seqs: readonly Sequence[], rows: readonly RowSample[], what: string): void {
  if (rows.length !== seqs.length) throw new EngineError(EngineCode.BAD_OPTIONS, `${what} needs one row spec per sequence (${String(seqs.length)} sequences, ${String(rows.length)} specs)`);
  try {
    if (rows.length > 0) checkRowSamples('logits', rows);
  } catch (e) {
    throw new EngineError(EngineCode.BAD_OPTIONS, errorMessage(e), { cause: e });
  }
}

/** What a decode step returns per row: its logits, its greedy token, or a token drawn as each row's spec says. */
type StepPick = 'logits' | 'greedy' | readonly RowSample[];

/**
 * Per row of a step run with `RunOptions.sample`, its token: the executor's own pick (an i64
 * tensor), or drawn here from the row's logits as the executor would (`samplePick`; greedy rows the
 * argmax rule).
 */
function pickRows(t: HostTensor, rows: readonly RowSample[]): number[] {
  if (t.dtype === 'i64') return Array.from(t.data);
  const n = t.shape[t.shape.length - 1]!;
  return rows.map((r, i) => {
    const raw = t.data.subarray(i * n, (i + 1) * n);
    const row = r.processing === undefined ? raw : processLogits(raw, r.processing);
    return r.temperature === 0 ? firstMaxIndex(row) : samplePick(row, r.temperature, r.topK, r.topP, r.u);
  });
}

/** The inputs of the engine's programs whose leading axis is the batch row (`CacheRun.rowInputs`). */
const ROW_INPUTS: readonly string[] = ['input_ids', 'position_ids', 'attention_mask', ROW_SLOT_INPUT, ROW_MASK_INPUT, ROW_GROUP_INPUT, TOKEN_SLOT_INPUT];

/** What a greedy decode step needs of its logits: each row's largest (`RunOptions.argmax`). */
const GREEDY_OUTPUTS: readonly string[] = ['logits'];

/** Runs a prepared program; a foreign failure becomes `ENGINE_RUN_FAILED` (coded errors pass through). */
async function runProgram(program: PreparedGraph, inputs: Readonly<Record<string, HostTensor>>, resident: ReadonlySet<string>, caches?: CacheRun, recycle?: Readonly<Record<string, HostTensor>>, argmax?: readonly string[], omit?: readonly string[], sample?: Readonly<Record<string, readonly RowSample[]>>): Promise<Record<string, HostTensor>> {
  try {
    return await program.run(inputs, { resident, ...(caches === undefined ? {} : { caches }), ...(recycle === undefined ? {} : { recycle }), ...(argmax === undefined ? {} : { argmax }), ...(omit === undefined ? {} : { omit }), ...(sample === undefined ? {} : { sample }) });
  } catch (e) {
    if (e instanceof StageError) throw e;
    throw new EngineError(EngineCode.RUN_FAILED, `running the model failed: ${errorMessage(e)}`, { cause: e });
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
